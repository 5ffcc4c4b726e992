package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/outboxgo/outbox"
	outboxpglog "github.com/outboxgo/outbox/logrepl/pglog"
	"github.com/outboxgo/outbox/outboxtest/pgserver"
)

// logLease is the insert lease of the log-delivery runs: how long a row is the log
// reader's before polling may take it over.
const logLease = 30 * time.Second

// logReaderFunc builds the consumer of a log-delivery latency run on store: the log reader
// and a polling Publisher beside it (which owns retries, and rows whose lease ran out), as
// they are deployed. delivered counts both.
type logReaderFunc func(store *outbox.Store, tr outbox.Transport) (run func(ctx context.Context) error, delivered func() int64, err error)

// logDeliveryResult is scenario 19: delivery from the log against polling, on a private
// server with the log on, producers in another process.
type logDeliveryResult struct {
	Server string `json:"server"`
	// Sustained is the highest offered rate each mode held (p99 <= 50 ms, everything
	// published, steady), by mode ("poll", "log"), and SustainedVsPoll log ÷ poll.
	Sustained       map[string]float64 `json:"sustained_rate"`
	SustainedVsPoll float64            `json:"log_vs_poll_sustained"`
	// Latency is commit-to-publish at fixed rates, each mode, medians of the rounds.
	Latency []logLatency `json:"latency"`
	// Costs are what the server spent per event in the fixed-rate windows, by mode.
	Costs []logCost         `json:"costs"`
	Steps []logLatency      `json:"sustained_steps"`
	runs  map[string][]cost // every window's costs, by mode
}

type logLatency struct {
	Mode string `json:"mode"`
	latencyResult
}

// logCost is what the server spent per delivered event, medians over the windows.
type logCost struct {
	Mode string `json:"mode"`
	cost
}

type cost struct {
	Events int64 `json:"events"`
	// WALBytes is the WAL written per event (pg_current_wal_insert_lsn), the INSERT's
	// included.
	WALBytes float64 `json:"wal_bytes_per_event"`
	// Updates is the outbox table's row updates per event (pg_stat_user_tables
	// n_tup_upd): the claim and the settle when polled, the settle alone from the log.
	Updates float64 `json:"updates_per_event"`
	// CPUms is the server processes' user and system CPU per event, the producers'
	// transactions included.
	CPUms float64 `json:"server_cpu_ms_per_event"`
}

// runLogDelivery measures scenario 19 on PostgreSQL: a private server with
// wal_level=logical (the shared one cannot change it without a restart) and the durability
// settings of a default install.
func runLogDelivery(ctx context.Context, cfg config, b backend, res *backendResult) error {
	if b.name() != "postgres" {
		logf("%s: log delivery: measured on PostgreSQL only", b.name())
		return nil
	}
	srv, err := pgserver.Start("wal_level=logical", "shared_buffers=128MB", "max_wal_size=1GB")
	if err != nil {
		return fmt.Errorf("log delivery: private server: %w", err)
	}
	defer srv.Stop()
	lb := &pgBackend{dsn: srv.DSN("postgres")}
	if err := lb.setup(ctx); err != nil {
		return err
	}
	defer lb.teardown()
	slot := "bench_" + lb.dbName
	defer func() {
		_, _ = lb.server.ExecContext(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
	}()
	reader := func(store *outbox.Store, tr outbox.Transport) (func(context.Context) error, func() int64, error) {
		lp, err := outboxpglog.New(store, tr, outboxpglog.Options{Scope: outbox.Scope{Namespace: benchNamespace},
			ConnString: lb.benchDSN, Slot: slot, BatchSize: cfg.Batch, Logger: discard})
		if err != nil {
			return nil, nil, err
		}
		pub, err := outbox.NewPublisher(store, tr, outbox.PublisherOptions{Scope: outbox.Scope{Namespace: benchNamespace},
			BatchSize: cfg.Batch, Logger: discard})
		if err != nil {
			return nil, nil, err
		}
		run := func(ctx context.Context) error {
			done := make(chan error, 1)
			go func() { done <- pub.Run(ctx) }()
			err := lp.Run(ctx)
			if perr := <-done; err == nil {
				err = perr
			}
			if st := lp.Stats(); err == nil && st.Retried+st.Dead > 0 {
				err = fmt.Errorf("log reader settled %d retries and %d dead letters from a transport that never fails", st.Retried, st.Dead)
			}
			return err
		}
		return run, func() int64 { return lp.Stats().Delivered + pub.Stats().Delivered }, nil
	}
	// The slot must exist before the first window: a row committed before it would wait
	// out its lease and be polled.
	if err := createSlot(ctx, lb, slot, reader); err != nil {
		return err
	}
	r := &logDeliveryResult{Sustained: map[string]float64{}, runs: map[string][]cost{},
		Server: "private PostgreSQL, wal_level=logical, fsync and synchronous_commit on, shared_buffers 128MB"}
	c := cfg
	modeCfg := func(mode string) config {
		m := c
		if mode == "log" {
			m.logReader = reader
		}
		return m
	}
	modes := []string{"poll", "log"}

	// Fixed rates, producer in another process, modes alternated and rotated per round.
	type fixed struct {
		mode string
		rate float64
	}
	var runs []fixed
	for _, rate := range []float64{100, 1000} {
		for _, mode := range modes {
			runs = append(runs, fixed{mode, rate})
		}
	}
	rounds := make([][]latencyResult, len(runs))
	for round := range max(1, cfg.LatencyRounds) {
		for k := range runs {
			i := (k + round) % len(runs)
			m := modeCfg(runs[i].mode)
			var w costWindow
			m.window = w.hook(ctx, lb, srv)
			lr, err := latency(ctx, m, lb, runs[i].rate, 0, false, false, true)
			if err != nil {
				return err
			}
			cst, err := w.finish(ctx, lb)
			if err != nil {
				return err
			}
			r.runs[runs[i].mode] = append(r.runs[runs[i].mode], cst)
			logf("postgres: log delivery (%s, %.0f msg/s from another process): p50 %.2fms p99 %.2fms, %d messages, %d unpublished; per event %.0f WAL bytes, %.2f updates, %.3f ms server CPU",
				runs[i].mode, runs[i].rate, lr.P50, lr.P99, lr.Messages, lr.Unpublished, cst.WALBytes, cst.Updates, cst.CPUms)
			rounds[i] = append(rounds[i], lr)
		}
	}
	for i, rs := range rounds {
		r.Latency = append(r.Latency, logLatency{Mode: runs[i].mode, latencyResult: medianLatency(rs)})
	}
	for _, mode := range modes {
		r.Costs = append(r.Costs, logCost{Mode: mode, cost: medianCost(r.runs[mode])})
	}

	// Sustained: the offered rate raised by half until a mode no longer holds, modes
	// alternated at each rate; a rate that fails is tried once more before it counts.
	c.LatencyDur = cfg.SustainDur
	on := map[string]bool{"poll": true, "log": true}
	for rate := cfg.SustainStart; (on["poll"] || on["log"]) && rate <= cfg.SustainMax; rate = math.Round(rate * 1.5) {
		for _, mode := range modes {
			if !on[mode] {
				continue
			}
			var (
				lr latencyResult
				ok bool
			)
			for try := 0; try < 2 && !ok; try++ {
				var err error
				if lr, err = latency(ctx, modeCfg(mode), lb, rate, 0, false, false, true); err != nil {
					return err
				}
				lr.Kind = "sustained"
				r.Steps = append(r.Steps, logLatency{Mode: mode, latencyResult: lr})
				ok = held(lr)
			}
			logf("postgres: log delivery sustained (%s) at %.0f msg/s: achieved %.0f, p50 %.1fms p99 %.1fms, %d unpublished, steady %v: held %v",
				mode, rate, lr.AchievedRate, lr.P50, lr.P99, lr.Unpublished, lr.Steady, ok)
			if ok {
				r.Sustained[mode] = rate
			} else {
				on[mode] = false
			}
		}
	}
	if p := r.Sustained["poll"]; p > 0 {
		r.SustainedVsPoll = r.Sustained["log"] / p
	}
	res.LogDelivery = r
	return nil
}

// createSlot runs a log reader until its slot exists, then stops it.
func createSlot(ctx context.Context, b *pgBackend, slot string, reader logReaderFunc) error {
	store, err := outbox.New(b.db, outbox.Postgres(), outbox.Options{LogLease: logLease})
	if err != nil {
		return err
	}
	run, _, err := reader(store, outbox.TransportFunc(func(context.Context, []outbox.Delivery) []error { return nil }))
	if err != nil {
		return err
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(rctx) }()
	defer func() { stop(); <-done }()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var n int
		if err := b.server.QueryRowContext(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&n); err != nil {
			return err
		}
		if n == 1 {
			return nil
		}
		select {
		case err := <-done:
			return fmt.Errorf("log reader stopped before creating its slot: %v", err)
		default:
		}
	}
	return fmt.Errorf("log reader did not create slot %s within a minute", slot)
}

// costWindow reads the server's counters as a latency window's producers start, as its
// messages are drained, and once its pools are closed (a backend reports its table
// counters when it exits, at the latest).
type costWindow struct {
	srv               *pgserver.Server
	wal0, wal1        string
	cpu0, cpu1        float64
	upd0              int64
	started, finished bool
	err               error
}

func (w *costWindow) hook(ctx context.Context, b *pgBackend, srv *pgserver.Server) func(bool) {
	w.srv = srv
	return func(start bool) {
		var wal string
		if err := b.server.QueryRowContext(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&wal); err != nil && w.err == nil {
			w.err = err
		}
		cpu, err := serverCPU(srv)
		if err != nil && w.err == nil {
			w.err = err
		}
		if start {
			w.wal0, w.cpu0, w.started = wal, cpu, true
			if err := b.db.QueryRowContext(ctx, `SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = $1`, mainTable).Scan(&w.upd0); err != nil && w.err == nil {
				w.err = err
			}
			return
		}
		w.wal1, w.cpu1, w.finished = wal, cpu, true
	}
}

// finish waits until the window's backends have gone and returns its costs.
func (w *costWindow) finish(ctx context.Context, b *pgBackend) (cost, error) {
	if w.err != nil {
		return cost{}, w.err
	}
	if !w.started || !w.finished {
		return cost{}, fmt.Errorf("cost window not observed")
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var backends int
		if err := b.server.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend'`,
			b.dbName).Scan(&backends); err != nil {
			return cost{}, err
		}
		if backends <= b.db.Stats().OpenConnections { // the admin pool's own
			break
		}
	}
	var c cost
	var upd1 int64
	var walBytes float64
	if err := b.db.QueryRowContext(ctx, `SELECT n_tup_upd, (SELECT count(*) FROM `+mainTable+`) FROM pg_stat_user_tables WHERE relname = $1`, mainTable).Scan(&upd1, &c.Events); err != nil {
		return c, err
	}
	if err := b.server.QueryRowContext(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)`, w.wal1, w.wal0).Scan(&walBytes); err != nil {
		return c, err
	}
	if c.Events == 0 {
		return c, fmt.Errorf("no events in the window")
	}
	n := float64(c.Events)
	c.WALBytes, c.Updates, c.CPUms = walBytes/n, float64(upd1-w.upd0)/n, (w.cpu1-w.cpu0)*1000/n
	return c, nil
}

// serverCPU is the user and system CPU, in seconds, of the private server's processes: the
// live ones of its postmaster's process group, and the exited backends the postmaster has
// reaped (its children's times), so that a backend that ends inside a window still counts.
func serverCPU(srv *pgserver.Server) (float64, error) {
	pidFile, err := os.ReadFile(filepath.Join(srv.Dir(), "data", "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	pgid := strings.SplitN(string(pidFile), "\n", 2)[0]
	procs, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return 0, err
	}
	const ticks = 100 // USER_HZ on Linux
	var total float64
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the process exited
		}
		// Fields after the command name, which is in parentheses and may hold spaces.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if len(f) < 13 || f[2] != pgid { // f[2] is the process group
			continue
		}
		for _, k := range []int{11, 12} { // utime, stime
			v, _ := strconv.ParseFloat(f[k], 64)
			total += v / ticks
		}
		if filepath.Base(filepath.Dir(p)) == pgid && len(f) >= 15 {
			for _, k := range []int{13, 14} { // cutime, cstime: reaped children
				v, _ := strconv.ParseFloat(f[k], 64)
				total += v / ticks
			}
		}
	}
	return total, nil
}

func medianCost(cs []cost) cost {
	if len(cs) == 0 {
		return cost{}
	}
	pick := func(f func(cost) float64) float64 {
		xs := make([]float64, len(cs))
		for i, c := range cs {
			xs[i] = f(c)
		}
		return median(xs)
	}
	var events int64
	for _, c := range cs {
		events += c.Events
	}
	return cost{Events: events, WALBytes: pick(func(c cost) float64 { return c.WALBytes }),
		Updates: pick(func(c cost) float64 { return c.Updates }), CPUms: pick(func(c cost) float64 { return c.CPUms })}
}

// metrics adds the scenario's JSON lines.
func (r *logDeliveryResult) metrics(add func(string, float64)) {
	add("log_sustained_rate", r.Sustained["log"])
	add("log_sustained_rate_poll", r.Sustained["poll"])
	if r.SustainedVsPoll > 0 {
		add("log_vs_poll_sustained", r.SustainedVsPoll)
	}
	for _, l := range r.Latency {
		suffix := ""
		if l.Mode == "poll" {
			suffix = "_poll"
		}
		add(fmt.Sprintf("log_latency_p50_ms_at_%.0f%s", l.TargetRate, suffix), l.P50)
		add(fmt.Sprintf("log_latency_p99_ms_at_%.0f%s", l.TargetRate, suffix), l.P99)
	}
	for _, c := range r.Costs {
		suffix := ""
		if c.Mode == "poll" {
			suffix = "_poll"
		}
		add("log_wal_bytes_per_event"+suffix, c.WALBytes)
		add("log_updates_per_event"+suffix, c.Updates)
		add("log_server_cpu_ms_per_event"+suffix, c.CPUms)
	}
}
