package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

// orderedKey is the one partition key of the ordered mode's backlog.
const orderedKey = "order-1"

// keyed returns n messages of namespace ns, all of partition key key (none when empty).
func keyed(ns string, n int, key string) []outbox.Message {
	msgs := messages(ns, n)
	for i := range msgs {
		msgs[i].PartitionKey = key
	}
	return msgs
}

// The ordered mode's drains: the backlog on one key by an ordered Publisher and by an
// unordered one, and the same rows without a key by an unordered one (the transport's
// fully pipelined path, which a key's rows no longer take even unordered).
const (
	drainOrdered   = "ordered"
	drainUnordered = "unordered"
	drainUnkeyed   = "unordered, no key"
)

var drains = []string{drainOrdered, drainUnordered, drainUnkeyed}

// orderedResult is the ordered mode: each drain's rate per round.
type orderedResult struct {
	rates map[string][]float64
}

// ratios returns the ordered drain's rate ÷ the other's, per round.
func (o *orderedResult) ratios(other string) []float64 {
	out := make([]float64, len(o.rates[drainOrdered]))
	for i := range out {
		out[i] = o.rates[drainOrdered][i] / o.rates[other][i]
	}
	return out
}

// keyOrder is a transport's wrapper that counts the messages published and the ones
// delivered before an earlier message of their key, and keeps the wrapped transport's
// key order ability ([outbox.TransportKeyOrder]), which the Publisher asks of the
// transport it is given.
type keyOrder struct {
	tr         outbox.Transport
	published  atomic.Int64
	mu         sync.Mutex
	last       map[string]uuid.UUID // the id of each key's latest delivered message
	outOfOrder int64
}

func (k *keyOrder) KeepsKeyOrder() bool {
	ko, ok := k.tr.(outbox.TransportKeyOrder)
	return ok && ko.KeepsKeyOrder()
}

func (k *keyOrder) Publish(ctx context.Context, ds []outbox.Delivery) []error {
	errs := k.tr.Publish(ctx, ds)
	k.mu.Lock()
	for i := range ds {
		if len(errs) > 0 && errs[i] != nil || ds[i].PartitionKey == "" {
			continue
		}
		// Ids are UUIDv7, increasing in enqueue order.
		key := ds[i].Namespace + "\x00" + ds[i].PartitionKey
		if prev, ok := k.last[key]; ok && bytes.Compare(ds[i].ID[:], prev[:]) < 0 {
			k.outOfOrder++
			continue
		}
		k.last[key] = ds[i].ID
	}
	k.mu.Unlock()
	k.published.Add(int64(len(ds)))
	return errs
}

// burnOrdered preloads n rows of namespace ns, all of partition key key (none when empty),
// and drains them with a Publisher through tr, ordered or not, and returns the rate. A
// message an ordered Publisher delivers before an earlier one of its key fails the run.
func (p *pg) burnOrdered(ctx context.Context, ns string, n, batch, workers int, tr outbox.Transport, key string, ordered bool) (float64, error) {
	if err := p.preload(ctx, keyed(ns, n, key)); err != nil {
		return 0, fmt.Errorf("preload: %w", err)
	}
	ko := &keyOrder{tr: tr, last: map[string]uuid.UUID{}}
	pub, err := outbox.NewPublisher(p.store, ko, outbox.PublisherOptions{
		Scope: outbox.Scope{Namespace: ns}, BatchSize: batch, Concurrency: workers, Ordered: ordered,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- pub.Run(rctx) }()
	// Until ordered claims take a key's rows together, a key delivers about five rows a
	// second: the deadline allows for that.
	deadline := time.Now().Add(time.Duration(max(60, n/4)) * time.Second)
	var elapsed time.Duration
	for {
		if st := pub.Stats(); st.Delivered+st.Dead >= int64(n) {
			elapsed = time.Since(start)
			break
		}
		select {
		case err := <-done:
			return 0, fmt.Errorf("publisher returned early: %v", err)
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			return 0, fmt.Errorf("timed out: %+v", pub.Stats())
		}
	}
	cancel()
	if err := <-done; err != nil {
		return 0, err
	}
	st := pub.Stats()
	if st.Dead > 0 || st.Errors > 0 || st.Delivered != int64(n) {
		return 0, fmt.Errorf("burn-down delivered %d of %d: %+v", st.Delivered, n, st)
	}
	if ordered && ko.outOfOrder > 0 { // an unordered Publisher promises no key order
		return 0, fmt.Errorf("%d messages delivered before an earlier one of their key", ko.outOfOrder)
	}
	return float64(n) / elapsed.Seconds(), nil
}

// runOrdered measures the ordered mode on b (the NATS transport), cfg.OrderedN rows a run,
// cfg.Rounds rounds, the drains taking turns to go first. It migrates the table's ordered
// set first, which ordered Publishers need.
func runOrdered(ctx context.Context, db *pg, b *broker, ns string, cfg config) (*orderedResult, error) {
	if err := migrations.Up(ctx, db.db, "postgres", migrations.Options{Ordered: true}); err != nil {
		return nil, fmt.Errorf("ordered migrations: %w", err)
	}
	res := &orderedResult{rates: map[string][]float64{}}
	for round := range cfg.Rounds {
		for k := range drains {
			drain := drains[(round+k)%len(drains)]
			if err := b.reset(ctx); err != nil {
				return nil, fmt.Errorf("reset: %w", err)
			}
			key := orderedKey
			if drain == drainUnkeyed {
				key = ""
			}
			rate, err := db.burnOrdered(ctx, ns, cfg.OrderedN, cfg.Batch, cfg.Workers, b.transport, key, drain == drainOrdered)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", drain, err)
			}
			if err := b.check(ctx, int64(cfg.OrderedN)); err != nil {
				return nil, fmt.Errorf("%s: %w", drain, err)
			}
			res.rates[drain] = append(res.rates[drain], rate)
		}
		logf("round %d: %s, %d rows on one key: ordered %.0f msg/s, unordered %.0f msg/s, unordered without a key %.0f msg/s",
			round+1, b.name, cfg.OrderedN, res.rates[drainOrdered][round], res.rates[drainUnordered][round], res.rates[drainUnkeyed][round])
	}
	return res, nil
}
