package main

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
)

// latencyResult is scenario 4 under one publisher configuration.
type latencyResult struct {
	Config       string  `json:"config"`
	PollInterval string  `json:"poll_interval"`
	TargetRate   float64 `json:"target_rate"`
	AchievedRate float64 `json:"achieved_rate"`
	TxPerSecond  float64 `json:"producer_tx_per_second"`
	Messages     int     `json:"messages"`
	P50          float64 `json:"p50_ms"`
	P90          float64 `json:"p90_ms"`
	P99          float64 `json:"p99_ms"`
	Max          float64 `json:"max_ms"`
	// Unpublished counts messages committed in the window but not published within the
	// drain allowance; Early those the publisher received before the producer's Commit
	// returned (their latency counts as zero).
	Unpublished int `json:"unpublished"`
	Early       int `json:"published_before_commit_returned"`
	// Dropped counts producer ticks skipped because every producer was still busy.
	Dropped int64 `json:"dropped_ticks"`
	// FirstHalfP50 and SecondHalfP50 split the window by commit time. Steady is false when
	// the second half is much slower: the publisher did not keep up and a backlog grew, so
	// the percentiles depend on the window's length.
	FirstHalfP50  float64 `json:"first_half_p50_ms"`
	SecondHalfP50 float64 `json:"second_half_p50_ms"`
	Steady        bool    `json:"steady"`
	// Delivered is the publisher's delivery rate over the window.
	DeliveredRate float64 `json:"delivered_rate"`
	// Raw marks the reference run: the raw claim + ack loop in place of the Publisher, at
	// the same producer rate. It tells whether the database keeps up at all.
	Raw bool `json:"raw,omitempty"`
	// Kind is "saturated" (producer at half the burn-down rate) or "fixed" (a moderate
	// rate, default options); Shared is true when the producer enqueues through the
	// publisher's own Store, as a service that runs both in one process does, and false when
	// it has a Store and pool of its own, as another process would.
	Kind   string `json:"kind"`
	Shared bool   `json:"shared_store"`
	// Process is true when the producer ran in a process of its own (the bench binary run
	// again), with its own pool and Store.
	Process bool `json:"producer_process,omitempty"`
	// RoundsP50 and RoundsP99 are each round's figures (config.LatencyRounds); the fields
	// above are their medians.
	RoundsP50 []float64 `json:"rounds_p50_ms,omitempty"`
	RoundsP99 []float64 `json:"rounds_p99_ms,omitempty"`
}

// idleResult is the latency of one event enqueued after the publisher sat idle.
type idleResult struct {
	Idle      string  `json:"idle"`
	Shared    bool    `json:"shared_store"`
	LatencyMs float64 `json:"latency_ms"`
}

// Producer shape: a tick every latencyTick hands one transaction of enough messages to keep
// the target rate to one of latencyProducers goroutines.
const (
	latencyTick      = 5 * time.Millisecond
	latencyProducers = 4
)

// runLatency measures commit-to-publish latency:
//
//   - at fixed moderate rates (100 and 1,000 messages/s) with default options, the producer
//     sharing the publisher's Store (one process) and with a Store of its own (another
//     process): the latency a service sees at ordinary load;
//   - saturated: a producer at half the library's burn-down rate, with the default
//     PollInterval and a 10ms one, and the raw loop as reference: the machine's limit;
//   - one event after the publisher sat idle (cfg.IdleWait), shared and separate.
func runLatency(ctx context.Context, cfg config, b backend, res *backendResult) error {
	type run struct {
		kind   string
		rate   float64
		poll   time.Duration
		raw    bool
		shared bool
		// process puts the producer in a process of its own (producer.go).
		process bool
	}
	var runs []run
	for _, rate := range []float64{100, 1000} {
		runs = append(runs, run{"fixed", rate, 0, false, true, false}, run{"fixed", rate, 0, false, false, true})
	}
	if res.Burndown != nil && res.Burndown.Library.Median > 0 {
		rate := res.Burndown.Library.Median / 2
		runs = append(runs, run{"saturated", rate, 0, false, false, false}, run{"saturated", rate, 10 * time.Millisecond, false, false, false},
			run{"saturated", rate, 10 * time.Millisecond, true, false, false})
	} else {
		logf("%s: latency: no burn-down rate, so no saturated runs (run with -only burndown,latency)", b.name())
	}
	// Every run LatencyRounds times, the order rotated each round; a run's figures are the
	// medians over its rounds. Near the machine's limit (the saturated runs) one round's
	// p99 can move by a factor of three from the next: SQLite gives its write lock to no
	// writer in particular, and one claim that loses it a few times running waits out the
	// busy handler's growing sleeps.
	rounds := make([][]latencyResult, len(runs))
	satRatios := []float64{}
	for round := range max(1, cfg.LatencyRounds) {
		var satLib, satRaw float64
		for k := range runs {
			i := (k + round) % len(runs)
			run := runs[i]
			r, err := latency(ctx, cfg, b, run.rate, run.poll, run.raw, run.shared, run.process)
			if err != nil {
				return err
			}
			r.Kind = run.kind
			logf("%s: latency (%s, %s): %.0f msg/s (target %.0f): p50 %.1fms p90 %.1fms p99 %.1fms max %.1fms, %d messages, %d unpublished, %d early; p50 %.1f then %.1f ms (steady %v)",
				b.name(), run.kind, r.Config, r.AchievedRate, r.TargetRate, r.P50, r.P90, r.P99, r.Max, r.Messages, r.Unpublished, r.Early, r.FirstHalfP50, r.SecondHalfP50, r.Steady)
			rounds[i] = append(rounds[i], r)
			if run.kind == "saturated" && run.raw {
				satRaw = r.P99
			} else if run.kind == "saturated" && run.poll == 0 {
				satLib = r.P99
			}
		}
		if satLib > 0 && satRaw > 0 {
			satRatios = append(satRatios, satLib/satRaw)
		}
	}
	for _, rs := range rounds {
		res.Latency = append(res.Latency, medianLatency(rs))
	}
	if len(satRatios) > 0 {
		res.SaturatedP99VsRaw = median(satRatios)
		res.SaturatedP99VsRawRounds = satRatios
		logf("%s: saturated p99, default options ÷ raw loop, per round: %.2f (median %.2f)", b.name(), satRatios, res.SaturatedP99VsRaw)
	}
	for _, shared := range []bool{true, false} {
		ms, err := latencyAfterIdle(ctx, cfg, b, shared)
		if err != nil {
			return err
		}
		logf("%s: latency after %s idle (shared store %v): %.1fms", b.name(), cfg.IdleWait, shared, ms)
		res.Idle = append(res.Idle, idleResult{Idle: cfg.IdleWait.String(), Shared: shared, LatencyMs: ms})
	}
	return nil
}

// medianLatency folds the rounds of one latency run: the median of each percentile and of
// the rates, the largest max, the sums of the counts, steady only when every round was;
// RoundsP50 and RoundsP99 keep each round's figures.
func medianLatency(rs []latencyResult) latencyResult {
	m := rs[0]
	pick := func(f func(latencyResult) float64) float64 {
		xs := make([]float64, len(rs))
		for i, r := range rs {
			xs[i] = f(r)
		}
		return median(xs)
	}
	m.P50 = pick(func(r latencyResult) float64 { return r.P50 })
	m.P90 = pick(func(r latencyResult) float64 { return r.P90 })
	m.P99 = pick(func(r latencyResult) float64 { return r.P99 })
	m.AchievedRate = pick(func(r latencyResult) float64 { return r.AchievedRate })
	m.TxPerSecond = pick(func(r latencyResult) float64 { return r.TxPerSecond })
	m.DeliveredRate = pick(func(r latencyResult) float64 { return r.DeliveredRate })
	m.FirstHalfP50 = pick(func(r latencyResult) float64 { return r.FirstHalfP50 })
	m.SecondHalfP50 = pick(func(r latencyResult) float64 { return r.SecondHalfP50 })
	m.Messages, m.Unpublished, m.Early, m.Dropped = 0, 0, 0, 0
	m.RoundsP50, m.RoundsP99 = nil, nil
	for _, r := range rs {
		m.Max = max(m.Max, r.Max)
		m.Messages += r.Messages
		m.Unpublished += r.Unpublished
		m.Early += r.Early
		m.Dropped += r.Dropped
		m.Steady = m.Steady && r.Steady
		m.RoundsP50 = append(m.RoundsP50, r.P50)
		m.RoundsP99 = append(m.RoundsP99, r.P99)
	}
	return m
}

// latencyAfterIdle starts a publisher with default options, lets it sit idle for
// cfg.IdleWait, commits one event and returns how long the event took to reach the
// transport.
func latencyAfterIdle(ctx context.Context, cfg config, b backend, shared bool) (float64, error) {
	if err := b.reset(ctx, mainTable); err != nil {
		return 0, err
	}
	pubDB, _, err := b.pool(cfg.Workers + 2)
	if err != nil {
		return 0, err
	}
	defer pubDB.Close()
	pubStore, err := outbox.New(pubDB, b.dialect(), outbox.Options{})
	if err != nil {
		return 0, err
	}
	prodDB, prodStore := pubDB, pubStore
	if !shared {
		if prodDB, _, err = b.pool(1); err != nil {
			return 0, err
		}
		defer prodDB.Close()
		if prodStore, err = outbox.New(prodDB, b.dialect(), outbox.Options{}); err != nil {
			return 0, err
		}
	}
	got := make(chan time.Time, 1)
	tr := outbox.TransportFunc(func(_ context.Context, batch []outbox.Delivery) []error {
		select {
		case got <- time.Now():
		default:
		}
		return nil
	})
	pub, err := outbox.NewPublisher(pubStore, tr, outbox.PublisherOptions{Scope: outbox.Scope{Namespace: benchNamespace}, Logger: discard})
	if err != nil {
		return 0, err
	}
	pctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- pub.Run(pctx) }()
	defer func() { stop(); <-done }()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(cfg.IdleWait):
	}
	tx, err := prodDB.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	if _, err := prodStore.Enqueue(ctx, tx, message(0)); err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	committed := time.Now()
	select {
	case at := <-got:
		// The transport can see the event before Commit has returned to the producer;
		// such a delivery counts as zero, as in the steady runs.
		return max(0, float64(at.Sub(committed).Microseconds())/1000), nil
	case <-time.After(time.Minute):
		return 0, fmt.Errorf("the event enqueued after %s idle was not published within a minute", cfg.IdleWait)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func latency(ctx context.Context, cfg config, b backend, rate float64, poll time.Duration, rawLoop, shared, process bool) (latencyResult, error) {
	r := latencyResult{TargetRate: rate, Config: "default options", PollInterval: outbox.DefaultPollInterval.String(), Raw: rawLoop, Shared: shared, Process: process}
	if poll > 0 {
		r.Config, r.PollInterval = "PollInterval "+poll.String(), poll.String()
	}
	if rawLoop {
		r.Config = "raw claim + ack loop, " + poll.String() + " poll (reference)"
	}
	switch {
	case shared:
		r.Config += ", producer on the publisher's Store"
	case process:
		r.Config += ", producer in another process"
	default:
		r.Config += ", producer on a Store of its own"
	}
	if err := b.reset(ctx, mainTable); err != nil {
		return r, err
	}
	if cfg.History > 0 {
		if err := b.loadRetained(ctx, mainTable, cfg.History); err != nil {
			return r, err
		}
		if err := b.maintain(ctx, mainTable); err != nil {
			return r, err
		}
	}
	if cfg.Delayed > 0 {
		if err := b.loadPending(ctx, mainTable, cfg.Delayed, time.Now().Add(time.Hour), 0); err != nil {
			return r, err
		}
		if err := b.maintain(ctx, mainTable); err != nil {
			return r, err
		}
	}
	pubDB, _, err := b.pool(cfg.Workers + 2)
	if err != nil {
		return r, err
	}
	defer pubDB.Close()
	prodDB, _, err := b.pool(latencyProducers)
	if err != nil {
		return r, err
	}
	defer prodDB.Close()
	storeOpts := outbox.Options{}
	if cfg.logReader != nil {
		storeOpts.LogLease = logLease
	}
	pubStore, err := outbox.New(pubDB, b.dialect(), storeOpts)
	if err != nil {
		return r, err
	}
	prodStore, err := outbox.New(prodDB, b.dialect(), storeOpts)
	if err != nil {
		return r, err
	}
	if shared {
		prodStore = pubStore // enqueues wake the publisher in the process
	}

	var (
		mu        sync.Mutex
		committed = map[uuid.UUID]time.Time{}
		published = map[uuid.UUID]time.Time{}
	)
	tr := outbox.TransportFunc(func(_ context.Context, batch []outbox.Delivery) []error {
		now := time.Now()
		mu.Lock()
		for _, d := range batch {
			if _, seen := published[d.ID]; !seen {
				published[d.ID] = now
			}
		}
		mu.Unlock()
		return nil
	})
	raw := b.raw(mainTable)
	var (
		run       func(ctx context.Context) error
		delivered func() int64
	)
	switch {
	case rawLoop:
		run, delivered = rawConsumer(raw, pubDB, cfg, poll, tr)
	case cfg.logReader != nil:
		r.Config = "log reader beside a polling Publisher" + strings.TrimPrefix(r.Config, "default options")
		lc, err := cfg.logReader(pubStore, tr)
		if err != nil {
			return r, err
		}
		run, delivered = lc.run, lc.delivered
	default:
		pub, err := outbox.NewPublisher(pubStore, tr, outbox.PublisherOptions{
			Scope:     outbox.Scope{Namespace: benchNamespace},
			BatchSize: cfg.Batch, Concurrency: cfg.Workers, PollInterval: poll, Logger: discard,
		})
		if err != nil {
			return r, err
		}
		run = func(ctx context.Context) error {
			if err := pub.Run(ctx); err != nil {
				return err
			}
			if st := pub.Stats(); st.Errors > 0 {
				return fmt.Errorf("publisher reported %d errors", st.Errors)
			}
			return nil
		}
		delivered = func() int64 { return pub.Stats().Delivered }
	}
	pctx, stopPub := context.WithCancel(ctx)
	defer stopPub()
	pubDone := make(chan error, 1)
	go func() { pubDone <- run(pctx) }()
	if cfg.logReader != nil {
		// A log reader deployed runs all along; this one starts with the window, behind the
		// log of everything since the last log window (other modes' windows, the resets).
		// It must have read that before the window starts, or its first seconds measure a
		// catch-up no running reader has: one marker event, published once read.
		marker, err := enqueueOne(ctx, pubDB, pubStore, message(0))
		if err != nil {
			return r, err
		}
		if err := waitFor(ctx, time.Minute, func() bool {
			mu.Lock()
			defer mu.Unlock()
			_, ok := published[marker]
			return ok
		}); err != nil {
			return r, fmt.Errorf("log reader did not catch up before the window: %w", err)
		}
	}

	// Producers: in this process, or in a producer process (producer.go).
	record := func(ids []uuid.UUID, at time.Time) {
		mu.Lock()
		for _, id := range ids {
			committed[id] = at
		}
		mu.Unlock()
	}
	var ps producerStats
	if cfg.window != nil {
		cfg.window(true)
	}
	if process {
		ps, err = produceInProcess(ctx, cfg, b, rate, record)
	} else {
		ps, err = produceAt(ctx, cfg, prodDB, prodStore, raw, rate, record)
	}
	if err != nil {
		return r, err
	}
	produced := ps.Elapsed

	// Drain: wait until everything committed is published, at most a few poll intervals.
	drainBy := time.Now().Add(max(5*time.Second, 4*outbox.DefaultPollInterval))
	for time.Now().Before(drainBy) {
		mu.Lock()
		left := 0
		for id := range committed {
			if _, ok := published[id]; !ok {
				left++
			}
		}
		mu.Unlock()
		if left == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if cfg.window != nil {
		cfg.window(false)
	}
	stopPub()
	if err := <-pubDone; err != nil {
		return r, err
	}

	mu.Lock()
	defer mu.Unlock()
	type obs struct {
		at  time.Time
		lat float64
	}
	seen := make([]obs, 0, len(committed))
	for id, c := range committed {
		p, ok := published[id]
		switch {
		case !ok:
			r.Unpublished++
		case p.Before(c):
			r.Early++
			seen = append(seen, obs{c, 0})
		default:
			seen = append(seen, obs{c, float64(p.Sub(c).Microseconds()) / 1000})
		}
	}
	slices.SortFunc(seen, func(a, b obs) int { return a.at.Compare(b.at) })
	lat := make([]float64, len(seen))
	for i, o := range seen {
		lat[i] = o.lat
	}
	half := len(lat) / 2
	r.FirstHalfP50, r.SecondHalfP50 = median(lat[:half]), median(lat[half:])
	r.Steady = r.SecondHalfP50 <= 1.5*r.FirstHalfP50+25
	r.DeliveredRate = float64(delivered()) / produced.Seconds()
	slices.Sort(lat)
	r.Messages = len(lat)
	r.AchievedRate = float64(ps.Messages) / produced.Seconds()
	r.TxPerSecond = float64(ps.Txs) / produced.Seconds()
	r.Dropped = ps.Dropped
	r.P50, r.P90, r.P99 = quantile(lat, 0.50), quantile(lat, 0.90), quantile(lat, 0.99)
	if len(lat) > 0 {
		r.Max = lat[len(lat)-1]
	} else {
		// Nothing of the window was published in time: no percentile to give, and JSON
		// has no NaN (a run that met one wrote no results.json). Unpublished and Steady
		// say what happened; a step so is never held.
		r.P50, r.P90, r.P99, r.FirstHalfP50, r.SecondHalfP50, r.Steady = 0, 0, 0, 0, 0, false
	}
	return r, nil
}

// rawConsumer is the raw relay as a latency consumer: cfg.Workers goroutines of one claim
// statement, the transport, one batched ack, pausing poll after a claim that came back
// less than full. It returns the loop (ended by its context) and its delivered count.
func rawConsumer(raw rawOps, db *sql.DB, cfg config, poll time.Duration, tr outbox.Transport) (func(ctx context.Context) error, func() int64) {
	var delivered atomic.Int64
	loop := func(ctx context.Context, worker string) error {
		for ctx.Err() == nil {
			c, err := raw.claim(ctx, db, cfg.Batch, worker)
			if err != nil {
				return err
			}
			if len(c.ids) > 0 {
				ds := make([]outbox.Delivery, len(c.ids))
				for i, id := range c.ids {
					ds[i].ID = raw.leaseOf(id, c.token).ID
				}
				tr.Publish(ctx, ds)
				if err := raw.ack(ctx, db, c.ids); err != nil {
					return err
				}
				delivered.Add(int64(len(c.ids)))
			}
			if len(c.ids) < cfg.Batch {
				select {
				case <-ctx.Done():
				case <-time.After(poll):
				}
			}
		}
		return nil
	}
	run := func(ctx context.Context) error {
		errs := make(chan error, cfg.Workers)
		for w := range cfg.Workers {
			go func() { errs <- loop(ctx, fmt.Sprintf("raw-%d", w)) }()
		}
		var first error
		for range cfg.Workers {
			if err := <-errs; err != nil && first == nil && ctx.Err() == nil {
				first = err
			}
		}
		return first
	}
	return run, delivered.Load
}

// producerStats is what a steady producer did.
type producerStats struct {
	Messages, Txs, Dropped int64
	Elapsed                time.Duration
}

// produceAt runs the steady producer for cfg.LatencyDur: a tick every latencyTick hands one
// transaction of enough messages to keep rate to one of latencyProducers goroutines on
// db. record gets the ids of every transaction committed after the warm-up (the first
// fifth) with the time its Commit returned.
func produceAt(ctx context.Context, cfg config, db *sql.DB, store *outbox.Store, raw rawOps, rate float64,
	record func(ids []uuid.UUID, at time.Time)) (producerStats, error) {
	jobs := make(chan int, latencyProducers)
	var (
		seq      atomic.Int64
		txs      atomic.Int64
		prodErr  error
		errOnce  sync.Once
		wg       sync.WaitGroup
		warmupTo = time.Now().Add(cfg.LatencyDur / 5)
	)
	for range latencyProducers {
		wg.Go(func() {
			for k := range jobs {
				if err := produce(ctx, db, store, raw, &seq, k, warmupTo, record); err != nil {
					errOnce.Do(func() { prodErr = err })
					return
				}
				txs.Add(1)
			}
		})
	}
	var dropped int64
	perTick := rate * latencyTick.Seconds()
	carry := 0.0
	start := time.Now()
	ticker := time.NewTicker(latencyTick)
	for now := range ticker.C {
		if now.Sub(start) >= cfg.LatencyDur || ctx.Err() != nil {
			break
		}
		carry += perTick
		k := int(carry)
		if k == 0 {
			continue
		}
		select {
		case jobs <- k:
			carry -= float64(k)
		default:
			dropped++ // every producer is busy: the backlog shows as a lower achieved rate
		}
	}
	ticker.Stop()
	close(jobs)
	wg.Wait()
	return producerStats{Messages: seq.Load(), Txs: txs.Load(), Dropped: dropped, Elapsed: time.Since(start)}, prodErr
}

// produce commits one business row and k events, and records the commit time of each event
// committed after the warm-up.
func produce(ctx context.Context, db *sql.DB, store *outbox.Store, raw rawOps, seq *atomic.Int64, k int,
	warmupTo time.Time, record func(ids []uuid.UUID, at time.Time)) error {
	first := int(seq.Add(int64(k))) - k
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := raw.insertBusiness(ctx, tx, first); err != nil {
		return err
	}
	msgs := make([]outbox.Message, k)
	for j := range msgs {
		msgs[j] = message(first + j)
	}
	rs, err := store.EnqueueBatch(ctx, tx, msgs)
	if err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	now := time.Now()
	if now.Before(warmupTo) {
		return nil
	}
	ids := make([]uuid.UUID, len(rs))
	for i, x := range rs {
		ids[i] = x.ID
	}
	record(ids, now)
	return nil
}

// quantile of sorted xs, nearest rank.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// enqueueOne commits one message in a transaction of its own and returns its id.
func enqueueOne(ctx context.Context, db *sql.DB, store *outbox.Store, m outbox.Message) (uuid.UUID, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return uuid.Nil, err
	}
	defer tx.Rollback()
	res, err := store.Enqueue(ctx, tx, m)
	if err != nil {
		return uuid.Nil, err
	}
	return res.ID, tx.Commit()
}

// waitFor polls cond until it holds, or returns an error after timeout.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(5 * time.Millisecond) {
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", timeout)
		}
	}
	return nil
}
