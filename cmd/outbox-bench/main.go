// Command outbox-bench measures the outbox library against hand-written SQL doing the same
// work on the same database, table and batch size, in the same run.
//
// Absolute figures drift with the machine; the ratios do not, because every library figure is
// paired with a raw-SQL baseline measured in alternation with it. For every reachable backend
// (PostgreSQL, MariaDB/MySQL, SQLite) it measures:
//
//  1. enqueue: transactions per second of BEGIN; INSERT business row; COMMIT, of the same
//     plus a hand-written outbox INSERT, and of the same plus one library Enqueue, at
//     concurrency 1 and 8;
//     1b. enqueue on pgx (PostgreSQL): the same transaction on a pgx.Tx of a pgxpool, with
//     the outbox row written by pgxv5.Enqueue against a raw pgx INSERT of the same row.
//  2. batch enqueue: rows per second of Store.EnqueueBatch against the best raw multi-row
//     insert, per batch size;
//  3. burn-down: preloaded pending rows drained by a Publisher with a no-op transport against
//     a raw loop of one-statement claim plus one batched ack (same batch size and workers),
//     and the database commits per delivered message;
//  4. latency: commit-to-publish p50 and p99 under a steady producer at half the burn-down
//     rate;
//  5. growth: burn-down next to a million retained delivered rows against an empty table;
//  6. stats: Store.Stats over the retained delivered rows and 10 000 pending ones, against an
//     exact COUNT(*) of the delivered rows;
//  7. purge: the Publisher's burn-down while its Retention purges up to 100 000 day-old
//     delivered rows, against the same burn-down with retention off.
//  8. ordered: burn-down of rows spread over 1,000 partition keys by a Publisher with
//     PublisherOptions.Ordered against the same Publisher unordered, on a table with the
//     ordered migration set.
//  9. broker latency: the burn-down with a publish that takes 1 ms per batch on both
//     sides, as a broker's round trip would (the raw loop waits between claim and ack);
//  10. short drains: 20,000 freshly loaded rows of 200-byte payloads drained by a Publisher
//     (default options) against the raw loop, at batch 100 and 500 with 1 and 2 loops.
//     10b. relay: BurnN rows spread over ten tables drained by one Relay over ten Stores
//     against ten separate Publishers on the same tables and pool, in alternation.
//  11. drain costs: one-loop drains at several batch sizes and row counts, library and raw,
//     each fitted to a fixed cost per drain, a cost per batch and a cost per row.
//  12. table cost (only with -only tablecost): the raw loop's drain, single-event enqueue
//     and batch inserts on the library's table, on the same table with the ordered
//     migration set (the opt-in order index), without each secondary index in turn, and on
//     a lean nine-column table with the claim index only.
//  13. web view: the outboxui overview and dead-letter page rendered in-process on a table
//     with the retained delivered rows, more recent deliveries than the activity chart
//     samples, 10,000 dead rows and the ordered migration set (target: overview < 100 ms);
//     on PostgreSQL and SQLite also the summary of outboxui.Databases over 50 databases,
//     one of them down (target: < 1 s).
//  14. store loop: StoreN fresh rows of 200-byte payloads drained by a Publisher against a
//     plain loop of Store.Claim and Store.Ack on the same Store, at batch 100 and 500.
//  15. guarded raw loop: the burn-down by the raw loop, by a raw loop that keeps the
//     library's guarantees (every column returned, payload hashes checked, the ack guarded
//     by lease token) and by the Publisher, alternated.
//  16. scale-out (only with -only scaleout): one table drained by 1, 2, 4 and 8 child
//     processes of this binary, each running one Publisher, against as many processes of
//     the raw loop.
//  17. sustained load (only with -only sustained): producers at a fixed offered rate,
//     raised by half until the p99 commit-to-publish passes 50 ms, for the Publisher and for the
//     raw loop under the same producers: the highest rate each holds.
//  18. delayed rows: commit-to-publish latency at 100 messages/s with 0, 100,000 and
//     1,000,000 rows pending an hour ahead, as ratios against none; and 200,000 rows falling
//     due within a second drained against 200,000 due at once, each on a table never
//     analyzed.
//  19. log delivery (only with -only logdelivery, PostgreSQL and MariaDB): on a private
//     server with its log on (wal_level=logical; the binlog in ROW format), the log reader
//     (beside a polling Publisher) against a polling Publisher alone, producers in another
//     process: the highest rate each holds at p99 <= 50 ms, commit-to-publish at 100 and
//     1,000 messages/s, and per event the WAL (InnoDB's redo log) and binlog written, the
//     row updates and the server's CPU.
//
// It prints a table, then every ratio as one JSON object per line, and writes the full
// results (JSON, Markdown) and a throughput-against-batch-size plot (SVG) to -out.
//
//	go run ./cmd/outbox-bench -mode quick    # the headline metrics on every backend in minutes
//	go run ./cmd/outbox-bench -only shortdrain,storeloop  # named scenarios, quick sizes
//	go run ./cmd/outbox-bench -mode full -plot BENCHMARKS-throughput.svg
//
// Each backend gets a fresh database (PostgreSQL: a new database, so that
// pg_stat_database counts only the bench's transactions; MariaDB: a new database; SQLite: a
// file in a temporary directory) that is dropped at the end. A server that cannot be reached
// is reported as SKIPPED on stderr and in the table; -require turns that into a failure.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// config is what a mode measures, and for how long.
type config struct {
	Mode string `json:"mode"`

	// Enqueue (1): each variant runs EnqueueDur per round, EnqueueRounds rounds, after one
	// warm-up run of EnqueueWarmup.
	EnqueueDur    time.Duration `json:"enqueue_duration"`
	EnqueueWarmup time.Duration `json:"enqueue_warmup"`
	EnqueueRounds int           `json:"enqueue_rounds"`
	Concurrency   []int         `json:"concurrency"`

	// Batch enqueue (2).
	BatchSizes  []int         `json:"batch_sizes"`
	BatchDur    time.Duration `json:"batch_duration"`
	BatchRounds int           `json:"batch_rounds"`

	// Burn-down (3): the headline runs at Batch rows per claim with Workers claim loops,
	// BurnRounds pairs; the sweep adds the other SweepSizes at SweepRounds pairs each. Full
	// mode takes ten headline pairs: on SQLite single pairs spread from 0.70 to 1.07 of raw
	// within one run, and the median of four moved between 0.78 and 0.89 from run to run.
	BurnN       int   `json:"burn_n"`
	Batch       int   `json:"batch"`
	Workers     int   `json:"workers"`
	BurnRounds  int   `json:"burn_rounds"`
	SweepSizes  []int `json:"sweep_sizes"`
	SweepRounds int   `json:"sweep_rounds"`

	// Breakdown: the burn-down gap split by statement, at these batch sizes.
	BreakdownSizes  []int `json:"breakdown_sizes"`
	BreakdownN      int   `json:"breakdown_n"`
	BreakdownRounds int   `json:"breakdown_rounds"`

	// Latency (4).
	LatencyDur time.Duration `json:"latency_duration"`
	// History is set by the sustained scenario from SustainHistory: delivered rows each of
	// its windows starts with.
	History int `json:"-"`
	// LatencyRounds is how many times each latency run is repeated, in rotated order; the
	// figures are the medians.
	LatencyRounds int `json:"latency_rounds"`
	// IdleWait is how long the publisher sits idle before the after-idle event.
	IdleWait time.Duration `json:"idle_wait"`
	// IdleDur is the window of the idle-cost scenario (idle.go), per configuration.
	IdleDur time.Duration `json:"idle_duration"`

	// Growth (5).
	Retained     int `json:"retained"`
	GrowthN      int `json:"growth_n"`
	GrowthRounds int `json:"growth_rounds"`

	// Broker latency: BrokerN rows drained with a publish of brokerPublish per batch,
	// BrokerRounds library/raw pairs, at the headline batch size and loops.
	BrokerN      int `json:"broker_n"`
	BrokerRounds int `json:"broker_rounds"`

	// Short drains (9): ShortN fresh rows per drain at every ShortBatches × ShortWorkers,
	// ShortRounds library/raw pairs each. The scenario is 20,000 rows; quick mode halves it
	// to stay short, which weighs the fixed costs of a drain twice as much.
	ShortN       int   `json:"short_n"`
	ShortBatches []int `json:"short_batches"`
	ShortWorkers []int `json:"short_workers"`
	ShortRounds  int   `json:"short_rounds"`

	// Drain costs (10): one-loop drains of every CostNs × CostBatches, CostRounds rounds of
	// library and raw each.
	CostNs      []int `json:"cost_ns"`
	CostBatches []int `json:"cost_batches"`
	CostRounds  int   `json:"cost_rounds"`

	// Table cost (11, only with -only tablecost): raw drains of TableN rows and enqueue
	// windows of TableEnqueueDur per variant, TableRounds rounds.
	TableN          int           `json:"table_n"`
	TableRounds     int           `json:"table_rounds"`
	TableEnqueueDur time.Duration `json:"table_enqueue_duration"`

	// Scale-out (14, only with -only scaleout): ScaleN rows drained by each of ScaleProcs
	// publisher processes counts, and by as many raw loop processes, ScaleRounds pairs each.
	ScaleN      int   `json:"scale_n"`
	ScaleProcs  []int `json:"scale_processes"`
	ScaleRounds int   `json:"scale_rounds"`

	// Store loop (15): StoreN fresh rows of 200-byte payloads drained by the Publisher and
	// by a plain Store.Claim/Store.Ack loop on the same Store, at every StoreBatches ×
	// StoreWorkers, StoreRounds pairs each.
	StoreN       int   `json:"store_n"`
	StoreBatches []int `json:"store_batches"`
	StoreWorkers []int `json:"store_workers"`
	StoreRounds  int   `json:"store_rounds"`

	// Guarded raw loop (16): GuardN rows drained by the raw loop, the guarded raw loop and
	// the Publisher at the headline batch and workers, GuardRounds rounds.
	GuardN      int `json:"guard_n"`
	GuardRounds int `json:"guard_rounds"`

	// Sustained load (17, only with -only sustained): offered rates from SustainStart,
	// raised by half a step up to SustainMax, SustainDur each, for the Publisher and the raw loop.
	SustainStart float64       `json:"sustain_start"`
	SustainMax   float64       `json:"sustain_max"`
	SustainDur   time.Duration `json:"sustain_duration"`
	// SustainHistory is how many delivered rows the table holds, vacuumed and analyzed, when
	// each sustained window starts (-sustain-history): an outbox with retained history. 0
	// starts each window on an empty table, a new outbox's first seconds.
	SustainHistory int `json:"sustain_history,omitempty"`

	// Delayed rows (18): commit-to-publish latency at DelayedRate with each of
	// DelayedCounts rows pending an hour ahead, DelayedRounds rounds; and DelayedDrainN rows
	// falling due within a second against as many due at once, on tables never analyzed,
	// DelayedRounds pairs.
	DelayedCounts []int   `json:"delayed_counts"`
	DelayedRate   float64 `json:"delayed_rate"`
	DelayedDrainN int     `json:"delayed_drain_n"`
	DelayedRounds int     `json:"delayed_rounds"`
	// Delayed is set by the delayed scenario: rows pending an hour ahead that each latency
	// window starts with.
	Delayed int `json:"-"`

	// logReader, set by the log-delivery scenario, makes the latency runs' consumer a log
	// reader (beside a polling Publisher, as it is deployed) on a Store whose enqueues take
	// the insert lease; window, when set, is called as each latency window's producers start
	// (true) and once its messages are drained (false).
	logReader logReaderFunc
	window    func(start bool)

	// Only restricts the run to some scenarios (-only); empty means all.
	Only []string `json:"only,omitempty"`
}

// optIn are the scenarios that run only when -only names them.
var optIn = []string{"tablecost", "scaleout", "sustained", "logdelivery"}

// quickSet are the scenarios of quick mode without -only: the headline metrics, in a few
// minutes on two cores. Full mode runs every scenario but optIn; -only names any.
var quickSet = []string{"burndown", "enqueue", "batch", "latency", "idle"}

func (c config) runs(scenario string) bool {
	if len(c.Only) == 0 {
		if c.Mode == "quick" {
			return slices.Contains(quickSet, scenario)
		}
		return !slices.Contains(optIn, scenario)
	}
	for _, s := range c.Only {
		if strings.TrimSpace(s) == scenario {
			return true
		}
	}
	return false
}

func modeConfig(mode string) (config, error) {
	switch mode {
	case "quick":
		return config{
			Mode:       mode,
			EnqueueDur: 800 * time.Millisecond, EnqueueWarmup: 300 * time.Millisecond, EnqueueRounds: 3,
			Concurrency: []int{1, 8},
			BatchSizes:  []int{100}, BatchDur: 500 * time.Millisecond, BatchRounds: 3,
			BurnN: 10_000, Batch: 100, Workers: 2, BurnRounds: 3,
			SweepSizes: []int{10, 100, 500}, SweepRounds: 1,
			BreakdownSizes: []int{100, 500}, BreakdownN: 5_000, BreakdownRounds: 1,
			LatencyDur: 3 * time.Second, LatencyRounds: 1, IdleWait: 2 * time.Second, IdleDur: 2 * time.Second,
			Retained: 100_000, GrowthN: 5_000, GrowthRounds: 2,
			BrokerN: 10_000, BrokerRounds: 2,
			ShortN: 10_000, ShortBatches: []int{100, 500}, ShortWorkers: []int{1, 2}, ShortRounds: 1,
			CostNs: []int{1_000, 4_000}, CostBatches: []int{20, 100, 500}, CostRounds: 1,
			TableN: 10_000, TableRounds: 3, TableEnqueueDur: 800 * time.Millisecond,
			ScaleN: 10_000, ScaleProcs: []int{1, 2, 4, 8}, ScaleRounds: 1,
			StoreN: 10_000, StoreBatches: []int{100, 500}, StoreWorkers: []int{1}, StoreRounds: 2,
			GuardN: 10_000, GuardRounds: 2,
			SustainStart: 500, SustainMax: 64_000, SustainDur: 3 * time.Second,
			DelayedCounts: []int{0, 100_000}, DelayedRate: 100, DelayedDrainN: 20_000, DelayedRounds: 1,
		}, nil
	case "full":
		return config{
			Mode:       mode,
			EnqueueDur: 3 * time.Second, EnqueueWarmup: time.Second, EnqueueRounds: 6,
			Concurrency: []int{1, 8},
			BatchSizes:  []int{1, 10, 100, 500, 1000}, BatchDur: 2 * time.Second, BatchRounds: 3,
			BurnN: 100_000, Batch: 100, Workers: 2, BurnRounds: 10,
			SweepSizes: []int{10, 50, 100, 250, 500, 1000}, SweepRounds: 2,
			BreakdownSizes: []int{100, 500}, BreakdownN: 20_000, BreakdownRounds: 2,
			LatencyDur: 10 * time.Second, LatencyRounds: 3, IdleWait: 30 * time.Second, IdleDur: 10 * time.Second,
			Retained: 1_000_000, GrowthN: 100_000, GrowthRounds: 2,
			BrokerN: 50_000, BrokerRounds: 6,
			ShortN: 20_000, ShortBatches: []int{100, 500}, ShortWorkers: []int{1, 2}, ShortRounds: 6,
			CostNs: []int{1_000, 5_000, 20_000}, CostBatches: []int{20, 50, 100, 250, 500}, CostRounds: 3,
			TableN: 20_000, TableRounds: 6, TableEnqueueDur: 3 * time.Second,
			ScaleN: 40_000, ScaleProcs: []int{1, 2, 4, 8}, ScaleRounds: 2,
			StoreN: 20_000, StoreBatches: []int{100, 500}, StoreWorkers: []int{1, 2}, StoreRounds: 5,
			GuardN: 50_000, GuardRounds: 4,
			SustainStart: 250, SustainMax: 64_000, SustainDur: 8 * time.Second,
			DelayedCounts: []int{0, 100_000, 1_000_000}, DelayedRate: 100, DelayedDrainN: 200_000, DelayedRounds: 3,
		}, nil
	}
	return config{}, fmt.Errorf("unknown -mode %q (quick or full)", mode)
}

// logf reports progress on stderr; stdout carries only the table and the JSON lines.
var logf = log.New(os.Stderr, "outbox-bench: ", log.Ltime|log.Lmicroseconds).Printf

func main() {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild()) // a scale-out child (scaleout.go)
	}
	if os.Getenv(producerEnv) != "" {
		os.Exit(runProducer()) // a latency producer (producer.go)
	}
	var (
		mode     = flag.String("mode", "quick", "quick (the headline metrics in minutes: burndown, enqueue, batch, latency, idle) or full (every scenario, the published numbers)")
		backends = flag.String("backends", "postgres,mysql,sqlite", "comma-separated backends to measure")
		out      = flag.String("out", "bench-results", "directory for results.json, results.md and throughput.svg")
		plot     = flag.String("plot", "", "also write the throughput plot here (e.g. BENCHMARKS-throughput.svg)")
		pgDSN    = flag.String("pg-dsn", envOr("OUTBOX_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL server (the bench creates and drops its own database)")
		myDSN    = flag.String("mysql-dsn", envOr("OUTBOX_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test"), "MariaDB/MySQL server (the bench creates and drops its own database)")
		require  = flag.String("require", os.Getenv("OUTBOX_TEST_REQUIRE"), "backends that must be reachable (comma list or all); others are skipped loudly")
		batch    = flag.Int("batch", 0, "headline batch size (default 100)")
		workers  = flag.Int("workers", 0, "publisher claim loops and raw workers in burn-down (default 2)")
		burnN    = flag.Int("n", 0, "rows per burn-down (default: 10000 quick, 100000 full)")
		rounds   = flag.Int("burn-rounds", 0, "alternating library/raw pairs of the headline burn-down (default: 3 quick, 10 full)")
		retained = flag.Int("retained", 0, "retained delivered rows in the growth scenario (default: 100000 quick, 1000000 full)")
		history  = flag.Int("sustain-history", 0, "delivered rows (vacuumed and analyzed) the table holds when each sustained window starts (default 0: an empty table)")
		only     = flag.String("only", "", "run only these scenarios (comma list of enqueue, pgx, batch, burndown, breakdown, latency, idle, growth, stats, purge, ordered, broker, shortdrain, relay, costs, tablecost, ui, storeloop, guarded, scaleout, sustained, delayed, logdelivery; latency needs burndown; tablecost, scaleout, sustained and logdelivery run only when named)")
		storeB   = flag.String("store-batches", "", "batch sizes of the storeloop scenario, comma list (default 100,500)")
		storeW   = flag.String("store-workers", "", "claim loops of the storeloop scenario, comma list (default: 1 quick, 1,2 full)")
		cpuprof  = flag.String("cpuprofile", "", "write a CPU profile of the bench process (library and raw alike) to this file")
		from     = flag.String("from", "", "measure nothing: re-render the table, JSON lines, Markdown and plot of an earlier results.json")
	)
	flag.Parse()
	if *from != "" {
		rep, err := readReport(*from)
		if err == nil {
			rep.printTable(os.Stdout)
			rep.printJSONLines(os.Stdout)
			err = rep.write(*out, *plot)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	cfg, err := modeConfig(*mode)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if *batch > 0 {
		cfg.Batch = *batch
	}
	if *workers > 0 {
		cfg.Workers = *workers
	}
	if *burnN > 0 {
		cfg.BurnN = *burnN
	}
	if *rounds > 0 {
		cfg.BurnRounds = *rounds
	}
	if *retained > 0 {
		cfg.Retained = *retained
	}
	cfg.SustainHistory = max(*history, 0)

	for _, l := range []struct {
		flag string
		dst  *[]int
	}{{*storeB, &cfg.StoreBatches}, {*storeW, &cfg.StoreWorkers}} {
		if l.flag == "" {
			continue
		}
		var xs []int
		for _, f := range strings.Split(l.flag, ",") {
			x, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || x < 1 {
				fmt.Fprintf(os.Stderr, "outbox-bench: %q is not a list of positive numbers\n", l.flag)
				os.Exit(2)
			}
			xs = append(xs, x)
		}
		*l.dst = xs
	}
	if *only != "" {
		cfg.Only = strings.Split(*only, ",")
	}
	if *cpuprof != "" {
		f, err := os.Create(*cpuprof)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		defer pprof.StopCPUProfile()
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	rep := &report{Config: cfg, Command: "go run ./cmd/outbox-bench " + strings.Join(os.Args[1:], " "), Started: time.Now().UTC()}
	rep.Machine = describeMachine()
	logf("mode %s on %d cores, load average %s", cfg.Mode, rep.Machine.Cores, rep.Machine.LoadBefore)

	failed := false
	for _, name := range strings.Split(*backends, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		b, err := newBackend(name, *pgDSN, *myDSN)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		res := &backendResult{Backend: name}
		rep.Backends = append(rep.Backends, res)
		if err := b.setup(ctx); err != nil {
			b.teardown() // whatever setup created before it failed
			res.Skipped = err.Error()
			logf("SKIPPING %s: %v", strings.ToUpper(name), err)
			if required(*require, name) {
				logf("%s is required (-require=%s)", name, *require)
				failed = true
			}
			continue
		}
		start := time.Now()
		err = runBackend(ctx, cfg, b, res)
		b.teardown()
		res.Elapsed = time.Since(start).Round(time.Millisecond).String()
		if err != nil {
			res.Error = err.Error()
			logf("%s FAILED: %v", name, err)
			failed = true
		}
		if ctx.Err() != nil {
			break
		}
	}
	rep.Machine.LoadAfter = loadAverage()
	rep.Finished = time.Now().UTC()

	rep.printTable(os.Stdout)
	rep.printJSONLines(os.Stdout)
	if err := rep.write(*out, *plot); err != nil {
		logf("writing results: %v", err)
		failed = true
	} else {
		logf("results in %s", filepath.Join(*out, "results.json"))
	}
	pprof.StopCPUProfile()
	if failed || ctx.Err() != nil {
		os.Exit(1)
	}
}

// runBackend measures every scenario on one backend.
func runBackend(ctx context.Context, cfg config, b backend, res *backendResult) error {
	res.Server = b.describe(ctx)
	logf("%s: %s", b.name(), res.Server.Version)
	steps := []struct {
		name, key string
		run       func(context.Context, config, backend, *backendResult) error
	}{
		{"commit counter validation", "burndown", validateCounter},
		{"enqueue", "enqueue", runEnqueue},
		{"enqueue on a pgx transaction", "pgx", runEnqueuePgx},
		{"batch enqueue", "batch", runBatchEnqueue},
		{"burn-down", "burndown", runBurndown},
		{"burn-down breakdown", "breakdown", runBreakdown},
		{"latency", "latency", runLatency},
		{"idle cost", "idle", runIdleCost},
		{"growth", "growth", runGrowth},
		{"stats", "stats", runStats},
		{"purge during burn-down", "purge", runPurgeBurn},
		{"ordered burn-down", "ordered", runOrdered},
		{"broker-latency burn-down", "broker", runBroker},
		{"short drains", "shortdrain", runShortDrain},
		{"relay over ten stores", "relay", runRelayDrain},
		{"drain costs", "costs", runCosts},
		{"table cost", "tablecost", runTableCost},
		{"web view", "ui", runUI},
		{"store loop", "storeloop", runStoreLoop},
		{"guarded raw loop", "guarded", runGuarded},
		{"scale-out", "scaleout", runScaleOut},
		{"sustained load", "sustained", runSustained},
		{"delayed rows", "delayed", runDelayed},
		{"log delivery", "logdelivery", runLogDelivery},
	}
	for _, s := range steps {
		if !cfg.runs(s.key) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		start := time.Now()
		logf("%s: %s", b.name(), s.name)
		if err := s.run(ctx, cfg, b, res); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		logf("%s: %s done in %s", b.name(), s.name, time.Since(start).Round(time.Millisecond))
	}
	return nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func required(list, backend string) bool {
	for _, b := range strings.Split(list, ",") {
		b = strings.TrimSpace(b)
		if b == "all" || b == backend {
			return true
		}
	}
	return false
}
