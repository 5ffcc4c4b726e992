package main

import (
	"context"
	"fmt"
)

// storeLoopResult is one configuration of the store-loop scenario: StoreN freshly loaded rows
// of 200-byte payloads drained by a Publisher (default options but the batch size and claim
// loops) and by a plain loop of Store.Claim and Store.Ack on a Store of the same pool, in
// alternation: the pipeline against the loop it is built on.
type storeLoopResult struct {
	Batch     int     `json:"batch"`
	Workers   int     `json:"workers"`
	N         int     `json:"n"`
	Publisher sample  `json:"publisher"`
	StoreLoop sample  `json:"store_loop"`
	Ratio     float64 `json:"publisher_vs_store_loop"`
	// Startup is the Publisher's time from Run to its first claim, in milliseconds, and
	// SteadyRatio the Publisher's rate counted from its first claim against the store loop:
	// the drain without the one-time start-up (Store.Check, the listener) that Ratio counts.
	Startup     sample  `json:"publisher_startup_ms"`
	SteadyRatio float64 `json:"publisher_from_first_claim_vs_store_loop"`
}

// metricName is the result's JSON metric: publisher_vs_store_loop_b<batch>_w<workers>.
func (s *storeLoopResult) metricName() string {
	return fmt.Sprintf("publisher_vs_store_loop_b%d_w%d", s.Batch, s.Workers)
}

// drainKinds drains s with each of kinds in turn, rounds times in alternation, and returns
// each kind's runs.
func drainKinds(ctx context.Context, b backend, s drainSpec, rounds int, kinds ...string) (map[string][]burnRun, error) {
	runs := map[string][]burnRun{}
	var vs []variant
	for _, kind := range kinds {
		vs = append(vs, variant{name: kind, run: func(ctx context.Context) (float64, error) {
			s := s
			s.kind = kind
			r, err := drain(ctx, b, s)
			runs[kind] = append(runs[kind], r)
			return r.Rate, err
		}})
	}
	_, err := alternate(ctx, rounds, vs)
	return runs, err
}

// runStoreLoop measures the Publisher against the store loop at every batch size and loop
// count of the scenario, after one warm-up pair.
func runStoreLoop(ctx context.Context, cfg config, b backend, res *backendResult) error {
	spec := func(n, batch, workers int) drainSpec {
		return drainSpec{table: mainTable, n: n, batch: batch, workers: workers, payloads: payloads200, startup: true}
	}
	if _, err := drainKinds(ctx, b, spec(min(cfg.StoreN, 2000), cfg.StoreBatches[0], 1), 1, kindStore, "library"); err != nil {
		return err
	}
	for _, batch := range cfg.StoreBatches {
		for _, workers := range cfg.StoreWorkers {
			runs, err := drainKinds(ctx, b, spec(cfg.StoreN, batch, workers), cfg.StoreRounds, kindStore, "library")
			if err != nil {
				return err
			}
			lib, loop := rates(runs["library"]), rates(runs[kindStore])
			var steady, startup []float64
			for _, r := range runs["library"] {
				steady, startup = append(steady, r.SteadyRate), append(startup, r.StartupSeconds*1000)
			}
			s := storeLoopResult{Batch: batch, Workers: workers, N: cfg.StoreN,
				Publisher: summarize(lib), StoreLoop: summarize(loop), Ratio: pairedRatio(lib, loop),
				Startup: summarize(startup), SteadyRatio: pairedRatio(steady, loop)}
			logf("%s: store loop b=%d w=%d n=%d: publisher %.0f rows/s, store loop %.0f rows/s: %.3f (pairs %s); "+
				"publisher start-up %.1f ms, from its first claim %.3f (pairs %s)",
				b.name(), batch, workers, cfg.StoreN, s.Publisher.Median, s.StoreLoop.Median, s.Ratio, pairRatios(lib, loop),
				s.Startup.Median, s.SteadyRatio, pairRatios(steady, loop))
			res.StoreLoop = append(res.StoreLoop, s)
		}
	}
	return nil
}
