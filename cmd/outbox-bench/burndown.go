package main

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxgo/outbox"
)

// burnRun is one drain of preloaded rows.
type burnRun struct {
	Kind    string  `json:"kind"` // library or raw
	Table   string  `json:"table"`
	Batch   int     `json:"batch"`
	Workers int     `json:"workers"`
	N       int     `json:"n"`
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"rows_per_second"`
	// Commits counts every transaction of the run's pool from start to stop.
	Commits commitCount `json:"commits"`
	// Raw runs know their own statements: claims (each one transaction) and acks.
	Claims int64 `json:"claims,omitempty"`
	Acks   int64 `json:"acks,omitempty"`
	// Library runs report the publisher's counters.
	Stats *outbox.PublisherStats `json:"publisher_stats,omitempty"`
	// StartupSeconds and SteadyRate, for library runs of a drainSpec with startup set: the
	// time from Run to the start of the Publisher's first claim (its Store.Check and what
	// else it does once), and the rate counted from then.
	StartupSeconds float64 `json:"startup_seconds,omitempty"`
	SteadyRate     float64 `json:"rows_per_second_from_first_claim,omitempty"`
}

// burnResult is scenario 3: the headline pairs and the commit counts.
type burnResult struct {
	Batch   int       `json:"batch"`
	Workers int       `json:"workers"`
	N       int       `json:"n"`
	Library sample    `json:"library"`
	Raw     sample    `json:"raw"`
	Ratio   float64   `json:"library_vs_raw"`
	Runs    []burnRun `json:"runs"`
	// CommitsPerMessage and CommitsPerBatch are the library's (median over runs).
	CommitsPerMessage    float64 `json:"commits_per_message"`
	CommitsPerBatch      float64 `json:"commits_per_batch"`
	RawCommitsPerBatch   float64 `json:"raw_commits_per_batch"`
	RawCommitsCheck      string  `json:"raw_commits_check"`
	LibraryCommitsDetail string  `json:"library_commits_detail"`
}

// sweepPoint is one batch size of the burn-down sweep (the plot).
type sweepPoint struct {
	Batch   int     `json:"batch"`
	N       int     `json:"n"`
	Library sample  `json:"library"`
	Raw     sample  `json:"raw"`
	Ratio   float64 `json:"library_vs_raw"`
}

// preload inserts n pending rows into table with the fastest raw form, in chunks.
func preload(ctx context.Context, b backend, table string, n int) error {
	return preloadRows(ctx, b.admin(), b.raw(table), n, payloads)
}

// preloadRows inserts n pending rows with payloads from set through r's fastest form, in
// chunks.
func preloadRows(ctx context.Context, db *sql.DB, r relay, n int, set [][]byte) error {
	forms := bestForms(r)
	form, chunk := forms[len(forms)-1], 1000
	if form == "unnest" {
		chunk = 5000
	}
	for lo := 0; lo < n; lo += chunk {
		rows := rawRowsOf(lo, min(chunk, n-lo), set)
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := r.insertMany(ctx, tx, form, rows); err != nil {
			_ = tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return nil
}

var discard = slog.New(slog.DiscardHandler)

// burn preloads n pending rows into table and drains them with the library's publisher
// (kind "library") or the raw claim + ack loop (kind "raw"), batch rows per claim on
// workers goroutines. The clock runs from the start of the drain until the n-th row is
// acknowledged; the commits are counted over the whole life of the run's pool.
func burn(ctx context.Context, b backend, kind, table string, n, batch, workers int) (burnRun, error) {
	return drain(ctx, b, drainSpec{kind: kind, table: table, n: n, batch: batch, workers: workers})
}

// drainSpec is one drain of burn's kind, with the rows and the table's SQL made explicit.
type drainSpec struct {
	kind, table       string
	n, batch, workers int
	// payloads are the preloaded rows' payloads; nil means the standard ones (payloads).
	payloads [][]byte
	// relay, when set, is the table's SQL for the preload and the raw loop: a table of
	// another shape than the library's. Only kind "raw" drains such a table.
	relay relay
	// publish is how long publishing one batch takes (a broker's round trip): the
	// library's transport and the raw loop, between its claim and its ack, wait that long.
	publish time.Duration
	// startup, for the library, also times the Publisher's start-up (burnRun.StartupSeconds)
	// through a ClaimObserver, which the run then carries.
	startup bool
}

// drain is burn with the rows and the table's SQL of s.
func drain(ctx context.Context, b backend, s drainSpec) (burnRun, error) {
	kind, table, n, batch, workers := s.kind, s.table, s.n, s.batch, s.workers
	run := burnRun{Kind: kind, Table: table, Batch: batch, Workers: workers, N: n}
	set, r := s.payloads, s.relay
	if set == nil {
		set = payloads
	}
	if r == nil {
		r = b.raw(table)
	} else if kind != kindRaw {
		return run, fmt.Errorf("a %s drain needs the library's table", kind)
	}
	if err := b.reset(ctx, table); err != nil {
		return run, err
	}
	if err := preloadRows(ctx, b.admin(), r, n, set); err != nil {
		return run, fmt.Errorf("preload: %w", err)
	}
	if err := b.maintain(ctx, table); err != nil {
		return run, err
	}
	deliveredBefore, _, err := countStatus(ctx, b.admin(), table)
	if err != nil {
		return run, err
	}
	finish, err := b.countStart(ctx)
	if err != nil {
		return run, err
	}
	db, counter, err := b.pool(workers + 2)
	if err != nil {
		return run, err
	}
	timeout := time.Duration(max(120, n/200)) * time.Second
	var elapsed time.Duration
	if kind == "library" {
		var first *firstClaim
		if s.startup {
			first = &firstClaim{}
		}
		elapsed, run.Stats, err = burnPublisher(ctx, b, db, table, n, batch, workers, timeout, false, s.publish, first, nil)
		if err == nil && first != nil {
			if t := first.after.Load(); t > 0 && time.Duration(t) < elapsed {
				run.StartupSeconds = time.Duration(t).Seconds()
				run.SteadyRate = float64(n) / (elapsed - time.Duration(t)).Seconds()
			}
		}
	} else {
		var step func(ctx context.Context, worker string) (int, error)
		switch {
		case s.relay != nil:
			step = func(ctx context.Context, worker string) (int, error) {
				return claimAck(ctx, s.relay, db, batch, worker)
			}
		case s.publish > 0 && kind == kindRaw:
			step = func(ctx context.Context, worker string) (int, error) {
				return claimPublishAck(ctx, r, db, batch, worker, s.publish)
			}
		default:
			step, err = stepFor(kind, b, db, table, batch)
		}
		if err == nil {
			elapsed, run.Claims, run.Acks, err = burnLoop(ctx, n, workers, timeout, step)
		}
	}
	cc, cerr := finish(ctx, db, counter)
	if err != nil {
		return run, err
	}
	if cerr != nil {
		return run, fmt.Errorf("counting commits: %w", cerr)
	}
	run.Commits = cc
	run.Seconds = elapsed.Seconds()
	run.Rate = float64(n) / elapsed.Seconds()
	delivered, total, err := countStatus(ctx, b.admin(), table)
	if err != nil {
		return run, err
	}
	if delivered-deliveredBefore != int64(n) || total != delivered {
		return run, fmt.Errorf("%s burn-down left %d of %d rows delivered (%d rows in the table)", kind, delivered-deliveredBefore, n, total)
	}
	return run, nil
}

// firstClaim is a PublisherObserver that records when the first claim of a Run began,
// as the time since start.
type firstClaim struct {
	start time.Time
	after atomic.Int64 // nanoseconds from start to the first StartClaim; 0 until then
}

func (f *firstClaim) StartClaim(ctx context.Context) context.Context {
	if f.after.Load() == 0 {
		f.after.CompareAndSwap(0, int64(max(time.Since(f.start), 1)))
	}
	return ctx
}
func (*firstClaim) EndClaim(context.Context, int, error) {}
func (*firstClaim) StartPublish(ctx context.Context, _ []outbox.Delivery) context.Context {
	return ctx
}
func (*firstClaim) EndPublish(context.Context, []outbox.Delivery, []outbox.AttemptResult) {}
func (*firstClaim) Settled(context.Context, []outbox.Settled)                             {}

// burnPublisher drains n rows of table with a Publisher (in order per partition key when
// ordered is set) whose transport takes publish to publish a batch, and,
// when first is not nil, an observer that times the start of the first claim. With order,
// the transport keeps key order ([outbox.TransportKeyOrder]) and order counts what it
// delivers.
func burnPublisher(ctx context.Context, b backend, db *sql.DB, table string, n, batch, workers int, timeout time.Duration, ordered bool, publish time.Duration, first *firstClaim, order *keyOrder) (time.Duration, *outbox.PublisherStats, error) {
	store, err := outbox.New(db, b.dialect(), outbox.Options{Table: table})
	if err != nil {
		return 0, nil, err
	}
	// The clock stops when the N-th row is acknowledged, which only the publisher's counters
	// tell. Polling them all along would steal the CPU the drain runs on (a poll every
	// 100 µs cost the Publisher up to 19 % against the raw loop, which counts in its own
	// loop), so the transport signals when it has seen N messages, and the counters are
	// polled only for the last batch's settle after that.
	var (
		published    atomic.Int64
		allPublished = make(chan struct{})
		once         sync.Once
	)
	var noop outbox.Transport = outbox.TransportFunc(func(_ context.Context, ds []outbox.Delivery) []error {
		if publish > 0 {
			time.Sleep(publish)
		}
		if order != nil {
			order.see(ds)
		}
		if published.Add(int64(len(ds))) >= int64(n) {
			once.Do(func() { close(allPublished) })
		}
		return nil
	})
	if order != nil {
		noop = keyOrderTransport{noop.(outbox.TransportFunc)}
	}
	opts := outbox.PublisherOptions{
		Scope:     outbox.Scope{Namespace: benchNamespace},
		BatchSize: batch, Concurrency: workers, Logger: discard, Ordered: ordered,
	}
	if first != nil {
		opts.Observer = first
	}
	pub, err := outbox.NewPublisher(store, noop, opts)
	if err != nil {
		return 0, nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	if first != nil {
		first.start = start
	}
	go func() { done <- pub.Run(rctx) }()
	fail := func(why string) (time.Duration, *outbox.PublisherStats, error) {
		cancel()
		err := <-done
		st := pub.Stats()
		return 0, &st, fmt.Errorf("publisher delivered %d of %d rows in %s with %d errors: %s (%v)",
			st.Delivered, n, time.Since(start).Round(time.Millisecond), st.Errors, why, err)
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	select {
	case <-allPublished:
	case err := <-done:
		done <- err
		return fail("Run returned")
	case <-deadline.C:
		return fail("timed out")
	case <-ctx.Done():
		return fail("cancelled")
	}
	var elapsed time.Duration
	for {
		st := pub.Stats()
		if st.Delivered >= int64(n) {
			elapsed = time.Since(start)
			break
		}
		if st.Errors > 0 || time.Since(start) > timeout || ctx.Err() != nil {
			return fail("settling the last batch")
		}
		time.Sleep(50 * time.Microsecond)
	}
	cancel()
	if err := <-done; err != nil {
		return 0, nil, err
	}
	st := pub.Stats()
	if st.Errors > 0 {
		return 0, &st, fmt.Errorf("publisher reported %d errors", st.Errors)
	}
	return elapsed, &st, nil
}

// Burn-down kinds besides "library" (the Publisher): the raw relay, and for the breakdown
// the library's Store calls without a Publisher and the two mixtures of library and raw
// statements.
const (
	kindRaw          = "raw"
	kindStore        = "store"
	kindLibClaimOnly = "library claim + raw ack"
	kindLibAckOnly   = "raw claim + library ack"
	kindGuarded      = "raw claim + guarded ack"
)

// stepFor returns one claim-publish-ack step of kind.
func stepFor(kind string, b backend, db *sql.DB, table string, batch int) (func(ctx context.Context, worker string) (int, error), error) {
	r := b.raw(table)
	store, err := outbox.New(db, b.dialect(), outbox.Options{Table: table})
	if err != nil {
		return nil, err
	}
	libClaim := func(ctx context.Context, worker string) ([]outbox.Record, error) {
		return store.Claim(ctx, outbox.ClaimOptions{
			Scope: outbox.Scope{Namespace: benchNamespace}, Limit: batch, Lease: outbox.DefaultLease,
			MaxAttempts: maxAttempts, WorkerID: worker,
		})
	}
	switch kind {
	case kindRaw:
		return func(ctx context.Context, worker string) (int, error) { return claimAck(ctx, r, db, batch, worker) }, nil
	case kindStore:
		return func(ctx context.Context, worker string) (int, error) {
			recs, err := libClaim(ctx, worker)
			if err != nil || len(recs) == 0 {
				return 0, err
			}
			leases := make([]outbox.Lease, len(recs))
			for i := range recs {
				leases[i] = recs[i].Lease()
			}
			return len(recs), store.Ack(ctx, leases...)
		}, nil
	case kindLibClaimOnly:
		return func(ctx context.Context, worker string) (int, error) {
			recs, err := libClaim(ctx, worker)
			if err != nil || len(recs) == 0 {
				return 0, err
			}
			ids := make([]any, len(recs))
			for i := range recs {
				ids[i] = r.idArg(recs[i].ID)
			}
			return len(recs), r.ack(ctx, db, ids)
		}, nil
	case kindGuarded:
		return func(ctx context.Context, worker string) (int, error) {
			c, err := r.claim(ctx, db, batch, worker)
			if err != nil || len(c.ids) == 0 {
				return 0, err
			}
			n, err := r.ackGuarded(ctx, db, c.ids, c.token)
			if err == nil && n != len(c.ids) {
				err = fmt.Errorf("guarded ack settled %d of %d rows", n, len(c.ids))
			}
			return len(c.ids), err
		}, nil
	case kindGuardedRaw:
		return func(ctx context.Context, worker string) (int, error) { return guardedStep(ctx, r, db, batch, worker) }, nil
	case kindLibAckOnly:
		return func(ctx context.Context, worker string) (int, error) {
			c, err := r.claim(ctx, db, batch, worker)
			if err != nil || len(c.ids) == 0 {
				return 0, err
			}
			leases := make([]outbox.Lease, len(c.ids))
			for i, id := range c.ids {
				leases[i] = r.leaseOf(id, c.token)
			}
			return len(c.ids), store.Ack(ctx, leases...)
		}, nil
	}
	return nil, fmt.Errorf("unknown burn-down kind %q", kind)
}

// burnLoop runs step on workers goroutines until the rows run out, and returns the time
// until the n-th row was acked and the numbers of claims and acks.
func burnLoop(ctx context.Context, n, workers int, timeout time.Duration, step func(ctx context.Context, worker string) (int, error)) (time.Duration, int64, int64, error) {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var (
		acked, claims, acks atomic.Int64
		wg                  sync.WaitGroup
		mu                  sync.Mutex
		firstErr            error
		end                 time.Time
	)
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			worker := fmt.Sprintf("raw-%d", w)
			for {
				got, err := step(rctx, worker)
				claims.Add(1)
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					cancel()
					return
				}
				if got == 0 {
					return
				}
				acks.Add(1)
				if total := acked.Add(int64(got)); total >= int64(n) && total-int64(got) < int64(n) {
					mu.Lock()
					end = time.Now()
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return 0, 0, 0, firstErr
	}
	if got := acked.Load(); got != int64(n) {
		return 0, 0, 0, fmt.Errorf("loop acked %d of %d rows", got, n)
	}
	return end.Sub(start), claims.Load(), acks.Load(), nil
}

// runBurndown measures the headline pairs, then sweeps the batch sizes for the plot.
func runBurndown(ctx context.Context, cfg config, b backend, res *backendResult) error {
	pair := func(n, batch, rounds int) (lib, raw []burnRun, err error) {
		vs := []variant{
			{name: "raw", run: func(ctx context.Context) (float64, error) {
				r, err := burn(ctx, b, "raw", mainTable, n, batch, cfg.Workers)
				raw = append(raw, r)
				return r.Rate, err
			}},
			{name: "library", run: func(ctx context.Context) (float64, error) {
				r, err := burn(ctx, b, "library", mainTable, n, batch, cfg.Workers)
				lib = append(lib, r)
				return r.Rate, err
			}},
		}
		_, err = alternate(ctx, rounds, vs)
		return lib, raw, err
	}
	// Warm-up: one small drain of each.
	if _, _, err := pair(min(cfg.BurnN, 2000), cfg.Batch, 1); err != nil {
		return err
	}
	lib, raw, err := pair(cfg.BurnN, cfg.Batch, cfg.BurnRounds)
	if err != nil {
		return err
	}
	h := &burnResult{Batch: cfg.Batch, Workers: cfg.Workers, N: cfg.BurnN}
	h.Library, h.Raw = summarize(rates(lib)), summarize(rates(raw))
	h.Ratio = pairedRatio(rates(lib), rates(raw))
	h.Runs = append(append(h.Runs, raw...), lib...)
	batches := float64((cfg.BurnN + cfg.Batch - 1) / cfg.Batch)
	var perMsg, perBatch, rawPerBatch []float64
	for _, r := range lib {
		perMsg = append(perMsg, float64(r.Commits.Server)/float64(r.N))
		perBatch = append(perBatch, float64(r.Commits.Server)/batches)
	}
	for _, r := range raw {
		rawPerBatch = append(rawPerBatch, float64(r.Commits.Server)/batches)
	}
	h.CommitsPerMessage, h.CommitsPerBatch, h.RawCommitsPerBatch = median(perMsg), median(perBatch), median(rawPerBatch)
	if len(raw) > 0 {
		r := raw[0]
		h.RawCommitsCheck = fmt.Sprintf("raw loop issued %d claims + %d acks = %d transactions; counted %d (%s)",
			r.Claims, r.Acks, r.Claims+r.Acks, r.Commits.Server, r.Commits.Check)
	}
	if len(lib) > 0 {
		r := lib[0]
		h.LibraryCommitsDetail = fmt.Sprintf("library: %d batches of %d, counted %d (%s)", int(batches), cfg.Batch, r.Commits.Server, r.Commits.Check)
	}
	res.Burndown = h
	logf("%s: burn-down b=%d w=%d n=%d: library %.0f rows/s, raw %.0f rows/s: %.3f; commits/batch library %.2f raw %.2f",
		b.name(), cfg.Batch, cfg.Workers, cfg.BurnN, h.Library.Median, h.Raw.Median, h.Ratio, h.CommitsPerBatch, h.RawCommitsPerBatch)
	logf("%s: burn-down pairs (library ÷ raw, in run order): %s", b.name(), pairRatios(rates(lib), rates(raw)))
	logf("%s: %s", b.name(), h.RawCommitsCheck)
	logf("%s: %s", b.name(), h.LibraryCommitsDetail)

	for _, size := range cfg.SweepSizes {
		if size == cfg.Batch {
			res.Sweep = append(res.Sweep, sweepPoint{Batch: size, N: cfg.BurnN, Library: h.Library, Raw: h.Raw, Ratio: h.Ratio})
			continue
		}
		n := min(cfg.BurnN, max(3000, 200*size))
		lib, raw, err := pair(n, size, cfg.SweepRounds)
		if err != nil {
			return err
		}
		p := sweepPoint{Batch: size, N: n, Library: summarize(rates(lib)), Raw: summarize(rates(raw)), Ratio: pairedRatio(rates(lib), rates(raw))}
		logf("%s: burn-down sweep b=%d n=%d: library %.0f, raw %.0f rows/s: %.3f", b.name(), size, n, p.Library.Median, p.Raw.Median, p.Ratio)
		res.Sweep = append(res.Sweep, p)
	}
	return nil
}

// pairRatios renders the per-pair ratios whose median pairedRatio reports, so that a run
// shows how far its headline figure can be trusted.
func pairRatios(a, b []float64) string {
	var out []string
	for i := range min(len(a), len(b)) {
		if b[i] > 0 {
			out = append(out, fmt.Sprintf("%.3f", a[i]/b[i]))
		}
	}
	return strings.Join(out, ", ")
}

func rates(runs []burnRun) []float64 {
	out := make([]float64, len(runs))
	for i, r := range runs {
		out[i] = r.Rate
	}
	return out
}

// breakdownResult splits the burn-down gap at the headline batch: each step of the
// library replaced by its raw counterpart, measured in alternation.
type breakdownResult struct {
	Batch int               `json:"batch"`
	N     int               `json:"n"`
	Rates map[string]sample `json:"rates"`
	// VsRaw is each kind's paired ratio to the raw loop.
	VsRaw map[string]float64 `json:"vs_raw"`
}

var breakdownKinds = []string{kindRaw, kindGuarded, kindLibClaimOnly, kindLibAckOnly, kindStore, "library"}

func runBreakdown(ctx context.Context, cfg config, b backend, res *backendResult) error {
	for _, size := range cfg.BreakdownSizes {
		n := min(cfg.BurnN, cfg.BreakdownN)
		var vs []variant
		for _, kind := range breakdownKinds {
			vs = append(vs, variant{name: kind, run: func(ctx context.Context) (float64, error) {
				r, err := burn(ctx, b, kind, mainTable, n, size, cfg.Workers)
				return r.Rate, err
			}})
		}
		got, err := alternate(ctx, cfg.BreakdownRounds, vs)
		if err != nil {
			return err
		}
		br := breakdownResult{Batch: size, N: n, Rates: map[string]sample{}, VsRaw: map[string]float64{}}
		for _, kind := range breakdownKinds {
			br.Rates[kind] = summarize(got[kind])
			br.VsRaw[kind] = pairedRatio(got[kind], got[kindRaw])
			logf("%s: breakdown b=%d: %-24s %7.0f rows/s  %.3f of raw", b.name(), size, kind, br.Rates[kind].Median, br.VsRaw[kind])
		}
		res.Breakdown = append(res.Breakdown, br)
	}
	return nil
}
