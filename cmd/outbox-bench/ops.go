package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/outboxgo/outbox"
)

// Tables of the operations scenarios.
const (
	statsTable = "outbox_bench_stats"
	purgeTable = "outbox_bench_purge"
)

// statsResult is scenario 6: Store.Stats on a table with Retained delivered rows and
// StatsPending pending ones, against an exact COUNT(*) of the delivered rows.
type statsResult struct {
	Delivered int `json:"delivered"`
	Pending   int `json:"pending"`
	// Milliseconds per call, over StatsRounds calls after one warm-up.
	Stats       sample `json:"stats_ms"`
	StatsScoped sample `json:"stats_scoped_ms"`
	ExactCount  sample `json:"exact_delivered_count_ms"`
	Estimated   bool   `json:"delivered_estimated"`
	// EstimatedDelivered is what Stats reported for Delivered.
	EstimatedDelivered int64 `json:"stats_delivered"`
}

const (
	statsPending = 10_000
	statsRounds  = 15
)

func runStats(ctx context.Context, cfg config, b backend, res *backendResult) error {
	if err := migrate(ctx, b.admin(), b.name(), statsTable); err != nil {
		return err
	}
	if err := b.reset(ctx, statsTable); err != nil {
		return err
	}
	start := time.Now()
	if err := b.loadRetained(ctx, statsTable, cfg.Retained); err != nil {
		return fmt.Errorf("loading %d delivered rows: %w", cfg.Retained, err)
	}
	if err := preload(ctx, b, statsTable, statsPending); err != nil {
		return err
	}
	if err := b.maintain(ctx, statsTable); err != nil {
		return err
	}
	logf("%s: stats: loaded %d delivered + %d pending rows in %.1fs", b.name(), cfg.Retained, statsPending, time.Since(start).Seconds())
	store, err := outbox.New(b.admin(), b.dialect(), outbox.Options{Table: statsTable})
	if err != nil {
		return err
	}
	r := &statsResult{Delivered: cfg.Retained, Pending: statsPending}
	timeIt := func(fn func() error) (sample, error) {
		var ms []float64
		for i := range statsRounds + 1 {
			t0 := time.Now()
			if err := fn(); err != nil {
				return sample{}, err
			}
			if i > 0 { // the first call warms the cache
				ms = append(ms, float64(time.Since(t0).Microseconds())/1000)
			}
		}
		return summarize(ms), nil
	}
	var st outbox.Stats
	if r.Stats, err = timeIt(func() (err error) { st, err = store.Stats(ctx, outbox.Scope{}); return err }); err != nil {
		return err
	}
	if st.Pending != statsPending {
		return fmt.Errorf("stats counted %d pending rows, want %d", st.Pending, statsPending)
	}
	r.Estimated, r.EstimatedDelivered = st.DeliveredEstimated, st.Delivered
	if r.StatsScoped, err = timeIt(func() error {
		_, err := store.Stats(ctx, outbox.Scope{Namespace: benchNamespace, Topics: []string{benchTopic}})
		return err
	}); err != nil {
		return err
	}
	var n int64
	if r.ExactCount, err = timeIt(func() error {
		return b.admin().QueryRowContext(ctx, `SELECT COUNT(*) FROM `+statsTable+` WHERE status = 'delivered'`).Scan(&n)
	}); err != nil {
		return err
	}
	logf("%s: stats over %d delivered + %d pending: %.1f ms (scoped %.1f ms; delivered %d, estimated %v); exact COUNT(*) of delivered %.1f ms",
		b.name(), cfg.Retained, statsPending, r.Stats.Median, r.StatsScoped.Median, st.Delivered, st.DeliveredEstimated, r.ExactCount.Median)
	res.Stats = r
	return nil
}

// purgeBurnResult is scenario 7: the Publisher's burn-down with retention purging
// PurgeRetained day-old delivered rows while it drains, against the same burn-down with
// retention off, on the same freshly loaded table, in alternation.
type purgeBurnResult struct {
	Retained int    `json:"retained"`
	N        int    `json:"n"`
	Batch    int    `json:"batch"`
	Off      sample `json:"retention_off"`
	On       sample `json:"retention_on"`
	// Ratio is on/off, paired (target >= 0.90).
	Ratio float64 `json:"purging_vs_not"`
	// Purged is the median count of retained rows the purge deleted during a drain.
	Purged float64 `json:"purged_during_drain"`
}

func runPurgeBurn(ctx context.Context, cfg config, b backend, res *backendResult) error {
	if err := migrate(ctx, b.admin(), b.name(), purgeTable); err != nil {
		return err
	}
	retained := min(cfg.Retained, 100_000) // reloaded for every run
	r := &purgeBurnResult{Retained: retained, N: min(cfg.BurnN, cfg.GrowthN), Batch: cfg.Batch}
	var purged []float64
	drain := func(on bool) variant {
		name := "off"
		if on {
			name = "on"
		}
		return variant{name: name, run: func(ctx context.Context) (float64, error) {
			rate, gone, err := burnPurging(ctx, b, retained, r.N, cfg.Batch, cfg.Workers, on)
			if on {
				purged = append(purged, float64(gone))
			}
			return rate, err
		}}
	}
	// Six pairs at least: single pairs spread by a fifth either way on a shared machine.
	got, err := alternate(ctx, max(cfg.GrowthRounds, 6), []variant{drain(false), drain(true)})
	if err != nil {
		return err
	}
	r.Off, r.On = summarize(got["off"]), summarize(got["on"])
	r.Ratio, r.Purged = pairedRatio(got["on"], got["off"]), median(purged)
	logf("%s: purge during burn-down: %.0f -> %.0f rows/s (%.3f; pairs %s) while purging a median %.0f of %d day-old rows",
		b.name(), r.Off.Median, r.On.Median, r.Ratio, pairRatios(got["on"], got["off"]), r.Purged, retained)
	res.PurgeBurn = r
	return nil
}

// burnPurging loads retained day-old delivered rows and n pending ones into purgeTable and
// drains the pending rows with a Publisher, with Retention{Delivered: 1h} purging the
// retained rows from the start when on. It returns the drain's rate and how many
// retained rows were purged by the time the n-th row was delivered.
func burnPurging(ctx context.Context, b backend, retained, n, batch, workers int, on bool) (float64, int64, error) {
	if err := b.reset(ctx, purgeTable); err != nil {
		return 0, 0, err
	}
	if err := b.loadRetained(ctx, purgeTable, retained); err != nil {
		return 0, 0, err
	}
	if err := preload(ctx, b, purgeTable, n); err != nil {
		return 0, 0, err
	}
	if err := b.maintain(ctx, purgeTable); err != nil {
		return 0, 0, err
	}
	db, _, err := b.pool(workers + 3)
	if err != nil {
		return 0, 0, err
	}
	defer db.Close()
	store, err := outbox.New(db, b.dialect(), outbox.Options{Table: purgeTable})
	if err != nil {
		return 0, 0, err
	}
	var published atomic.Int64
	done := make(chan struct{})
	tr := outbox.TransportFunc(func(_ context.Context, ds []outbox.Delivery) []error {
		if published.Add(int64(len(ds))) >= int64(n) && published.Load()-int64(len(ds)) < int64(n) {
			close(done)
		}
		return nil
	})
	o := outbox.PublisherOptions{Scope: outbox.Scope{Namespace: benchNamespace}, BatchSize: batch, Concurrency: workers, Logger: discard}
	if on {
		// A short interval, so that the first purge starts with the drain.
		o.Retention = outbox.Retention{Delivered: time.Hour, Interval: 10 * time.Millisecond}
	}
	pub, err := outbox.NewPublisher(store, tr, o)
	if err != nil {
		return 0, 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- pub.Run(rctx) }()
	timeout := time.NewTimer(time.Duration(max(120, n/200)) * time.Second)
	defer timeout.Stop()
	select {
	case <-done:
	case err := <-errc:
		return 0, 0, fmt.Errorf("publisher stopped: %v", err)
	case <-timeout.C:
		return 0, 0, fmt.Errorf("publisher delivered %d of %d rows before the timeout", pub.Stats().Delivered, n)
	}
	for pub.Stats().Delivered < int64(n) {
		if time.Since(start) > 10*time.Minute {
			return 0, 0, fmt.Errorf("the last batch did not settle")
		}
		time.Sleep(50 * time.Microsecond)
	}
	elapsed := time.Since(start)
	cancel()
	if err := <-errc; err != nil {
		return 0, 0, err
	}
	if st := pub.Stats(); st.Errors > 0 {
		return 0, 0, fmt.Errorf("publisher reported %d errors", st.Errors)
	}
	delivered, total, err := countStatus(ctx, b.admin(), purgeTable)
	if err != nil {
		return 0, 0, err
	}
	if total != delivered || delivered < int64(n) {
		return 0, 0, fmt.Errorf("after the drain: %d delivered of %d rows, want at least %d delivered and nothing else", delivered, total, n)
	}
	gone := int64(retained+n) - total
	if !on && gone != 0 {
		return 0, 0, fmt.Errorf("%d rows vanished without retention", gone)
	}
	return float64(n) / elapsed.Seconds(), gone, nil
}
