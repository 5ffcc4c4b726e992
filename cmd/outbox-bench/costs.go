package main

import (
	"context"
	"fmt"
	"math"
	"strings"
)

// costPoint is one drain of the cost fit, or for the library's extra cost the difference
// of one library/raw pair (Seconds) and the raw drain's time (RawSeconds).
type costPoint struct {
	Batch      int     `json:"batch"`
	N          int     `json:"n"`
	Batches    int     `json:"batches"`
	Seconds    float64 `json:"seconds"`
	RawSeconds float64 `json:"raw_seconds,omitempty"`
}

// costFit is time = Fixed + PerBatch × batches + PerRow × rows, fitted to drains.
type costFit struct {
	FixedMs    float64 `json:"fixed_ms"`
	PerBatchUs float64 `json:"per_batch_us"`
	PerRowUs   float64 `json:"per_row_us"`
	// MaxResidual is the largest |measured − fitted| over the points (medians of each batch
	// size and row count), as a share of the drain's time (the raw drain's for the extra
	// cost): how well a line in batches and rows describes the drains.
	MaxResidual float64     `json:"max_relative_residual"`
	Points      []costPoint `json:"points"`
}

// predict is the fitted time of a drain of n rows in batches of batch, in seconds.
func (f costFit) predict(n, batch int) float64 {
	return f.FixedMs/1e3 + f.PerBatchUs/1e6*float64((n+batch-1)/batch) + f.PerRowUs/1e6*float64(n)
}

// costResult is the cost fit of the library and the raw loop on one backend.
type costResult struct {
	Workers int     `json:"workers"`
	Library costFit `json:"library"`
	Raw     costFit `json:"raw"`
	// Extra is the library's time over the raw loop's, fitted to the differences of the
	// pairs, in which the machine's drift cancels: the library's own fixed, per-batch and
	// per-row costs.
	Extra costFit `json:"library_extra"`
}

// runCosts drains every combination of CostNs and CostBatches with one claim loop, as
// library/raw pairs back to back (which runs first alternates), CostRounds rounds, and fits
// each loop's times, and the pairs' differences, to fixed + per-batch + per-row costs.
func runCosts(ctx context.Context, cfg config, b backend, res *backendResult) error {
	const workers = 1
	var lib, raw, extra []costPoint
	one := func(ctx context.Context, kind string, n, batch int) (float64, error) {
		r, err := drain(ctx, b, drainSpec{kind: kind, table: mainTable, n: n, batch: batch, workers: workers, payloads: payloads200})
		return r.Seconds, err
	}
	i := 0
	for r := range cfg.CostRounds {
		for _, n := range cfg.CostNs {
			for _, batch := range cfg.CostBatches {
				kinds := []string{kindRaw, "library"}
				if (r+i)%2 == 1 {
					kinds[0], kinds[1] = kinds[1], kinds[0]
				}
				i++
				t := map[string]float64{}
				for _, kind := range kinds {
					s, err := one(ctx, kind, n, batch)
					if err != nil {
						return fmt.Errorf("%s b=%d n=%d: %w", kind, batch, n, err)
					}
					t[kind] = s
				}
				p := costPoint{Batch: batch, N: n, Batches: (n + batch - 1) / batch}
				p.Seconds = t["library"]
				lib = append(lib, p)
				p.Seconds = t[kindRaw]
				raw = append(raw, p)
				p.Seconds, p.RawSeconds = t["library"]-t[kindRaw], t[kindRaw]
				extra = append(extra, p)
			}
		}
	}
	c := &costResult{Workers: workers}
	var err error
	if c.Library, err = fitCosts(lib); err != nil {
		return err
	}
	if c.Raw, err = fitCosts(raw); err != nil {
		return err
	}
	if c.Extra, err = fitCosts(extra); err != nil {
		return err
	}
	for _, k := range []struct {
		name string
		f    costFit
	}{{"library", c.Library}, {"raw", c.Raw}, {"library − raw (pairs)", c.Extra}} {
		logf("%s: drain costs, %s, 1 loop: %s", b.name(), k.name, k.f.describe())
	}
	res.Costs = c
	return nil
}

// fitCosts fits seconds = c + a·batches + b·rows by least squares on relative errors (each
// point weighted by 1/seconds, or 1/raw seconds for differences), so that short drains
// count as much as long ones. Repeated drains of one batch size and row count enter as
// their median, so that one drain slowed by the machine's other work does not bend the
// line.
func fitCosts(ps []costPoint) (costFit, error) {
	type key struct{ batch, n int }
	times, scales := map[key][]float64{}, map[key][]float64{}
	var keys []key
	for _, p := range ps {
		k := key{p.Batch, p.N}
		if _, ok := times[k]; !ok {
			keys = append(keys, k)
		}
		scale := p.RawSeconds
		if scale == 0 {
			scale = p.Seconds
		}
		times[k], scales[k] = append(times[k], p.Seconds), append(scales[k], scale)
	}
	type point struct {
		costPoint
		scale float64
	}
	var med []point
	for _, k := range keys {
		if sc := median(scales[k]); sc > 0 {
			med = append(med, point{costPoint{Batch: k.batch, N: k.n, Batches: (k.n + k.batch - 1) / k.batch, Seconds: median(times[k])}, sc})
		}
	}
	var m [3][4]float64 // normal equations, augmented
	for _, p := range med {
		w := 1 / p.scale
		x := [3]float64{w, w * float64(p.Batches), w * float64(p.N)}
		y := w * p.Seconds
		for i := range 3 {
			for j := range 3 {
				m[i][j] += x[i] * x[j]
			}
			m[i][3] += x[i] * y
		}
	}
	sol, ok := solve3(m)
	if !ok {
		return costFit{}, fmt.Errorf("cost fit: %d points do not determine fixed, per-batch and per-row costs", len(ps))
	}
	f := costFit{FixedMs: sol[0] * 1e3, PerBatchUs: sol[1] * 1e6, PerRowUs: sol[2] * 1e6, Points: ps}
	for _, p := range med {
		f.MaxResidual = max(f.MaxResidual, math.Abs(p.Seconds-f.predict(p.N, p.Batch))/p.scale)
	}
	return f, nil
}

// solve3 solves a 3×3 linear system given as an augmented matrix, by Gaussian elimination
// with partial pivoting.
func solve3(m [3][4]float64) ([3]float64, bool) {
	for col := range 3 {
		p := col
		for r := col + 1; r < 3; r++ {
			if math.Abs(m[r][col]) > math.Abs(m[p][col]) {
				p = r
			}
		}
		if math.Abs(m[p][col]) < 1e-12*math.Max(1, math.Abs(m[0][0])) {
			return [3]float64{}, false
		}
		m[col], m[p] = m[p], m[col]
		for r := range 3 {
			if r == col {
				continue
			}
			k := m[r][col] / m[col][col]
			for c := col; c < 4; c++ {
				m[r][c] -= k * m[col][c]
			}
		}
	}
	return [3]float64{m[0][3] / m[0][0], m[1][3] / m[1][1], m[2][3] / m[2][2]}, true
}

// costShares splits the library's fitted extra time over the raw loop, for a drain of n
// rows in batches of batch, into its fixed, per-batch and per-row parts (seconds).
func (c *costResult) costShares(n, batch int) (fixed, perBatch, perRow float64) {
	e := c.Extra
	return e.FixedMs / 1e3, e.PerBatchUs * float64((n+batch-1)/batch) / 1e6, e.PerRowUs * float64(n) / 1e6
}

// describe renders the fit for the logs and the table.
func (f costFit) describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%.1f ms + %.0f µs/batch + %.2f µs/row (worst point %.0f%% off)", f.FixedMs, f.PerBatchUs, f.PerRowUs, 100*f.MaxResidual)
	return b.String()
}
