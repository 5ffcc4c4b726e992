package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxgo/outbox"
)

// report is everything one run measured.
type report struct {
	Command  string           `json:"command"`
	Config   config           `json:"config"`
	Started  time.Time        `json:"started"`
	Finished time.Time        `json:"finished"`
	Machine  machine          `json:"machine"`
	Backends []*backendResult `json:"backends"`
}

type machine struct {
	Cores      int    `json:"cores"`
	CPU        string `json:"cpu"`
	Memory     string `json:"memory"`
	Kernel     string `json:"kernel"`
	Go         string `json:"go"`
	LoadBefore string `json:"load_before"`
	LoadAfter  string `json:"load_after"`
	Payload    string `json:"payload"`
	// Source is the library's git revision, and the Go files that differed from it.
	Source string `json:"source"`
}

type backendResult struct {
	Backend    string             `json:"backend"`
	Skipped    string             `json:"skipped,omitempty"`
	Error      string             `json:"error,omitempty"`
	Elapsed    string             `json:"elapsed,omitempty"`
	Server     serverInfo         `json:"server"`
	Validation *counterValidation `json:"counter_validation,omitempty"`
	Enqueue    []enqueueResult    `json:"enqueue,omitempty"`
	PgxEnqueue []pgxEnqueueResult `json:"enqueue_pgx_vs_raw_pgx,omitempty"`
	Batch      []batchResult      `json:"batch_enqueue,omitempty"`
	Burndown   *burnResult        `json:"burndown,omitempty"`
	Sweep      []sweepPoint       `json:"burndown_sweep,omitempty"`
	Breakdown  []breakdownResult  `json:"burndown_breakdown,omitempty"`
	Latency    []latencyResult    `json:"latency,omitempty"`
	// SaturatedP99VsRaw is the saturated p99 with default options ÷ the raw loop's, the
	// median of the per-round ratios (SaturatedP99VsRawRounds).
	SaturatedP99VsRaw       float64            `json:"saturated_p99_vs_raw,omitempty"`
	SaturatedP99VsRawRounds []float64          `json:"saturated_p99_vs_raw_rounds,omitempty"`
	Idle                    []idleResult       `json:"latency_after_idle,omitempty"`
	Growth                  *growthResult      `json:"growth,omitempty"`
	Stats                   *statsResult       `json:"stats,omitempty"`
	PurgeBurn               *purgeBurnResult   `json:"purge_burndown,omitempty"`
	Ordered                 *orderedResult     `json:"burndown_ordered,omitempty"`
	ShortDrain              []shortDrainResult `json:"short_drain,omitempty"`
	Delayed                 *delayedResult     `json:"delayed,omitempty"`
	Relay                   *relayResult       `json:"relay,omitempty"`
	Broker                  *brokerResult      `json:"broker,omitempty"`
	Costs                   *costResult        `json:"drain_costs,omitempty"`
	TableCost               *tableCostResult   `json:"table_cost,omitempty"`
	UI                      *uiResult          `json:"ui,omitempty"`
	StoreLoop               []storeLoopResult  `json:"store_loop,omitempty"`
	Guarded                 *guardedResult     `json:"guarded,omitempty"`
	ScaleOut                []scaleOutPoint    `json:"scale_out,omitempty"`
	Sustained               *sustainedResult   `json:"sustained,omitempty"`
	LogDelivery             *logDeliveryResult `json:"log_delivery,omitempty"`
	IdleCost                []idleCostResult   `json:"idle_cost,omitempty"`
}

func describeMachine() machine {
	m := machine{Cores: runtime.NumCPU(), Go: runtime.Version(), LoadBefore: loadAverage()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
				m.Memory = fmt.Sprintf("%.1f GiB", kb/(1<<20))
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + strings.TrimSpace(string(b))
	}
	m.Source = sourceRevision()
	lo, hi, mean := payloadBytes()
	m.Payload = fmt.Sprintf("JSON payloads of %d-%d bytes (mean %d), namespace, topic and partition key set; no tenant, dedupe key or headers", lo, hi, mean)
	return m
}

// sourceRevision describes the checkout the bench was built from, best effort.
func sourceRevision() string {
	rev, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown (no git)"
	}
	out := "git " + strings.TrimSpace(string(rev))
	if st, err := exec.Command("git", "status", "--porcelain", "--", "*.go").Output(); err == nil {
		var dirty []string
		for _, line := range strings.Split(strings.TrimSpace(string(st)), "\n") {
			if f := strings.Fields(line); len(f) == 2 && !strings.HasPrefix(f[1], "cmd/outbox-bench/") && !strings.HasSuffix(f[1], "_test.go") {
				dirty = append(dirty, f[1])
			}
		}
		if len(dirty) > 0 {
			out += " with uncommitted changes to " + strings.Join(dirty, ", ")
		}
	}
	return out
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// metric is one JSON line.
type metric struct {
	Metric  string  `json:"metric"`
	Backend string  `json:"backend"`
	Value   float64 `json:"value"`
}

// target judges a metric.
type target struct {
	metric string
	text   string
	pass   func(v float64) bool
}

var targets = []target{
	{"enqueue_vs_raw_c1", ">= 0.95", func(v float64) bool { return v >= 0.95 }},
	{"enqueue_vs_raw_c8", ">= 0.95", func(v float64) bool { return v >= 0.95 }},
	{"enqueue_vs_business_c8", "(cost of an outbox)", nil},
	{"enqueue_pgx_vs_raw_pgx_c1", ">= 0.95 (pgxv5 on a pgx.Tx)", func(v float64) bool { return v >= 0.95 }},
	{"enqueue_pgx_vs_raw_pgx_c8", ">= 0.95 (pgxv5 on a pgx.Tx)", func(v float64) bool { return v >= 0.95 }},
	{"enqueue_notify_vs_quiet_c8", ">= 0.95 (PostgreSQL NOTIFY)", func(v float64) bool { return v >= 0.95 }},
	{"batch_enqueue_vs_raw", ">= 0.90", func(v float64) bool { return v >= 0.90 }},
	{"burndown_vs_raw", ">= 1.0", func(v float64) bool { return v >= 1.0 }},
	{"commits_per_message", "about 1 per batch", nil}, // judged per batch, see commits_per_batch
	{"commits_per_batch", "<= 1.2", func(v float64) bool { return v <= 1.2 }},
	{"latency_p50_ms_at_100", "<= 10 (one process)", func(v float64) bool { return v <= 10 }},
	{"latency_p99_ms_at_100", "<= 50 (one process)", func(v float64) bool { return v <= 50 }},
	{"latency_p50_ms_at_1000", "<= 10 (one process)", func(v float64) bool { return v <= 10 }},
	{"latency_p99_ms_at_1000", "<= 50 (one process)", func(v float64) bool { return v <= 50 }},
	{"latency_ms_after_idle", "<= 50 (one process)", func(v float64) bool { return v <= 50 }},
	{"latency_p50_ms_at_100_cross", "<= 10 (producer in another process)", func(v float64) bool { return v <= 10 }},
	{"latency_p99_ms_at_100_cross", "<= 50 (producer in another process)", func(v float64) bool { return v <= 50 }},
	{"latency_p50_ms_at_1000_cross", "<= 10 (producer in another process)", func(v float64) bool { return v <= 10 }},
	{"latency_p99_ms_at_1000_cross", "<= 50 (producer in another process)", func(v float64) bool { return v <= 50 }},
	{"latency_ms_after_idle_cross", "<= 50 (producer on another pool)", func(v float64) bool { return v <= 50 }},
	{"idle_statements_per_s", "(an idle publisher, default options)", nil},
	{"idle_server_cpu_pct", "(an idle publisher's database sessions, % of one core)", nil},
	{"idle_statements_per_s_poll10ms", "(polling every 10 ms instead, notify off)", nil},
	{"idle_server_cpu_pct_poll10ms", "(same)", nil},
	{"saturated_latency_p50_ms", "(producer at half the burn-down rate)", nil},
	{"saturated_latency_p99_ms", "(producer at half the burn-down rate)", nil},
	{"saturated_latency_p50_ms_poll10ms", "(same, PollInterval 10ms)", nil},
	{"saturated_latency_p99_ms_poll10ms", "(same, PollInterval 10ms)", nil},
	{"saturated_p99_vs_raw", "<= 1.2 (default options ÷ the raw 10 ms loop, per round)", func(v float64) bool { return v <= 1.2 }},
	{"burndown_retained_vs_empty", ">= 0.90", func(v float64) bool { return v >= 0.90 }},
	{"burndown_ordered_vs_unordered", ">= 0.70", func(v float64) bool { return v >= 0.70 }},
	{"ordered_vs_unordered_k1", ">= 0.5 (ordered ÷ unordered burn-down, 1 key, a key-order transport)", func(v float64) bool { return v >= 0.5 }},
	{"ordered_vs_unordered_k5", ">= 0.7 (same, 5 keys)", func(v float64) bool { return v >= 0.7 }},
	{"ordered_vs_unordered_k50", ">= 0.9 (same, 50 keys)", func(v float64) bool { return v >= 0.9 }},
	{"ordered_vs_unordered_k1000", ">= 0.9 (same, 1,000 keys)", func(v float64) bool { return v >= 0.9 }},
	{"ordered_out_of_order", "0 (deliveries of a key out of order, every ordered run)", func(v float64) bool { return v == 0 }},
	{"ordered_latency_p50_ms_k1_at_200", "(one key at 200 events/s, ordered, enqueue to publish)", nil},
	{"ordered_latency_p99_ms_k1_at_200", "<= 20 (<= 50 on SQLite; same)", nil},
	{brokerMetric, "(a broker's 1 ms per batch on both sides)", nil},
	{"short_drain_b100_w1_vs_raw", "(20 000 fresh rows, 200-byte payloads)", nil},
	{"short_drain_b100_w2_vs_raw", "(same, 2 loops)", nil},
	{"short_drain_b500_w1_vs_raw", "(same, batch 500)", nil},
	{"short_drain_b500_w2_vs_raw", "(same, batch 500, 2 loops)", nil},
	{"drain_raw_fixed_ms", "(fit, 1 loop: per drain)", nil},
	{"drain_raw_batch_us", "(fit, 1 loop: per batch)", nil},
	{"drain_raw_row_us", "(fit, 1 loop: per row)", nil},
	{"drain_library_extra_fixed_ms", "(fit of library − raw pairs: per drain)", nil},
	{"drain_library_extra_batch_us", "(same: per batch)", nil},
	{"drain_library_extra_row_us", "(same: per row)", nil},
	{"publisher_vs_store_loop_b100_w1", ">= 0.95 (Store.Claim/Store.Ack loop, 1 loop, from Run)", func(v float64) bool { return v >= 0.95 }},
	{"publisher_vs_store_loop_b100_w2", ">= 0.95 (same, 2 loops)", func(v float64) bool { return v >= 0.95 }},
	{"publisher_vs_store_loop_b500_w1", ">= 0.95 (same, batch 500)", func(v float64) bool { return v >= 0.95 }},
	{"publisher_vs_store_loop_b500_w2", ">= 0.95 (same, batch 500, 2 loops)", func(v float64) bool { return v >= 0.95 }},
	{"burndown_vs_raw_guarded", ">= 0.90 (raw loop with the library's guarantees)", func(v float64) bool { return v >= 0.90 }},
	{"raw_guarded_vs_raw", "(the price of the guarantees)", nil},
	{"scaleout_p1_vs_raw", "(1 publisher process ÷ 1 raw process)", nil},
	{"scaleout_p2_vs_raw", "(2 processes each)", nil},
	{"scaleout_p4_vs_raw", "(4 processes each)", nil},
	{"scaleout_p8_vs_raw", "(8 processes each)", nil},
	{"scaleout_library_p8_vs_p1", "(8 publisher processes ÷ 1)", nil},
	{"scaleout_raw_p8_vs_p1", "(8 raw processes ÷ 1)", nil},
	{"sustained_rate", "(msg/s held with p99 <= 50 ms)", nil},
	{"sustained_rate_raw", "(the raw loop under the same producers)", nil},
	{"sustained_vs_raw", ">= 0.9 (highest rate at p99 <= 50 ms, library ÷ raw)", func(v float64) bool { return v >= 0.9 }},
	{"log_vs_poll_sustained", ">= 1.5 (highest rate at p99 <= 50 ms, log reader ÷ polling, producers in another process)", func(v float64) bool { return v >= 1.5 }},
	{"log_sustained_rate", "(msg/s held with p99 <= 50 ms, from the log)", nil},
	{"log_sustained_rate_poll", "(same, polled)", nil},
	{"log_producers_alone_rate", "(the highest step the producers reach with no publisher: log ÷ poll cannot pass it ÷ poll)", nil},
	{"log_latency_p50_ms_at_100", "(commit to publish from the log, 100 msg/s from another process)", nil},
	{"log_latency_p99_ms_at_100", "(same, p99)", nil},
	{"log_latency_p50_ms_at_1000", "(same, 1,000 msg/s)", nil},
	{"log_latency_p99_ms_at_1000", "<= 10 (same, p99)", func(v float64) bool { return v <= 10 }},
	{"log_latency_p50_ms_at_100_poll", "(the same, polled)", nil},
	{"log_latency_p99_ms_at_100_poll", "(the same, polled)", nil},
	{"log_latency_p50_ms_at_1000_poll", "(the same, polled)", nil},
	{"log_latency_p99_ms_at_1000_poll", "(the same, polled)", nil},
	{"log_updates_per_event", "<= 1.01 (row updates per event from the log: the settle, 1 on PostgreSQL; MariaDB also the reader's position row, at most once per PositionInterval and at each start and stop of a window's reader)", func(v float64) bool { return v <= 1.01 }},
	{"log_updates_per_event_poll", "(polled: the claim and the settle)", nil},
	{"log_wal_bytes_per_event", "(WAL per event from the log, the INSERT's included; MariaDB: the InnoDB redo log)", nil},
	{"log_wal_bytes_per_event_poll", "(same, polled)", nil},
	{"log_binlog_bytes_per_event", "(MariaDB's binlog per event from the log, the INSERT's included)", nil},
	{"log_binlog_bytes_per_event_poll", "(same, polled)", nil},
	{"log_server_cpu_ms_per_event", "(server CPU per event from the log, the producers' included)", nil},
	{"log_server_cpu_ms_per_event_poll", "(same, polled)", nil},
	{"delayed_100k_latency_p50_vs_none", "<= 1.2 (live p50, 100,000 rows an hour ahead ÷ none)", func(v float64) bool { return v <= 1.2 }},
	{"delayed_100k_latency_p99_vs_none", "<= 1.2 (same, p99)", func(v float64) bool { return v <= 1.2 }},
	{"delayed_1m_latency_p50_vs_none", "<= 1.2 (live p50, 1,000,000 rows an hour ahead ÷ none)", func(v float64) bool { return v <= 1.2 }},
	{"delayed_1m_latency_p99_vs_none", "<= 1.2 (same, p99)", func(v float64) bool { return v <= 1.2 }},
	{"delayed_drain_vs_undelayed", ">= 0.9 (rows falling due at once ÷ due when loaded, never analyzed)", func(v float64) bool { return v >= 0.9 }},
}

// metrics returns the JSON lines of one backend, in the order of targets.
func (r *backendResult) metrics(cfg config) []metric {
	if r.Skipped != "" {
		return nil
	}
	var out []metric
	add := func(name string, v float64) {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return
		}
		out = append(out, metric{Metric: name, Backend: r.Backend, Value: round(v, 4)})
	}
	if e := r.enqueueAt(1); e != nil {
		add("enqueue_vs_raw_c1", e.LibVsRaw)
		add("enqueue_keyed_vs_unkeyed_c1", e.KeyedVsLib)
	}
	if e := r.enqueueAt(8); e != nil {
		add("enqueue_vs_raw_c8", e.LibVsRaw)
		add("enqueue_vs_business_c8", e.LibVsBusiness)
		add("enqueue_keyed_vs_unkeyed_c8", e.KeyedVsLib)
		if e.Quiet != nil {
			add("enqueue_notify_vs_quiet_c8", e.LibVsQuiet)
		}
	}
	for _, e := range r.PgxEnqueue {
		if e.Concurrency == 1 || e.Concurrency == 8 {
			add(fmt.Sprintf("enqueue_pgx_vs_raw_pgx_c%d", e.Concurrency), e.LibVsRaw)
		}
	}
	if b := r.headlineBatch(cfg.Batch); b != nil {
		add("batch_enqueue_vs_raw", b.Ratio)
	}
	if b := r.Burndown; b != nil {
		add("burndown_vs_raw", b.Ratio)
		add("commits_per_message", b.CommitsPerMessage)
		add("commits_per_batch", b.CommitsPerBatch)
	}
	for _, l := range r.Latency {
		switch {
		case l.Raw:
			continue // a reference, not a library metric
		case l.Kind == "fixed":
			suffix := fmt.Sprintf("_at_%.0f", l.TargetRate)
			if !l.Shared {
				suffix += "_cross"
			}
			add("latency_p50_ms"+suffix, l.P50)
			add("latency_p99_ms"+suffix, l.P99)
		default:
			suffix := ""
			if l.PollInterval != outbox.DefaultPollInterval.String() {
				suffix = "_poll" + l.PollInterval
			}
			add("saturated_latency_p50_ms"+suffix, l.P50)
			add("saturated_latency_p99_ms"+suffix, l.P99)
		}
	}
	if r.SaturatedP99VsRaw > 0 {
		add("saturated_p99_vs_raw", r.SaturatedP99VsRaw)
	}
	for _, i := range r.Idle {
		name := "latency_ms_after_idle"
		if !i.Shared {
			name += "_cross"
		}
		add(name, i.LatencyMs)
	}
	for _, c := range r.IdleCost {
		switch c.Config {
		case "default options":
			add("idle_statements_per_s", c.StatementsPerSecond)
			add("idle_server_cpu_pct", c.ServerCPUPercent)
		case "PollInterval 10ms, no cross-process wake-ups":
			add("idle_statements_per_s_poll10ms", c.StatementsPerSecond)
			add("idle_server_cpu_pct_poll10ms", c.ServerCPUPercent)
		}
	}
	if g := r.Growth; g != nil {
		add("burndown_retained_vs_empty", g.Ratio)
	}
	if o := r.Ordered; o != nil {
		o.metrics(add)
	}
	if br := r.Broker; br != nil {
		add(brokerMetric, br.Ratio)
	}
	for i := range r.ShortDrain {
		add(r.ShortDrain[i].metricName(), r.ShortDrain[i].Ratio)
	}
	if d := r.Delayed; d != nil {
		d.metrics(add)
	}
	if c := r.Costs; c != nil {
		add("drain_raw_fixed_ms", c.Raw.FixedMs)
		add("drain_raw_batch_us", c.Raw.PerBatchUs)
		add("drain_raw_row_us", c.Raw.PerRowUs)
		add("drain_library_extra_fixed_ms", c.Extra.FixedMs)
		add("drain_library_extra_batch_us", c.Extra.PerBatchUs)
		add("drain_library_extra_row_us", c.Extra.PerRowUs)
	}
	if t := r.TableCost; t != nil {
		t.metrics(add)
	}
	for i := range r.StoreLoop {
		add(r.StoreLoop[i].metricName(), r.StoreLoop[i].Ratio)
		add(strings.Replace(r.StoreLoop[i].metricName(), "publisher_", "publisher_from_first_claim_", 1), r.StoreLoop[i].SteadyRatio)
	}
	if g := r.Guarded; g != nil {
		add("burndown_vs_raw_guarded", g.LibraryVsGuarded)
		add("raw_guarded_vs_raw", g.GuardedVsRaw)
	}
	if l := r.LogDelivery; l != nil {
		l.metrics(add)
	}
	if s := r.Sustained; s != nil {
		add("sustained_rate", s.Library)
		add("sustained_rate_raw", s.Raw)
		if s.Raw > 0 {
			add("sustained_vs_raw", s.Ratio)
		}
	}
	for _, p := range r.ScaleOut {
		add(fmt.Sprintf("scaleout_p%d_vs_raw", p.Procs), p.Ratio)
		add(fmt.Sprintf("scaleout_library_p%d_rows_per_s", p.Procs), p.Library.Median)
		add(fmt.Sprintf("scaleout_raw_p%d_rows_per_s", p.Procs), p.Raw.Median)
		if p.Procs > 1 && p.LibraryVsOne > 0 {
			add(fmt.Sprintf("scaleout_library_p%d_vs_p1", p.Procs), p.LibraryVsOne)
			add(fmt.Sprintf("scaleout_raw_p%d_vs_p1", p.Procs), p.RawVsOne)
		}
	}
	return out
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

func (rep *report) printJSONLines(w io.Writer) {
	for _, b := range rep.Backends {
		for _, m := range b.metrics(rep.Config) {
			line, _ := json.Marshal(m)
			fmt.Fprintln(w, string(line))
		}
	}
}

// printTable writes the human-readable results.
func (rep *report) printTable(w io.Writer) {
	fmt.Fprintf(w, "\noutbox-bench, %s mode: %s\n", rep.Config.Mode, rep.Command)
	fmt.Fprintf(w, "machine: %d cores (%s), %s, %s, %s; load average %s before, %s after\n",
		rep.Machine.Cores, rep.Machine.CPU, rep.Machine.Memory, rep.Machine.Kernel, rep.Machine.Go, rep.Machine.LoadBefore, rep.Machine.LoadAfter)
	fmt.Fprintf(w, "rows: %s\nsource: %s\n", rep.Machine.Payload, rep.Machine.Source)
	for _, b := range rep.Backends {
		fmt.Fprintf(w, "\n=== %s", b.Backend)
		if b.Skipped != "" {
			fmt.Fprintf(w, ": SKIPPED (%s)\n", b.Skipped)
			continue
		}
		fmt.Fprintf(w, ": %s (%s)\n", b.Server.Version, b.Elapsed)
		fmt.Fprintf(w, "durability: %s\n", b.Server.Durability)
		if b.Error != "" {
			fmt.Fprintf(w, "ERROR: %s\n", b.Error)
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		if len(b.Enqueue) > 0 {
			fmt.Fprintln(tw, "enqueue tx/s\tconcurrency\tbusiness only\t+ raw INSERT\t+ library Enqueue\tlibrary/raw\tlibrary/business\traw/business\t")
			for _, e := range b.Enqueue {
				fmt.Fprintf(tw, "\t%d\t%.0f\t%.0f\t%.0f\t%.3f\t%.3f\t%.3f\t\n", e.Concurrency, e.Business.Median, e.Raw.Median, e.Library.Median, e.LibVsRaw, e.LibVsBusiness, e.RawVsBusiness)
			}
		}
		if len(b.Batch) > 0 {
			fmt.Fprintln(tw, "batch enqueue rows/s\tbatch\tlibrary\tbest raw\traw forms\tlibrary/raw\t\t\t")
			for _, x := range b.Batch {
				var forms []string
				for _, f := range sortedKeys(x.Raw) {
					forms = append(forms, fmt.Sprintf("%s %.0f", f, x.Raw[f].Median))
				}
				fmt.Fprintf(tw, "\t%d\t%.0f\t%.0f\t%s\t%.3f\t\t\t\n", x.Batch, x.Library.Median, x.BestRaw.Median, strings.Join(forms, ", "), x.Ratio)
			}
		}
		if len(b.Sweep) > 0 {
			fmt.Fprintf(tw, "burn-down rows/s\tbatch\tn\tlibrary\traw\tlibrary/raw\t(workers %d)\t\t\n", rep.Config.Workers)
			for _, p := range b.Sweep {
				fmt.Fprintf(tw, "\t%d\t%d\t%.0f\t%.0f\t%.3f\t\t\t\n", p.Batch, p.N, p.Library.Median, p.Raw.Median, p.Ratio)
			}
		}
		for _, br := range b.Breakdown {
			fmt.Fprintf(tw, "breakdown rows/s\tbatch %d\t", br.Batch)
			for _, k := range breakdownKinds {
				fmt.Fprintf(tw, "%s %.0f (%.2f)\t", k, br.Rates[k].Median, br.VsRaw[k])
			}
			fmt.Fprintln(tw, "\t")
		}
		if br := b.Broker; br != nil {
			fmt.Fprintf(tw, "broker burn-down\t%s\t\t\t\t\t\t\t\n", br.describe())
		}
		if len(b.ShortDrain) > 0 {
			fmt.Fprintln(tw, "short drain rows/s\tbatch\tworkers\tlibrary\traw\tlibrary/raw\tn\t\t")
			for _, s := range b.ShortDrain {
				fmt.Fprintf(tw, "\t%d\t%d\t%.0f\t%.0f\t%.3f\t%d\t\t\n", s.Batch, s.Workers, s.Library.Median, s.Raw.Median, s.Ratio, s.N)
			}
		}
		if len(b.StoreLoop) > 0 {
			fmt.Fprintln(tw, "store loop rows/s\tbatch\tworkers\tpublisher\tstore loop\tpublisher/loop\tn\t\t")
			for _, s := range b.StoreLoop {
				fmt.Fprintf(tw, "\t%d\t%d\t%.0f\t%.0f\t%.3f\t%d\t\t\n", s.Batch, s.Workers, s.Publisher.Median, s.StoreLoop.Median, s.Ratio, s.N)
			}
		}
		if g := b.Guarded; g != nil {
			fmt.Fprintln(tw, "guarded rows/s\traw\tguarded raw\tlibrary\tlibrary/guarded\tguarded/raw\tlibrary/raw\t\t")
			fmt.Fprintf(tw, "\t%.0f\t%.0f\t%.0f\t%.3f\t%.3f\t%.3f\t\t\n", g.Raw.Median, g.Guarded.Median, g.Library.Median, g.LibraryVsGuarded, g.GuardedVsRaw, g.LibraryVsRaw)
		}
		if st := b.Sustained; st != nil {
			fmt.Fprintf(tw, "sustained msg/s\tlibrary %.0f\traw %.0f\t(p99 <= 50 ms, table of %d delivered rows)\t\t\t\t\t\n", st.Library, st.Raw, st.History)
		}
		if l := b.LogDelivery; l != nil {
			fmt.Fprintf(tw, "log delivery\tsustained log %.0f\tpoll %.0f\tlog/poll %.2f\t(p99 <= 50 ms; producers alone reach %.0f)\t\t\t\t\n", l.Sustained["log"], l.Sustained["poll"], l.SustainedVsPoll, l.ProducersAlone)
			for _, x := range l.Latency {
				fmt.Fprintf(tw, "\t%s at %.0f/s\tp50 %.2f ms\tp99 %.2f ms\t\t\t\t\t\n", x.Mode, x.TargetRate, x.P50, x.P99)
			}
			for _, c := range l.Costs {
				binlog := ""
				if c.BinlogBytes > 0 {
					binlog = fmt.Sprintf("%.0f binlog bytes", c.BinlogBytes)
				}
				fmt.Fprintf(tw, "\t%s per event\t%.0f WAL bytes\t%s\t%.2f updates\t%.3f ms CPU\t\t\t\n", c.Mode, c.WALBytes, binlog, c.Updates, c.CPUms)
			}
		}
		if len(b.ScaleOut) > 0 {
			fmt.Fprintln(tw, "scale-out rows/s\tprocesses\tlibrary\traw\tlibrary/raw\tlibrary/p1\traw/p1\t\t")
			for _, p := range b.ScaleOut {
				fmt.Fprintf(tw, "\t%d\t%.0f\t%.0f\t%.3f\t%.2f\t%.2f\t\t\n", p.Procs, p.Library.Median, p.Raw.Median, p.Ratio, p.LibraryVsOne, p.RawVsOne)
			}
		}
		if c := b.Costs; c != nil {
			fmt.Fprintf(tw, "drain costs (1 loop)\tlibrary\t%s\t\t\t\t\t\t\n", c.Library.describe())
			fmt.Fprintf(tw, "\traw\t%s\t\t\t\t\t\t\n", c.Raw.describe())
			fmt.Fprintf(tw, "\tlibrary − raw\t%s\t\t\t\t\t\t\n", c.Extra.describe())
		}
		if t := b.TableCost; t != nil {
			fmt.Fprintf(tw, "table cost (÷ ours)\ttable\tdrain rows/s\t\tenqueue c=%d tx/s\t\tbatch %d rows/s\t\t\n", t.EnqueueConc, t.InsertBatch)
			for _, v := range t.Variants {
				fmt.Fprintf(tw, "\t%s\t%.0f\t(%.3f)\t%.0f\t(%.3f)\t%.0f\t(%.3f)\t\n", v.Name, v.Drain.Median, v.DrainVsOurs, v.Enqueue.Median, v.EnqueueVsOurs, v.Batch.Median, v.BatchVsOurs)
			}
		}
		if h := b.Burndown; h != nil {
			fmt.Fprintf(tw, "commits\tper batch\tlibrary %.2f\traw %.2f\tper message\tlibrary %.4f\t\t\t\n", h.CommitsPerBatch, h.RawCommitsPerBatch, h.CommitsPerMessage)
		}
		if len(b.Latency) > 0 {
			fmt.Fprintln(tw, "latency ms\tpublisher\tmsg/s\tp50\tp90\tp99\tmax\tmessages\t")
			for _, l := range b.Latency {
				fmt.Fprintf(tw, "\t%s: %s\t%.0f\t%.1f\t%.1f\t%.1f\t%.1f\t%d\t\n", l.Kind, l.Config, l.AchievedRate, l.P50, l.P90, l.P99, l.Max, l.Messages)
			}
			for _, i := range b.Idle {
				fmt.Fprintf(tw, "\tafter %s idle (shared store %v)\t\t%.1f\t\t\t\t\t\n", i.Idle, i.Shared, i.LatencyMs)
			}
		}
		if g := b.Growth; g != nil {
			fmt.Fprintln(tw, "growth rows/s\tretained\tlibrary empty\tlibrary retained\tratio\traw empty\traw retained\traw ratio\t")
			fmt.Fprintf(tw, "\t%d\t%.0f\t%.0f\t%.3f\t%.0f\t%.0f\t%.3f\t\n", g.Retained, g.LibEmpty.Median, g.LibRetained.Median, g.Ratio, g.RawEmpty.Median, g.RawRetained.Median, g.RawRatio)
		}
		_ = tw.Flush()
		if l := b.LogDelivery; l != nil {
			fmt.Fprintf(w, "log delivery server: %s\n", l.Server)
		}
		if v := b.Validation; v != nil {
			fmt.Fprintf(w, "commit counter: %s\n  validation (%s; expected %s): %s\n", v.Count.Method, v.Workload, v.Expected, v.Count.Check)
		}
		if h := b.Burndown; h != nil {
			fmt.Fprintf(w, "  burn-down cross-check: %s\n  %s\n", h.RawCommitsCheck, h.LibraryCommitsDetail)
		}
	}

	fmt.Fprintln(w, "\n=== targets")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	hdr := []string{"metric"}
	for _, b := range rep.Backends {
		hdr = append(hdr, b.Backend)
	}
	fmt.Fprintln(tw, strings.Join(append(hdr, "target"), "\t")+"\t")
	for _, t := range targets {
		row := []string{t.metric}
		for _, b := range rep.Backends {
			cell := "-"
			if b.Skipped != "" {
				cell = "skipped"
			}
			for _, m := range b.metrics(rep.Config) {
				if m.Metric == t.metric {
					cell = strconv.FormatFloat(m.Value, 'f', -1, 64)
					if t.pass != nil {
						if t.pass(m.Value) {
							cell += " ok"
						} else {
							cell += " MISS"
						}
					}
				}
			}
			row = append(row, cell)
		}
		fmt.Fprintln(tw, strings.Join(append(row, t.text), "\t")+"\t")
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// readReport loads a results.json written by an earlier run.
func readReport(path string) (*report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	rep := &report{}
	if err := json.Unmarshal(b, rep); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rep, nil
}

// write saves results.json, results.md, metrics.jsonl and throughput.svg in dir, and the
// plot also at plotPath when set.
func (rep *report) write(dir, plotPath string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	var lines strings.Builder
	rep.printJSONLines(&lines)
	if err := os.WriteFile(filepath.Join(dir, "metrics.jsonl"), []byte(lines.String()), 0o644); err != nil {
		return err
	}
	var md strings.Builder
	rep.markdown(&md)
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(md.String()), 0o644); err != nil {
		return err
	}
	svg := rep.plot()
	if err := os.WriteFile(filepath.Join(dir, "throughput.svg"), []byte(svg), 0o644); err != nil {
		return err
	}
	if plotPath != "" {
		if err := os.WriteFile(plotPath, []byte(svg), 0o644); err != nil {
			return err
		}
		logf("plot written to %s", plotPath)
	}
	return nil
}
