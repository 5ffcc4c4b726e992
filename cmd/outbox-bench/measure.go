package main

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// sample summarises repeated measurements of one figure.
type sample struct {
	Median float64   `json:"median"`
	Min    float64   `json:"min"`
	Max    float64   `json:"max"`
	All    []float64 `json:"all"`
}

func summarize(xs []float64) sample {
	if len(xs) == 0 {
		return sample{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return sample{Median: median(s), Min: s[0], Max: s[len(s)-1], All: xs}
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// pairedRatio is the median of a[i]/b[i]: each pair was measured back to back, so slow
// drift of the machine cancels within a pair.
func pairedRatio(a, b []float64) float64 {
	n := min(len(a), len(b))
	r := make([]float64, 0, n)
	for i := range n {
		if b[i] > 0 {
			r = append(r, a[i]/b[i])
		}
	}
	return median(r)
}

// txLoop runs body in a transaction, again and again, on conc goroutines for d, and returns
// committed transactions per second. Each goroutine begins, runs body and commits; seq
// numbers the transactions across goroutines.
func txLoop(ctx context.Context, db *sql.DB, conc int, d time.Duration, seq *atomic.Int64, body func(ctx context.Context, tx *sql.Tx, i int) error) (float64, error) {
	return loop(ctx, conc, d, seq, func(ctx context.Context, i int) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := body(ctx, tx, i); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	})
}

// loop runs one, again and again, on conc goroutines for d, and returns its calls per
// second; seq numbers the calls across goroutines. The first error stops every goroutine
// and is returned.
func loop(ctx context.Context, conc int, d time.Duration, seq *atomic.Int64, one func(ctx context.Context, i int) error) (float64, error) {
	var (
		done     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	deadline := start.Add(d)
	for range conc {
		wg.Go(func() {
			for time.Now().Before(deadline) && ctx.Err() == nil {
				if err := one(ctx, int(seq.Add(1))); err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(done.Load()) / elapsed.Seconds(), nil
}

type variant struct {
	name string
	run  func(ctx context.Context) (float64, error)
}

// alternate runs every variant once per round, rotating the order each round so that no
// variant always runs first (warm caches) or last (a fuller table, a pending checkpoint),
// and returns each variant's results in round order.
func alternate(ctx context.Context, rounds int, vs []variant) (map[string][]float64, error) {
	out := make(map[string][]float64, len(vs))
	for r := range rounds {
		for k := range vs {
			v := vs[(k+r)%len(vs)]
			x, err := v.run(ctx)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", v.name, err)
			}
			out[v.name] = append(out[v.name], x)
		}
	}
	return out, nil
}
