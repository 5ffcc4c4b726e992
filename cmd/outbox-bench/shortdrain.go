package main

import (
	"context"
	"fmt"
)

// shortDrainResult is one configuration of the short-drain scenario: ShortN freshly loaded
// rows of 200-byte payloads drained by a Publisher with default options (but the batch
// size and claim loops) and by the raw claim + ack loop on the same table, in alternation.
type shortDrainResult struct {
	Batch   int `json:"batch"`
	Workers int `json:"workers"`
	N       int `json:"n"`
	drainPair
}

// drainPair is what alternating library and raw drains of one configuration measured.
type drainPair struct {
	Library sample  `json:"library"`
	Raw     sample  `json:"raw"`
	Ratio   float64 `json:"library_vs_raw"`
	// Commits per batch (median over runs) of each loop.
	LibraryCommitsPerBatch float64 `json:"library_commits_per_batch"`
	RawCommitsPerBatch     float64 `json:"raw_commits_per_batch"`
}

// drainPairs drains s (its kind set in turn to raw and library) rounds times in alternation
// and sums the runs up.
func drainPairs(ctx context.Context, b backend, s drainSpec, rounds int) (drainPair, error) {
	var lib, raw []burnRun
	run := func(kind string, into *[]burnRun) variant {
		return variant{name: kind, run: func(ctx context.Context) (float64, error) {
			s := s
			s.kind = kind
			r, err := drain(ctx, b, s)
			*into = append(*into, r)
			return r.Rate, err
		}}
	}
	if _, err := alternate(ctx, rounds, []variant{run(kindRaw, &raw), run("library", &lib)}); err != nil {
		return drainPair{}, err
	}
	return drainPair{Library: summarize(rates(lib)), Raw: summarize(rates(raw)), Ratio: pairedRatio(rates(lib), rates(raw)),
		LibraryCommitsPerBatch: commitsPerBatch(lib), RawCommitsPerBatch: commitsPerBatch(raw)}, nil
}

// metricName is the result's JSON metric: short_drain_b<batch>_w<workers>_vs_raw.
func (s *shortDrainResult) metricName() string {
	return fmt.Sprintf("short_drain_b%d_w%d_vs_raw", s.Batch, s.Workers)
}

// runShortDrain measures every batch size and worker count of the short drains, each
// configuration as alternating library/raw pairs after one warm-up pair.
func runShortDrain(ctx context.Context, cfg config, b backend, res *backendResult) error {
	spec := func(n, batch, workers int) drainSpec {
		return drainSpec{table: mainTable, n: n, batch: batch, workers: workers, payloads: payloads200}
	}
	if _, err := drainPairs(ctx, b, spec(min(cfg.ShortN, 2000), cfg.ShortBatches[0], cfg.ShortWorkers[0]), 1); err != nil {
		return err
	}
	for _, batch := range cfg.ShortBatches {
		for _, workers := range cfg.ShortWorkers {
			pair, err := drainPairs(ctx, b, spec(cfg.ShortN, batch, workers), cfg.ShortRounds)
			if err != nil {
				return err
			}
			s := shortDrainResult{Batch: batch, Workers: workers, N: cfg.ShortN, drainPair: pair}
			logf("%s: short drain b=%d w=%d n=%d: library %.0f rows/s, raw %.0f rows/s: %.3f (pairs %s); commits/batch library %.2f raw %.2f",
				b.name(), batch, workers, cfg.ShortN, s.Library.Median, s.Raw.Median, s.Ratio, pairRatios(s.Library.All, s.Raw.All),
				s.LibraryCommitsPerBatch, s.RawCommitsPerBatch)
			res.ShortDrain = append(res.ShortDrain, s)
		}
	}
	return nil
}

// commitsPerBatch is the median over runs of counted commits per claimed batch.
func commitsPerBatch(runs []burnRun) float64 {
	var xs []float64
	for _, r := range runs {
		xs = append(xs, float64(r.Commits.Server)/float64((r.N+r.Batch-1)/r.Batch))
	}
	return median(xs)
}
