package main

import (
	"context"
	"fmt"
	"math"
	"strings"
)

// costPoint is one drain of the cost fit.
type costPoint struct {
	Batch   int     `json:"batch"`
	N       int     `json:"n"`
	Batches int     `json:"batches"`
	Seconds float64 `json:"seconds"`
}

// costFit is time = Fixed + PerBatch × batches + PerRow × rows, fitted to one loop's drains.
type costFit struct {
	FixedMs    float64 `json:"fixed_ms"`
	PerBatchUs float64 `json:"per_batch_us"`
	PerRowUs   float64 `json:"per_row_us"`
	// MaxResidual is the largest |measured − fitted| ÷ measured over the points (medians
	// of each batch size and row count): how well a line in batches and rows describes the
	// drains.
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
}

// runCosts drains every combination of CostBatches and CostNs with one claim loop, library
// and raw in alternation, and fits each loop's times to fixed + per-batch + per-row costs.
func runCosts(ctx context.Context, cfg config, b backend, res *backendResult) error {
	const workers = 1
	var vs []variant
	points := map[string][]costPoint{}
	for _, n := range cfg.CostNs {
		for _, batch := range cfg.CostBatches {
			for _, kind := range []string{kindRaw, "library"} {
				vs = append(vs, variant{name: fmt.Sprintf("%s b=%d n=%d", kind, batch, n), run: func(ctx context.Context) (float64, error) {
					r, err := drain(ctx, b, drainSpec{kind: kind, table: mainTable, n: n, batch: batch, workers: workers, payloads: payloads200})
					points[kind] = append(points[kind], costPoint{Batch: batch, N: n, Batches: (n + batch - 1) / batch, Seconds: r.Seconds})
					return r.Rate, err
				}})
			}
		}
	}
	if _, err := alternate(ctx, cfg.CostRounds, vs); err != nil {
		return err
	}
	c := &costResult{Workers: workers}
	var err error
	if c.Library, err = fitCosts(points["library"]); err != nil {
		return err
	}
	if c.Raw, err = fitCosts(points[kindRaw]); err != nil {
		return err
	}
	for _, k := range []struct {
		name string
		f    costFit
	}{{"library", c.Library}, {"raw", c.Raw}} {
		logf("%s: drain costs, %s, 1 loop: %.1f ms fixed + %.0f µs per batch + %.2f µs per row (worst point off by %.0f%%)",
			b.name(), k.name, k.f.FixedMs, k.f.PerBatchUs, k.f.PerRowUs, 100*k.f.MaxResidual)
	}
	res.Costs = c
	return nil
}

// fitCosts fits seconds = c + a·batches + b·rows by least squares on relative errors (each
// point weighted by 1/seconds), so that short drains count as much as long ones. Repeated
// drains of one batch size and row count enter as their median, so that one drain slowed
// by the machine's other work does not bend the line.
func fitCosts(ps []costPoint) (costFit, error) {
	type key struct{ batch, n int }
	times := map[key][]float64{}
	var keys []key
	for _, p := range ps {
		k := key{p.Batch, p.N}
		if _, ok := times[k]; !ok {
			keys = append(keys, k)
		}
		times[k] = append(times[k], p.Seconds)
	}
	var med []costPoint
	for _, k := range keys {
		med = append(med, costPoint{Batch: k.batch, N: k.n, Batches: (k.n + k.batch - 1) / k.batch, Seconds: median(times[k])})
	}
	var m [3][4]float64 // normal equations, augmented
	for _, p := range med {
		if p.Seconds <= 0 {
			continue
		}
		w := 1 / p.Seconds
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
		f.MaxResidual = max(f.MaxResidual, math.Abs(p.Seconds-f.predict(p.N, p.Batch))/p.Seconds)
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
	k := float64((n + batch - 1) / batch)
	return (c.Library.FixedMs - c.Raw.FixedMs) / 1e3, (c.Library.PerBatchUs - c.Raw.PerBatchUs) * k / 1e6,
		(c.Library.PerRowUs - c.Raw.PerRowUs) * float64(n) / 1e6
}

// describe renders the fit for the logs and the table.
func (f costFit) describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%.1f ms + %.0f µs/batch + %.2f µs/row (worst point %.0f%% off)", f.FixedMs, f.PerBatchUs, f.PerRowUs, 100*f.MaxResidual)
	return b.String()
}
