package main

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxgo/outbox"
)

// relayStores is how many tables (tenants) the relay scenario drains.
const relayStores = 10

// relayResult compares one Relay over relayStores tables with as many separate Publishers
// on the same tables and pool: the same rows, batch size and transport, in alternation.
type relayResult struct {
	Stores     int     `json:"stores"`
	N          int     `json:"n"`
	Relay      sample  `json:"relay"`
	Publishers sample  `json:"publishers"`
	Ratio      float64 `json:"relay_vs_publishers"`
}

// runRelayDrain loads BurnN/10 rows into each of ten tables and drains them, BurnRounds
// times each way: by one Relay over ten Stores, and by ten Publishers run side by side.
func runRelayDrain(ctx context.Context, cfg config, b backend, res *backendResult) error {
	tables := make([]string, relayStores)
	for i := range tables {
		tables[i] = fmt.Sprintf("outbox_relay_%d", i)
		if err := migrate(ctx, b.admin(), b.name(), tables[i]); err != nil {
			return err
		}
	}
	per := cfg.BurnN / relayStores
	run := func(useRelay bool) variant {
		return variant{name: map[bool]string{true: "relay", false: "publishers"}[useRelay], run: func(ctx context.Context) (float64, error) {
			for _, t := range tables {
				if err := b.reset(ctx, t); err != nil {
					return 0, err
				}
				if err := preload(ctx, b, t, per); err != nil {
					return 0, err
				}
				if err := b.maintain(ctx, t); err != nil {
					return 0, err
				}
			}
			d, err := relayDrain(ctx, b, tables, per, cfg.Batch, useRelay)
			if err != nil {
				return 0, err
			}
			return float64(per*relayStores) / d.Seconds(), nil
		}}
	}
	got, err := alternate(ctx, cfg.BurnRounds, []variant{run(false), run(true)})
	if err != nil {
		return err
	}
	r := &relayResult{Stores: relayStores, N: per * relayStores, Relay: summarize(got["relay"]), Publishers: summarize(got["publishers"]),
		Ratio: pairedRatio(got["relay"], got["publishers"])}
	logf("%s: relay over %d stores: %.0f rows/s, %d publishers: %.0f rows/s: %.3f (pairs %s)",
		b.name(), relayStores, r.Relay.Median, relayStores, r.Publishers.Median, r.Ratio, pairRatios(got["relay"], got["publishers"]))
	res.Relay = r
	return nil
}

// relayDrain drains per rows from each table, through one Relay or one Publisher per
// table, and returns how long until every row was recorded as delivered.
func relayDrain(ctx context.Context, b backend, tables []string, per, batch int, useRelay bool) (time.Duration, error) {
	db, _, err := b.pool(2 * relayStores)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	noop := outbox.TransportFunc(func(context.Context, []outbox.Delivery) []error { return nil })
	opts := outbox.PublisherOptions{Scope: outbox.Scope{Namespace: benchNamespace}, BatchSize: batch, Logger: discard}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var delivered func() int64
	done := make(chan error, relayStores)
	runs := 0
	start := time.Now()
	stores := make([]*outbox.Store, len(tables))
	for i, t := range tables {
		if stores[i], err = outbox.New(db, b.dialect(), outbox.Options{Table: t}); err != nil {
			return 0, err
		}
	}
	if useRelay {
		r, err := outbox.NewRelay(noop, outbox.RelayOptions{Publisher: opts})
		if err != nil {
			return 0, err
		}
		for i, s := range stores {
			if err := r.Add(tables[i], s); err != nil {
				return 0, err
			}
		}
		runs = 1
		go func() { done <- r.Run(rctx) }()
		delivered = func() int64 { return r.Stats().Total.Delivered }
	} else {
		pubs := make([]*outbox.Publisher, len(stores))
		for i, s := range stores {
			if pubs[i], err = outbox.NewPublisher(s, noop, opts); err != nil {
				return 0, err
			}
			runs++
			go func(p *outbox.Publisher) { done <- p.Run(rctx) }(pubs[i])
		}
		delivered = func() int64 {
			var n int64
			for _, p := range pubs {
				n += p.Stats().Delivered
			}
			return n
		}
	}

	want := int64(per * len(tables))
	deadline := start.Add(10 * time.Minute)
	for delivered() < want {
		if time.Now().After(deadline) || ctx.Err() != nil {
			cancel()
			return 0, fmt.Errorf("delivered %d of %d rows", delivered(), want)
		}

		time.Sleep(time.Millisecond) // a poll a millisecond costs both sides alike
	}
	elapsed := time.Since(start)
	cancel()
	for range runs {
		if err := <-done; err != nil {
			return 0, err
		}
	}
	return elapsed, nil
}
