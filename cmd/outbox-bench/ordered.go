package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/outboxgo/outbox"
)

// orderedKeys is how many partition keys the ordered burn-down spreads its rows over.
const orderedKeys = 1000

// orderedResult is scenario 8: a Publisher with PublisherOptions.Ordered draining rows of
// orderedKeys partition keys (row i has key i mod orderedKeys), against the same Publisher
// unordered on the same rows, in alternation, both on a table with the ordered migration
// set (orderedTable): the ratio is what ordering costs where the order index exists. What
// the index itself costs every publisher is the table-cost scenario's "ordered" variant.
type orderedResult struct {
	Keys      int     `json:"keys"`
	N         int     `json:"n"`
	Batch     int     `json:"batch"`
	Workers   int     `json:"workers"`
	Ordered   sample  `json:"ordered"`
	Unordered sample  `json:"unordered"`
	Ratio     float64 `json:"ordered_vs_unordered"`
}

func runOrdered(ctx context.Context, cfg config, b backend, res *backendResult) error {
	o := &orderedResult{Keys: orderedKeys, N: cfg.BurnN, Batch: cfg.Batch, Workers: cfg.Workers}
	if err := migrateOrdered(ctx, b.admin(), b.name(), orderedTable); err != nil {
		return err
	}
	drain := func(ordered bool) func(ctx context.Context) (float64, error) {
		return func(ctx context.Context) (float64, error) { return burnKeyed(ctx, b, o, ordered) }
	}
	got, err := alternate(ctx, cfg.BurnRounds, []variant{
		{name: "unordered", run: drain(false)},
		{name: "ordered", run: drain(true)},
	})
	if err != nil {
		return err
	}
	o.Ordered, o.Unordered = summarize(got["ordered"]), summarize(got["unordered"])
	o.Ratio = pairedRatio(got["ordered"], got["unordered"])
	logf("%s: ordered burn-down over %d keys: %.0f rows/s against %.0f unordered (%.3f)",
		b.name(), orderedKeys, o.Ordered.Median, o.Unordered.Median, o.Ratio)
	res.Ordered = o
	return nil
}

// burnKeyed loads o.N rows of orderedKeys keys into orderedTable through the library and
// drains them with a Publisher, and returns rows per second.
func burnKeyed(ctx context.Context, b backend, o *orderedResult, ordered bool) (float64, error) {
	if err := b.reset(ctx, orderedTable); err != nil {
		return 0, err
	}
	store, err := outbox.New(b.admin(), b.dialect(), outbox.Options{Table: orderedTable})
	if err != nil {
		return 0, err
	}
	for lo := 0; lo < o.N; lo += 1000 {
		msgs := make([]outbox.Message, min(1000, o.N-lo))
		for i := range msgs {
			msgs[i] = message(lo + i)
			msgs[i].PartitionKey = "order-" + strconv.Itoa((lo+i)%orderedKeys)
		}
		if _, err := store.EnqueueStandalone(ctx, msgs...); err != nil {
			return 0, fmt.Errorf("preload: %w", err)
		}
	}
	if err := b.maintain(ctx, orderedTable); err != nil {
		return 0, err
	}
	db, _, err := b.pool(o.Workers + 2)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	timeout := time.Duration(max(120, o.N/200)) * time.Second
	elapsed, _, err := burnLibrary(ctx, b, db, orderedTable, o.N, o.Batch, o.Workers, timeout, ordered)
	if err != nil {
		return 0, err
	}
	return float64(o.N) / elapsed.Seconds(), nil
}
