package main

import (
	"context"
	"fmt"
	"time"
)

// brokerResult is the broker-latency burn-down: the headline burn-down (same rows, batch
// size and loops) with a publish that takes Publish per batch, a broker's round trip, on
// both sides. The raw loop waits for it between its claim and its ack; the Publisher claims
// the next batch and records the last one while it waits.
type brokerResult struct {
	Publish string `json:"publish"`
	Batch   int    `json:"batch"`
	Workers int    `json:"workers"`
	N       int    `json:"n"`
	drainPair
}

// brokerPublish is the broker scenario's publish time: about a round trip to a broker in
// the same data centre that confirms what it stores.
const brokerPublish = time.Millisecond

// brokerMetric is the broker scenario's JSON metric.
const brokerMetric = "burndown_vs_raw_publish_1ms"

// runBroker measures the broker scenario as alternating library/raw pairs after one
// warm-up pair.
func runBroker(ctx context.Context, cfg config, b backend, res *backendResult) error {
	spec := func(n int) drainSpec {
		return drainSpec{table: mainTable, n: n, batch: cfg.Batch, workers: cfg.Workers, publish: brokerPublish}
	}
	if _, err := drainPairs(ctx, b, spec(min(cfg.BrokerN, 2000)), 1); err != nil {
		return err
	}
	pair, err := drainPairs(ctx, b, spec(cfg.BrokerN), cfg.BrokerRounds)
	if err != nil {
		return err
	}
	r := &brokerResult{Publish: brokerPublish.String(), Batch: cfg.Batch, Workers: cfg.Workers, N: cfg.BrokerN, drainPair: pair}
	logf("%s: broker burn-down (publish %s) b=%d w=%d n=%d: library %.0f rows/s, raw %.0f rows/s: %.3f (pairs %s); commits/batch library %.2f raw %.2f",
		b.name(), brokerPublish, cfg.Batch, cfg.Workers, cfg.BrokerN, r.Library.Median, r.Raw.Median, r.Ratio,
		pairRatios(r.Library.All, r.Raw.All), r.LibraryCommitsPerBatch, r.RawCommitsPerBatch)
	res.Broker = r
	return nil
}

// describe is the scenario's line in the table.
func (r *brokerResult) describe() string {
	return fmt.Sprintf("publish %s per batch, batch %d, %d loops, %d rows: library %.0f rows/s, raw %.0f rows/s, library/raw %.3f; commits/batch library %.2f raw %.2f",
		r.Publish, r.Batch, r.Workers, r.N, r.Library.Median, r.Raw.Median, r.Ratio, r.LibraryCommitsPerBatch, r.RawCommitsPerBatch)
}
