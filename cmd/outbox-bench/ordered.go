package main

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
)

// orderedKeyCounts are the numbers of partition keys the ordered burn-down spreads its rows
// over: one hot key, a few, many, and more keys than a batch holds.
var orderedKeyCounts = []int{1, 5, 50, 1000}

// orderedLatencyRate is the offered rate of the one-key latency run, events per second.
const orderedLatencyRate = 200

// orderedResult is scenario 8: for each of orderedKeyCounts, a Publisher with
// PublisherOptions.Ordered draining rows of that many partition keys (row i has key i mod
// keys) through a transport that answers at once and keeps key order (so a key's waiting
// rows go in one batch, ClaimOptions.Runs), against the same Publisher unordered on the
// same rows, in alternation, both on a table with the ordered migration set
// (orderedTable); the transport counts deliveries of a key that come before one delivered
// earlier. Then one key at orderedLatencyRate, enqueue to publish. What the order index
// costs every publisher is the table-cost scenario's "ordered" variant.
type orderedResult struct {
	N       int             `json:"n"`
	Batch   int             `json:"batch"`
	Workers int             `json:"workers"`
	Keys    []orderedByKeys `json:"keys"`
	// OutOfOrder counts the ordered publishers' deliveries, over every key count, of a
	// key's row before one delivered earlier: 0 when the order holds.
	OutOfOrder int64 `json:"out_of_order"`
	// Latency is enqueue to publish of one key at orderedLatencyRate, ordered.
	Latency orderedLatency `json:"latency_one_key"`
}

type orderedByKeys struct {
	Keys      int     `json:"keys"`
	Ordered   sample  `json:"ordered"`
	Unordered sample  `json:"unordered"`
	Ratio     float64 `json:"ordered_vs_unordered"`
}

type orderedLatency struct {
	Rate     float64 `json:"rate"`
	Messages int     `json:"messages"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
}

// ratio returns the burn-down ratio with keys keys, 0 when it was not measured.
func (o *orderedResult) ratio(keys int) float64 {
	for _, k := range o.Keys {
		if k.Keys == keys {
			return k.Ratio
		}
	}
	return 0
}

func (o *orderedResult) metrics(add func(string, float64)) {
	for _, k := range o.Keys {
		add("ordered_vs_unordered_k"+strconv.Itoa(k.Keys), k.Ratio)
	}
	if r := o.ratio(1000); r > 0 {
		add("burndown_ordered_vs_unordered", r)
	}
	add("ordered_out_of_order", float64(o.OutOfOrder))
	if o.Latency.Messages > 0 {
		add("ordered_latency_p50_ms_k1_at_200", o.Latency.P50)
		add("ordered_latency_p99_ms_k1_at_200", o.Latency.P99)
	}
}

func runOrdered(ctx context.Context, cfg config, b backend, res *backendResult) error {
	o := &orderedResult{N: cfg.BurnN, Batch: cfg.Batch, Workers: cfg.Workers}
	if err := migrateOrdered(ctx, b.admin(), b.name(), orderedTable); err != nil {
		return err
	}
	order := &keyOrder{}
	rounds := max(3, cfg.BurnRounds/2)
	for _, keys := range orderedKeyCounts {
		drain := func(ordered bool) func(ctx context.Context) (float64, error) {
			return func(ctx context.Context) (float64, error) {
				var ko *keyOrder
				if ordered {
					ko = order
				}
				return burnKeyed(ctx, b, o, keys, ordered, ko)
			}
		}
		got, err := alternate(ctx, rounds, []variant{
			{name: "unordered", run: drain(false)},
			{name: "ordered", run: drain(true)},
		})
		if err != nil {
			return err
		}
		k := orderedByKeys{Keys: keys, Ordered: summarize(got["ordered"]), Unordered: summarize(got["unordered"]),
			Ratio: pairedRatio(got["ordered"], got["unordered"])}
		o.Keys = append(o.Keys, k)
		logf("%s: ordered burn-down over %d keys: %.0f rows/s against %.0f unordered (%.3f)",
			b.name(), keys, k.Ordered.Median, k.Unordered.Median, k.Ratio)
	}
	o.OutOfOrder = order.outOfOrder
	lat, err := orderedOneKeyLatency(ctx, cfg, b)
	if err != nil {
		return err
	}
	o.Latency = lat
	logf("%s: one key at %d events/s, ordered: p50 %.2f ms, p99 %.2f ms; out of order: %d",
		b.name(), orderedLatencyRate, lat.P50, lat.P99, o.OutOfOrder)
	res.Ordered = o
	return nil
}

// burnKeyed loads o.N rows of keys keys into orderedTable through the library and drains
// them with a Publisher, and returns rows per second. With order, the transport keeps key
// order (so an ordered Publisher claims runs) and order counts what it delivers.
func burnKeyed(ctx context.Context, b backend, o *orderedResult, keys int, ordered bool, order *keyOrder) (float64, error) {
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
			msgs[i].PartitionKey = "order-" + strconv.Itoa((lo+i)%keys)
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
	order.reset()
	timeout := time.Duration(max(120, o.N/200)) * time.Second
	elapsed, _, err := burnPublisher(ctx, b, db, orderedTable, o.N, o.Batch, o.Workers, timeout, ordered, 0, nil, order)
	if err != nil {
		return 0, err
	}
	return float64(o.N) / elapsed.Seconds(), nil
}

// keyOrder counts deliveries of a partition key's row before one of the key delivered
// earlier. The preload enqueues from one goroutine, so ids (time-ordered) follow enqueue
// order within a key.
type keyOrder struct {
	mu         sync.Mutex
	last       map[string]uuid.UUID
	outOfOrder int64
}

func (k *keyOrder) reset() {
	if k == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.last = map[string]uuid.UUID{}
}

func (k *keyOrder) see(ds []outbox.Delivery) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, d := range ds {
		if last, ok := k.last[d.PartitionKey]; ok && bytes.Compare(d.ID[:], last[:]) <= 0 {
			k.outOfOrder++
			continue
		}
		k.last[d.PartitionKey] = d.ID
	}
}

// keyOrderTransport is a transport that answers at once, in batch order: it keeps key
// order ([outbox.TransportKeyOrder]).
type keyOrderTransport struct{ outbox.TransportFunc }

func (keyOrderTransport) KeepsKeyOrder() bool { return true }

// orderedOneKeyLatency measures enqueue (commit) to publish of one partition key at
// orderedLatencyRate for cfg.LatencyDur: one producer on the publisher's Store (its
// enqueues wake the publisher), an ordered Publisher with default options and a transport
// that keeps key order.
func orderedOneKeyLatency(ctx context.Context, cfg config, b backend) (orderedLatency, error) {
	r := orderedLatency{Rate: orderedLatencyRate}
	if err := b.reset(ctx, orderedTable); err != nil {
		return r, err
	}
	db, _, err := b.pool(cfg.Workers + 4)
	if err != nil {
		return r, err
	}
	defer db.Close()
	store, err := outbox.New(db, b.dialect(), outbox.Options{Table: orderedTable})
	if err != nil {
		return r, err
	}
	var (
		mu        sync.Mutex
		committed = map[uuid.UUID]time.Time{}
		published = map[uuid.UUID]time.Time{}
	)
	tr := keyOrderTransport{func(_ context.Context, batch []outbox.Delivery) []error {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		for _, d := range batch {
			if _, ok := published[d.ID]; !ok {
				published[d.ID] = now
			}
		}
		return nil
	}}
	pub, err := outbox.NewPublisher(store, tr, outbox.PublisherOptions{
		Scope: outbox.Scope{Namespace: benchNamespace}, BatchSize: cfg.Batch, Concurrency: cfg.Workers, Logger: discard, Ordered: true,
	})
	if err != nil {
		return r, err
	}
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- pub.Run(pctx) }()

	every := time.Second / orderedLatencyRate
	tick := time.NewTicker(every)
	defer tick.Stop()
	for i, end := 0, time.Now().Add(cfg.LatencyDur); time.Now().Before(end); i++ {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return r, ctx.Err()
		}
		m := message(i)
		m.PartitionKey = "hot"
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return r, err
		}
		res, err := store.Enqueue(ctx, tx, m)
		if err != nil {
			_ = tx.Rollback()
			return r, err
		}
		if err := tx.Commit(); err != nil {
			return r, err
		}
		at := time.Now()
		mu.Lock()
		committed[res.ID] = at
		mu.Unlock()
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		all := len(published) >= len(committed)
		mu.Unlock()
		if all {
			break
		}
	}
	stop()
	if err := <-done; err != nil {
		return r, err
	}
	mu.Lock()
	defer mu.Unlock()
	lat := make([]float64, 0, len(committed))
	for id, c := range committed {
		p, ok := published[id]
		if !ok {
			return r, fmt.Errorf("%d of %d events not published 5 s after the last", len(committed)-len(published), len(committed))
		}
		lat = append(lat, max(0, float64(p.Sub(c).Microseconds())/1000))
	}
	slices.Sort(lat)
	r.Messages = len(lat)
	r.P50, r.P99 = quantile(lat, 0.50), quantile(lat, 0.99)
	return r, nil
}
