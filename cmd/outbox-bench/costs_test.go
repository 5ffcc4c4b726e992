package main

import (
	"math"
	"testing"
)

// The fit recovers the fixed, per-batch and per-row costs of drains that follow them
// exactly, and of pairs' differences weighted by the raw drain's time.
func TestFitCostsRecoversCosts(t *testing.T) {
	const fixed, perBatch, perRow = 0.040, 0.0025, 0.00006 // seconds
	var drains, diffs []costPoint
	for _, n := range []int{1000, 5000, 20000} {
		for _, batch := range []int{20, 100, 500} {
			k := (n + batch - 1) / batch
			s := fixed + perBatch*float64(k) + perRow*float64(n)
			for range 3 {
				drains = append(drains, costPoint{Batch: batch, N: n, Batches: k, Seconds: s})
			}
			// One outlier per size: the median ignores it.
			drains = append(drains, costPoint{Batch: batch, N: n, Batches: k, Seconds: 5 * s})
			diffs = append(diffs, costPoint{Batch: batch, N: n, Batches: k, Seconds: s / 10, RawSeconds: s})
		}
	}
	for name, c := range map[string]struct {
		ps    []costPoint
		scale float64
	}{"drains": {drains, 1}, "differences": {diffs, 0.1}} {
		f, err := fitCosts(c.ps)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, x := range []struct {
			what      string
			got, want float64
		}{
			{"fixed ms", f.FixedMs, fixed * 1e3 * c.scale},
			{"µs per batch", f.PerBatchUs, perBatch * 1e6 * c.scale},
			{"µs per row", f.PerRowUs, perRow * 1e6 * c.scale},
		} {
			if math.Abs(x.got-x.want) > 1e-6*math.Max(1, x.want) {
				t.Errorf("%s: %s = %g, want %g", name, x.what, x.got, x.want)
			}
		}
		if f.MaxResidual > 1e-9 {
			t.Errorf("%s: worst residual %g on exact points", name, f.MaxResidual)
		}
	}
}

// One batch size cannot tell a per-batch cost from a per-row one.
func TestFitCostsUnderdetermined(t *testing.T) {
	ps := []costPoint{{Batch: 100, N: 1000, Batches: 10, Seconds: 1}, {Batch: 100, N: 2000, Batches: 20, Seconds: 2}}
	if _, err := fitCosts(ps); err == nil {
		t.Fatal("fit of one batch size succeeded")
	}
}
