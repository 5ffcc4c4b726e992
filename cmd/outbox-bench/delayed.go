package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

// delayedResult is the delayed-rows scenario: live latency with rows scheduled an hour
// ahead against the same run with none, and a backlog falling due at once drained against
// the same backlog enqueued due, each on a table never analyzed.
type delayedResult struct {
	Rate float64 `json:"rate"`
	// Latency holds one run per count of delayed rows (the first, 0, is the baseline).
	Latency []delayedLatency `json:"latency"`
	// DrainN rows fell due within DueSpread; the rates are rows per second from when the
	// first fell due (delayed) or from the publisher's start (due), medians over rounds.
	DrainN           int       `json:"drain_n"`
	DueSpread        string    `json:"due_spread"`
	DelayedDrain     []float64 `json:"delayed_drain_rates"`
	UndelayedDrain   []float64 `json:"undelayed_drain_rates"`
	DrainVsUndelayed float64   `json:"delayed_drain_vs_undelayed"`
}

type delayedLatency struct {
	Delayed int     `json:"delayed"`
	P50     float64 `json:"p50_ms"`
	P99     float64 `json:"p99_ms"`
	// P50Ratio and P99Ratio are against the run with no delayed rows.
	P50Ratio float64 `json:"p50_vs_none"`
	P99Ratio float64 `json:"p99_vs_none"`
}

// delayedLabel names a count of delayed rows in a metric: 100k, 1m.
func delayedLabel(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return strconv.Itoa(n/1_000_000) + "m"
	case n >= 1000 && n%1000 == 0:
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

func (d *delayedResult) metrics(add func(string, float64)) {
	for _, l := range d.Latency[1:] {
		add("delayed_"+delayedLabel(l.Delayed)+"_latency_p50_vs_none", l.P50Ratio)
		add("delayed_"+delayedLabel(l.Delayed)+"_latency_p99_vs_none", l.P99Ratio)
	}
	if d.DrainVsUndelayed > 0 {
		add("delayed_drain_vs_undelayed", d.DrainVsUndelayed)
	}
}

// runDelayed measures scenario 18: commit-to-publish latency at DelayedRate with each of
// DelayedCounts rows pending an hour ahead (the table analyzed), rounds rotated; then
// DelayedDrainN rows falling due within a second drained by a Publisher against the same
// rows enqueued due, alternated, each on a fresh table that was never analyzed.
func runDelayed(ctx context.Context, cfg config, b backend, res *backendResult) error {
	d := &delayedResult{Rate: cfg.DelayedRate, DrainN: cfg.DelayedDrainN, DueSpread: time.Second.String()}
	rounds := make([][]latencyResult, len(cfg.DelayedCounts))
	for round := range max(1, cfg.DelayedRounds) {
		for k := range cfg.DelayedCounts {
			i := (k + round) % len(cfg.DelayedCounts)
			c := cfg
			c.Delayed = cfg.DelayedCounts[i]
			r, err := latency(ctx, c, b, cfg.DelayedRate, 0, false, false, false)
			if err != nil {
				return err
			}
			logf("%s: latency with %d rows delayed an hour: p50 %.1fms p99 %.1fms, %d messages, %d unpublished",
				b.name(), c.Delayed, r.P50, r.P99, r.Messages, r.Unpublished)
			rounds[i] = append(rounds[i], r)
		}
	}
	for i, rs := range rounds {
		m := medianLatency(rs)
		l := delayedLatency{Delayed: cfg.DelayedCounts[i], P50: m.P50, P99: m.P99}
		if base := d.Latency; len(base) > 0 && base[0].P50 > 0 && base[0].P99 > 0 {
			l.P50Ratio, l.P99Ratio = m.P50/base[0].P50, m.P99/base[0].P99
		}
		d.Latency = append(d.Latency, l)
	}
	var k int
	drain := func(delayed bool, into *[]float64) variant {
		return variant{name: fmt.Sprintf("delayed=%v", delayed), run: func(ctx context.Context) (float64, error) {
			k++
			rate, err := dueDrain(ctx, cfg, b, fmt.Sprintf("outbox_due_drain_%d", k), delayed)
			*into = append(*into, rate)
			return rate, err
		}}
	}
	if _, err := alternate(ctx, max(1, cfg.DelayedRounds), []variant{drain(false, &d.UndelayedDrain), drain(true, &d.DelayedDrain)}); err != nil {
		return err
	}
	d.DrainVsUndelayed = pairedRatio(d.DelayedDrain, d.UndelayedDrain)
	logf("%s: %d rows falling due at once, never analyzed: %.0f rows/s against %.0f due at once: %.3f",
		b.name(), cfg.DelayedDrainN, median(d.DelayedDrain), median(d.UndelayedDrain), d.DrainVsUndelayed)
	res.Delayed = d
	return nil
}

// dueDrain creates table (dropped at the end), never analyzed, loads cfg.DelayedDrainN
// pending rows and drains them with a Publisher: with delayed, the rows fall due within a
// second once the load is done and the publisher idles, and the rate counts from the first
// due time; without, they are due when loaded and the rate counts from the publisher's
// start. Both publishers poll every 10ms at most when idle, so that the wait for the due
// time adds no second of backoff.
func dueDrain(ctx context.Context, cfg config, b backend, table string, delayed bool) (float64, error) {
	n := cfg.DelayedDrainN
	if err := migrate(ctx, b.admin(), b.name(), table); err != nil {
		return 0, err
	}
	defer func() {
		if err := migrations.Down(context.WithoutCancel(ctx), b.admin(), b.name(), migrations.Options{Table: table}); err != nil {
			logf("%s: drop %s: %v", b.name(), table, err)
		}
	}()
	if pg, ok := b.(interface {
		noAutoAnalyze(context.Context, string) error
	}); ok {
		if err := pg.noAutoAnalyze(ctx, table); err != nil {
			return 0, err
		}
	}
	// Loading takes about a second per 100,000 rows on a loaded machine; the delayed rows
	// fall due after it.
	due := time.Now()
	if delayed {
		due = due.Add(2*time.Second + time.Duration(n/50)*time.Millisecond)
	}
	spread := time.Duration(0)
	if delayed {
		spread = time.Second
	}
	if err := b.loadPending(ctx, table, n, due, spread); err != nil {
		return 0, err
	}
	if delayed && time.Now().After(due) {
		return 0, fmt.Errorf("loading %d rows took past their due time; raise the lead", n)
	}
	db, _, err := b.pool(cfg.Workers + 2)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	store, err := outbox.New(db, b.dialect(), outbox.Options{Table: table})
	if err != nil {
		return 0, err
	}
	var (
		mu   sync.Mutex
		seen int
		last time.Time
		all  = make(chan struct{})
	)
	tr := outbox.TransportFunc(func(_ context.Context, ds []outbox.Delivery) []error {
		mu.Lock()
		defer mu.Unlock()
		if seen += len(ds); seen >= n && last.IsZero() {
			last = time.Now()
			close(all)
		}
		return nil
	})
	pub, err := outbox.NewPublisher(store, tr, outbox.PublisherOptions{
		Scope: outbox.Scope{Namespace: benchNamespace}, BatchSize: cfg.Batch, Concurrency: cfg.Workers,
		PollInterval: 10 * time.Millisecond, IdleBackoffMax: 10 * time.Millisecond, Logger: discard,
	})
	if err != nil {
		return 0, err
	}
	pctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- pub.Run(pctx) }()
	defer func() { stop(); <-done }()
	timeout := time.Duration(max(120, n/200)) * time.Second
	select {
	case err := <-done:
		done <- err // for the deferred wait
		return 0, fmt.Errorf("the publisher stopped: %v", err)
	case <-all:
	case <-time.After(timeout + time.Until(due)):
		mu.Lock()
		defer mu.Unlock()
		return 0, fmt.Errorf("%d of %d rows published within %s", seen, n, timeout)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	from := start
	if delayed {
		from = due
	}
	mu.Lock()
	defer mu.Unlock()
	return float64(n) / last.Sub(from).Seconds(), nil
}
