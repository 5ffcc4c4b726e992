package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
)

// logLease is the insert lease of the log-delivery runs: how long a row is the log
// reader's before polling may take it over.
const logLease = 30 * time.Second

// logReaderFunc builds the consumer of a log-delivery latency run on store: the log reader
// and a polling Publisher beside it (which owns retries, and rows whose lease ran out), as
// they are deployed.
type logReaderFunc func(store *outbox.Store, tr outbox.Transport) (logConsumer, error)

// logConsumer is a log reader with its polling Publisher: run ends with its context,
// delivered counts what both delivered, and reading is whether the reader follows the
// log now (every transaction that commits from then on is read from it).
type logConsumer struct {
	run       func(ctx context.Context) error
	delivered func() int64
	reading   func() bool
}

// besidePolling makes the consumer of a log reader, whose run is readerRun and whose
// stats are readerStats, and of a polling Publisher on the same store.
func besidePolling(cfg config, store *outbox.Store, tr outbox.Transport, readerRun func(context.Context) error,
	readerStats func() (delivered, retried, dead int64, reading bool)) (logConsumer, error) {
	pub, err := outbox.NewPublisher(store, tr, outbox.PublisherOptions{Scope: outbox.Scope{Namespace: benchNamespace},
		BatchSize: cfg.Batch, Logger: discard})
	if err != nil {
		return logConsumer{}, err
	}
	run := func(ctx context.Context) error {
		done := make(chan error, 1)
		go func() { done <- pub.Run(ctx) }()
		err := readerRun(ctx)
		if perr := <-done; err == nil {
			err = perr
		}
		if _, retried, dead, _ := readerStats(); err == nil && retried+dead > 0 {
			err = fmt.Errorf("log reader settled %d retries and %d dead letters from a transport that never fails", retried, dead)
		}
		return err
	}
	delivered := func() int64 { d, _, _, _ := readerStats(); return d + pub.Stats().Delivered }
	reading := func() bool { _, _, _, r := readerStats(); return r }
	return logConsumer{run: run, delivered: delivered, reading: reading}, nil
}

// logDeliveryResult is scenario 19: delivery from the log against polling, on a private
// server with the log on, producers in another process.
type logDeliveryResult struct {
	Server string `json:"server"`
	// Sustained is the highest offered rate each mode held (p99 <= 50 ms, everything
	// published, steady), by mode ("poll", "log"), and SustainedVsPoll log ÷ poll.
	Sustained       map[string]float64 `json:"sustained_rate"`
	SustainedVsPoll float64            `json:"log_vs_poll_sustained"`
	// ProducersAlone is the highest step rate the producers reached (at least 0.9 of it)
	// with no publisher running, over the steps the modes were tried at: no mode can hold a
	// rate the producers cannot offer, so log ÷ poll cannot pass ProducersAlone ÷ poll.
	ProducersAlone float64 `json:"producers_alone_rate"`
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
	// WALBytes is the write-ahead log written per event, the INSERT's included:
	// PostgreSQL's WAL (pg_current_wal_insert_lsn), MariaDB's InnoDB redo log
	// (Innodb_lsn_current).
	WALBytes float64 `json:"wal_bytes_per_event"`
	// BinlogBytes is MariaDB's binlog written per event (the file sizes of SHOW BINARY
	// LOGS), the log its reader follows; PostgreSQL's reader follows the WAL.
	BinlogBytes float64 `json:"binlog_bytes_per_event,omitempty"`
	// Updates is the row updates per event beyond its INSERT. PostgreSQL: the outbox
	// table's (pg_stat_user_tables n_tup_upd), the claim and the settle when polled, the
	// settle alone from the log. MariaDB: every table's (Handler_update), so also the
	// reader's position row, written at most once per PositionInterval (10 s).
	Updates float64 `json:"updates_per_event"`
	// CPUms is the server processes' user and system CPU per event, the producers'
	// transactions included.
	CPUms float64 `json:"server_cpu_ms_per_event"`
}

// logServer is the private server of a log-delivery run, with the bench database on it.
type logServer interface {
	// counters reads what the server has spent so far.
	counters(ctx context.Context) (logCounters, error)
	// quiesce waits until the counters include the work of a window's connections, which
	// may report theirs only as they close.
	quiesce(ctx context.Context) error
}

// logCounters are a server's cumulative counters; a window's costs are their differences.
type logCounters struct {
	WAL, Binlog float64 // bytes
	Updates     int64   // rows
	CPU         float64 // seconds
}

// logRig is what a log-delivery run needs of one database: a private server with its log
// on, the bench database on it (b), and its log reader.
type logRig struct {
	logServer
	b      backend
	reader logReaderFunc
	about  string
	stop   func()
}

// runLogDelivery measures scenario 19 on PostgreSQL (logDeliveryPostgres) or MariaDB
// (logDeliveryMariaDB): a private server, because the shared one's log settings cannot
// change without a restart, with the durability settings of a default install.
func runLogDelivery(ctx context.Context, cfg config, b backend, res *backendResult) error {
	var start func(context.Context, config, backend) (*logRig, error)
	switch b.name() {
	case "postgres":
		start = logDeliveryPostgres
	case "mysql":
		start = logDeliveryMariaDB
	default:
		logf("%s: log delivery: measured on PostgreSQL and MariaDB only", b.name())
		return nil
	}
	rig, err := start(ctx, cfg, b)
	if err != nil {
		return fmt.Errorf("log delivery: private server: %w", err)
	}
	defer rig.stop()
	lb := rig.b
	// The reader must have its place in the log before the first window: a row committed
	// before it would wait out its lease and be polled.
	if err := primeReader(ctx, lb, rig.reader); err != nil {
		return err
	}
	r := &logDeliveryResult{Sustained: map[string]float64{}, runs: map[string][]cost{}, Server: rig.about}
	c := cfg
	modeCfg := func(mode string) config {
		m := c
		if mode == "log" {
			m.logReader = rig.reader
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
			m.window = w.hook(ctx, rig)
			lr, err := latency(ctx, m, lb, runs[i].rate, 0, false, false, true)
			if err != nil {
				return err
			}
			cst, err := w.finish(ctx, rig)
			if err != nil {
				return err
			}
			r.runs[runs[i].mode] = append(r.runs[runs[i].mode], cst)
			logf("%s: log delivery (%s, %.0f msg/s from another process): p50 %.2fms p99 %.2fms, %d messages, %d unpublished; per event %s",
				lb.name(), runs[i].mode, runs[i].rate, lr.P50, lr.P99, lr.Messages, lr.Unpublished, cst.describe())
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
	producersOn := true
	step := func(mode string, rate float64) (bool, error) {
		var (
			lr latencyResult
			ok bool
		)
		for try := 0; try < 2 && !ok; try++ {
			var err error
			if lr, err = latency(ctx, modeCfg(mode), lb, rate, 0, false, false, true); err != nil {
				return false, err
			}
			lr.Kind = "sustained"
			r.Steps = append(r.Steps, logLatency{Mode: mode, latencyResult: lr})
			ok = held(lr)
		}
		logf("%s: log delivery sustained (%s) at %.0f msg/s: achieved %.0f, p50 %.1fms p99 %.1fms, %d unpublished, steady %v: held %v",
			lb.name(), mode, rate, lr.AchievedRate, lr.P50, lr.P99, lr.Unpublished, lr.Steady, ok)
		return ok, nil
	}
	for rate := cfg.SustainStart; (on["poll"] || on["log"]) && rate <= cfg.SustainMax; rate = math.Round(rate * 1.5) {
		for _, mode := range modes {
			if !on[mode] {
				continue
			}
			ok, err := step(mode, rate)
			if err != nil {
				return err
			}
			if ok {
				r.Sustained[mode] = rate
			} else {
				on[mode] = false
			}
		}
		if producersOn {
			// As the polling mode produces: rows under the log's lease would wait in the
			// slot for the next window's reader, which would find them gone.
			achieved, err := producersAlone(ctx, modeCfg("poll"), lb, rate)
			if err != nil {
				return err
			}
			logf("%s: producers alone at %.0f msg/s: achieved %.0f", lb.name(), rate, achieved)
			if achieved >= 0.9*rate {
				r.ProducersAlone = rate
			} else {
				producersOn = false
			}
		}
	}
	// Between the last rate a mode held and the one it missed, the step halfway (× 1.22):
	// with steps of × 1.5 alone, two modes a fifth apart could read as equal.
	for _, mode := range modes {
		if held := r.Sustained[mode]; held > 0 && !on[mode] {
			mid := math.Round(held * math.Sqrt(1.5))
			ok, err := step(mode, mid)
			if err != nil {
				return err
			}
			if ok {
				r.Sustained[mode] = mid
			}
		}
	}
	if p := r.Sustained["poll"]; p > 0 {
		r.SustainedVsPoll = r.Sustained["log"] / p
	}
	res.LogDelivery = r
	return nil
}

// producersAlone runs the producers of a sustained step at rate with no publisher, on an
// emptied table, and returns the rate they achieved.
func producersAlone(ctx context.Context, cfg config, b backend, rate float64) (float64, error) {
	if err := b.reset(ctx, mainTable); err != nil {
		return 0, err
	}
	ps, err := produceInProcess(ctx, cfg, b, rate, func([]uuid.UUID, time.Time) {})
	if err != nil {
		return 0, err
	}
	return float64(ps.Messages) / ps.Elapsed.Seconds(), nil
}

// primeReader runs a log reader until it follows the log (PostgreSQL: its slot exists;
// MariaDB: its position is stored), then stops it.
func primeReader(ctx context.Context, b backend, reader logReaderFunc) error {
	store, err := outbox.New(b.admin(), b.dialect(), outbox.Options{LogLease: logLease})
	if err != nil {
		return err
	}
	lc, err := reader(store, outbox.TransportFunc(func(context.Context, []outbox.Delivery) []error { return nil }))
	if err != nil {
		return err
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- lc.run(rctx) }()
	defer func() { stop(); <-done }()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if lc.reading() {
			return nil
		}
		select {
		case err := <-done:
			done <- err // for the deferred receive
			return fmt.Errorf("log reader stopped before it followed the log: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
	}
	return fmt.Errorf("log reader did not follow the log within a minute")
}

// costWindow reads the server's counters as a latency window's producers start, as its
// messages are drained, and once its connections have reported theirs (quiesce).
type costWindow struct {
	c0, c1            logCounters
	started, finished bool
	err               error
}

func (w *costWindow) hook(ctx context.Context, srv logServer) func(bool) {
	return func(start bool) {
		c, err := srv.counters(ctx)
		if err != nil && w.err == nil {
			w.err = err
		}
		if start {
			w.c0, w.started = c, true
			return
		}
		w.c1, w.finished = c, true
	}
}

// finish waits until the window's connections have reported their counters and returns
// its costs: the log bytes and CPU up to the drain, the row updates up to now.
func (w *costWindow) finish(ctx context.Context, rig *logRig) (cost, error) {
	if w.err != nil {
		return cost{}, w.err
	}
	if !w.started || !w.finished {
		return cost{}, fmt.Errorf("cost window not observed")
	}
	if err := rig.quiesce(ctx); err != nil {
		return cost{}, err
	}
	late, err := rig.counters(ctx)
	if err != nil {
		return cost{}, err
	}
	var c cost
	if err := rig.b.admin().QueryRowContext(ctx, `SELECT COUNT(*) FROM `+mainTable).Scan(&c.Events); err != nil {
		return c, err
	}
	if c.Events == 0 {
		return c, fmt.Errorf("no events in the window")
	}
	n := float64(c.Events)
	c.WALBytes, c.BinlogBytes = (w.c1.WAL-w.c0.WAL)/n, (w.c1.Binlog-w.c0.Binlog)/n
	c.Updates, c.CPUms = float64(late.Updates-w.c0.Updates)/n, (w.c1.CPU-w.c0.CPU)*1000/n
	return c, nil
}

func (c cost) describe() string {
	s := fmt.Sprintf("%.0f WAL bytes, ", c.WALBytes)
	if c.BinlogBytes > 0 {
		s += fmt.Sprintf("%.0f binlog bytes, ", c.BinlogBytes)
	}
	return s + fmt.Sprintf("%.2f updates, %.3f ms server CPU", c.Updates, c.CPUms)
}

// groupCPU is the user and system CPU, in seconds, of the processes of a server whose
// leader's pid is the first line of pidFile (postmaster.pid, mysqld.pid): the live ones
// of its process group, and the exited children the leader has reaped, so that a
// PostgreSQL backend that ends inside a window still counts. MariaDB is one process; its
// threads' times are in the process's.
func groupCPU(pidFile string) (float64, error) {
	raw, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, err
	}
	pgid := strings.TrimSpace(strings.SplitN(string(raw), "\n", 2)[0])
	procs, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return 0, err
	}
	var total time.Duration
	for _, p := range procs {
		f := procStat(p)
		if len(f) < 15 || f[2] != pgid { // f[2] is the process group
			continue
		}
		total += ticks(f[11], f[12]) // utime, stime
		if filepath.Base(filepath.Dir(p)) == pgid {
			total += ticks(f[13], f[14]) // cutime, cstime: reaped children
		}
	}
	return total.Seconds(), nil
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
		BinlogBytes: pick(func(c cost) float64 { return c.BinlogBytes }),
		Updates:     pick(func(c cost) float64 { return c.Updates }), CPUms: pick(func(c cost) float64 { return c.CPUms })}
}

// metrics adds the scenario's JSON lines.
func (r *logDeliveryResult) metrics(add func(string, float64)) {
	add("log_sustained_rate", r.Sustained["log"])
	add("log_sustained_rate_poll", r.Sustained["poll"])
	if r.SustainedVsPoll > 0 {
		add("log_vs_poll_sustained", r.SustainedVsPoll)
	}
	add("log_producers_alone_rate", r.ProducersAlone)
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
		if c.BinlogBytes > 0 {
			add("log_binlog_bytes_per_event"+suffix, c.BinlogBytes)
		}
		add("log_updates_per_event"+suffix, c.Updates)
		add("log_server_cpu_ms_per_event"+suffix, c.CPUms)
	}
}
