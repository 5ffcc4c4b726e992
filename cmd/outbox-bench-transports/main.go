// Command outbox-bench-transports measures what the broker transports cost, against the
// broker clients used directly, on the same messages and batch sizes in the same run.
//
// For each transport (NATS JetStream, Kafka on franz-go's in-process kfake cluster, Redis
// Streams, RabbitMQ through AMQP 0-9-1, webhooks to an in-process HTTPS receiver) it
// alternates, for -rounds rounds:
//
//   - client alone: the broker client publishing N messages in batches of -batch from
//     -workers goroutines, with the same headers the transport sets, the way a hand-written
//     relay would (no database);
//   - transport alone: the transport's Publish on the same batches (no database), interleaved
//     with the client alone ten batches at a time, so that both meet the same load;
//   - burn-down through the client: N rows preloaded into PostgreSQL and drained by an
//     outbox.Publisher (BatchSize -batch, Concurrency -workers) whose transport is that
//     hand-written client code;
//   - burn-down through the transport: the same, with the transport;
//   - concurrent burn-down: N rows for each side preloaded under two namespaces and drained
//     at the same time by two Publishers, one through the client code and one through the
//     transport, until one side has published N; the other side's count at that moment
//     gives the ratio. Both sides meet the same load from the database, the broker and the
//     rest of the machine, which back-to-back runs do not on a shared machine. The side
//     whose namespace is drained first has an edge, so each round races both ways round
//     and takes the geometric mean of the two ratios.
//
// and PostgreSQL burn-down with a transport that does nothing, as the database's ceiling.
// The two burn-downs of a round run back to back, first one then the other in alternate
// rounds, and a ratio is the median of the
// rounds' pair ratios, so that load from other processes hits both sides of a pair alike.
// It prints a table, then the ratios as JSON lines shaped as outbox-bench's:
//
//	{"metric":"e2e_nats_vs_client","backend":"postgres","value":0.97}
//
// With -ordered N, it also drains a backlog of N rows on one partition key through the NATS
// transport with an ordered Publisher and an unordered one, and the same rows without a key
// with an unordered one, in turn, after the other measurements (it migrates the table's
// ordered set), and prints e2e_nats_ordered_1key_vs_unordered, the median of the rounds'
// ordered ÷ unordered (target >= 0.5), and e2e_nats_ordered_1key_vs_unkeyed, ordered ÷ the
// rows without a key. An unordered Publisher waives key order, so its batches take the
// transport's pipelined path either way. A message an ordered Publisher delivers before an
// earlier one of its key fails the run. With -nats-embedded, NATS runs in the process
// (nats-server 2.15) and its stream allows atomic batch publish, so that the ordered side
// sends a key's run as one atomic batch; against the machine's server (-nats-url), it does
// so when that server is 2.12 or later and -nats-atomic is given. The stream is file-backed
// with one replica, where nats-server stages each atomic batch in a file store of its own
// (created and synced per batch); -nats-memory makes it memory-backed, where the staging is
// in memory too.
//
// e2e_<t>_vs_client is the concurrent burn-down's transport ÷ client (target >= 0.8; the
// table also shows the ratio of the back-to-back burn-downs); transport_<t>_vs_client is the transport alone ÷ the client alone
// (target >= 0.8); e2e_<t>_vs_client_alone is the burn-down through the transport ÷ the
// client alone, which says how much of the broker client's own rate the whole outbox path
// reaches (bounded by PostgreSQL when the broker is faster than the database).
//
//	go run ./cmd/outbox-bench-transports            # make bench-transports
//
// PostgreSQL gets a database of its own, dropped at the end; NATS a stream, Redis a key,
// RabbitMQ an exchange and a queue, kfake a cluster and the webhooks an httptest server of
// their own, all deleted at the end.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

var logf = log.New(os.Stderr, "outbox-bench-transports: ", log.Ltime|log.Lmicroseconds).Printf

type config struct {
	N       int
	Batch   int
	Workers int
	Rounds  int
	PgDSN   string
	NatsURL string
	// NatsEmbedded runs a NATS server (2.12 or later) in the process instead of NatsURL's;
	// NatsAtomic creates the stream with atomic batch publish allowed (by default with
	// NatsEmbedded).
	NatsEmbedded bool
	NatsAtomic   bool
	// NatsMemory makes the stream's storage memory rather than file.
	NatsMemory bool
	RedisAddr  string
	AMQPURL    string
	Transports []string
	// OrderedN is the ordered mode's backlog on one key; 0 leaves the mode out.
	OrderedN int
}

func main() {
	var cfg config
	var transports, out string
	flag.IntVar(&cfg.N, "n", 20_000, "messages per measurement")
	flag.IntVar(&cfg.Batch, "batch", 100, "messages per batch (the Publisher's BatchSize)")
	flag.IntVar(&cfg.Workers, "workers", 2, "publishing goroutines (the Publisher's Concurrency)")
	flag.IntVar(&cfg.Rounds, "rounds", 7, "rounds of every measurement; a ratio is the median of the rounds' back-to-back pairs")
	flag.StringVar(&cfg.PgDSN, "pg-dsn", envOr("OUTBOX_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL server (the bench creates and drops its own database)")
	flag.StringVar(&cfg.NatsURL, "nats-url", envOr("OUTBOX_NATS_URL", "nats://127.0.0.1:4222"), "NATS server with JetStream")
	flag.BoolVar(&cfg.NatsEmbedded, "nats-embedded", false, "measure NATS on a server run in this process (nats-server 2.15, a file-backed stream that allows atomic batch publish) instead of -nats-url's")
	flag.BoolVar(&cfg.NatsAtomic, "nats-atomic", false, "create the NATS stream with atomic batch publish allowed (needs nats-server 2.12 or later; the default with -nats-embedded, where -nats-atomic=false measures without)")
	flag.BoolVar(&cfg.NatsMemory, "nats-memory", false, "make the NATS stream's storage memory instead of file (a one-replica file stream stages each atomic batch in a file store of its own)")
	flag.StringVar(&cfg.RedisAddr, "redis-addr", envOr("OUTBOX_REDIS_ADDR", "127.0.0.1:6379"), "Redis server")
	flag.StringVar(&cfg.AMQPURL, "amqp-url", envOr("OUTBOX_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ server (AMQP URI)")
	flag.StringVar(&transports, "transports", "nats,kafka,redis,amqp,webhook", "comma-separated transports to measure")
	flag.StringVar(&out, "out", "", "also write the JSON lines to this file")
	flag.IntVar(&cfg.OrderedN, "ordered", 0, "also drain a backlog of this many rows on one partition key through NATS, ordered against unordered (0: not measured)")
	flag.Parse()
	cfg.Transports = strings.Split(transports, ",")
	atomicSet := false
	flag.Visit(func(f *flag.Flag) { atomicSet = atomicSet || f.Name == "nats-atomic" })
	if cfg.NatsEmbedded && !atomicSet {
		cfg.NatsAtomic = true // what the embedded server is for; -nats-atomic=false measures without
	}
	if cfg.N < cfg.Batch || cfg.Batch < 1 || cfg.Batch > 1000 || cfg.Workers < 1 || cfg.Rounds < 1 || cfg.OrderedN < 0 {
		fmt.Fprintln(os.Stderr, "need 1 <= -batch <= 1000, -n >= -batch, -workers >= 1, -rounds >= 1, -ordered >= 0")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "outbox-bench-transports:", err)
		os.Exit(1)
	}
	rep.printTable(os.Stdout)
	var lines strings.Builder
	for _, m := range rep.metrics() {
		b, _ := json.Marshal(m)
		lines.Write(append(b, '\n'))
	}
	fmt.Print(lines.String())
	if out != "" {
		if err := os.WriteFile(out, []byte(lines.String()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Measurement kinds, in the order of a round.
const (
	kindClient    = "client alone"
	kindTransport = "transport alone"
	kindE2EClient = "burn-down through client"
	kindE2E       = "burn-down through transport"
)

var kinds = []string{kindClient, kindTransport, kindE2EClient, kindE2E}

// result is every rate measured for one transport, in messages per second.
type result struct {
	name  string
	rates map[string][]float64
	// race holds each round's concurrent burn-down, transport ÷ client.
	race    []float64
	retried int64
}

func (r *result) median(kind string) float64 { return median(r.rates[kind]) }

// ratios returns a's rate ÷ b's rate of every round. a and b run back to back within a
// round, so each ratio compares two runs under the same machine load.
func (r *result) ratios(a, b string) []float64 {
	out := make([]float64, min(len(r.rates[a]), len(r.rates[b])))
	for i := range out {
		out[i] = r.rates[a][i] / r.rates[b][i]
	}
	return out
}

// ratio is the median of the rounds' ratios.
func (r *result) ratio(a, b string) float64 { return median(r.ratios(a, b)) }

type report struct {
	cfg     config
	noop    []float64
	results []*result
	ordered *orderedResult // nil when not measured
	started time.Time
	load    [2]string
}

// metric is one JSON line, as outbox-bench prints them.
type metric struct {
	Metric  string  `json:"metric"`
	Backend string  `json:"backend"`
	Value   float64 `json:"value"`
}

func (rep *report) metrics() []metric {
	var out []metric
	for _, r := range rep.results {
		add := func(name string, v float64) {
			out = append(out, metric{Metric: name, Backend: "postgres", Value: float64(int(v*10000+0.5)) / 10000})
		}
		add("e2e_"+r.name+"_vs_client", median(r.race))
		add("transport_"+r.name+"_vs_client", r.ratio(kindTransport, kindClient))
		add("e2e_"+r.name+"_vs_client_alone", r.ratio(kindE2E, kindClient))
	}
	if o := rep.ordered; o != nil {
		out = append(out,
			metric{Metric: "e2e_nats_ordered_1key_vs_unordered", Backend: "postgres",
				Value: float64(int(median(o.ratios(drainUnordered))*10000+0.5)) / 10000},
			metric{Metric: "e2e_nats_ordered_1key_vs_unkeyed", Backend: "postgres",
				Value: float64(int(median(o.ratios(drainUnkeyed))*10000+0.5)) / 10000})
	}
	return out
}

func (rep *report) printTable(w io.Writer) {
	fmt.Fprintf(w, "\noutbox-bench-transports: %d messages per run, batch %d, %d workers, %d rounds (rates: medians; ratios: medians of the rounds' back-to-back pairs); %d cores, %s; load %s before, %s after; %s\n",
		rep.cfg.N, rep.cfg.Batch, rep.cfg.Workers, rep.cfg.Rounds, runtime.NumCPU(), runtime.Version(), rep.load[0], rep.load[1], time.Since(rep.started).Round(time.Second))
	fmt.Fprintf(w, "PostgreSQL burn-down with a no-op transport: %.0f msg/s (rounds %s)\n\n", median(rep.noop), fmtRates(rep.noop))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "msg/s\tclient alone\ttransport alone\tburn-down via client\tburn-down via transport\te2e ÷ client e2e (concurrent)\t(sequential)\ttransport ÷ client\te2e ÷ client alone\t")
	for _, r := range rep.results {
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%.0f\t%.3f\t%.3f\t%.3f\t%.3f\t\n", r.name,
			r.median(kindClient), r.median(kindTransport), r.median(kindE2EClient), r.median(kindE2E),
			median(r.race), r.ratio(kindE2E, kindE2EClient), r.ratio(kindTransport, kindClient), r.ratio(kindE2E, kindClient))
	}
	_ = tw.Flush()
	for _, r := range rep.results {
		fmt.Fprintf(w, "%s rounds:", r.name)
		for _, k := range kinds {
			fmt.Fprintf(w, " %s %s;", k, fmtRates(r.rates[k]))
		}
		fmt.Fprintf(w, " e2e ÷ client e2e per round: concurrent %s, sequential %s; transport ÷ client per round %s; publisher retries %d\n",
			fmtRatios(r.race), fmtRatios(r.ratios(kindE2E, kindE2EClient)), fmtRatios(r.ratios(kindTransport, kindClient)), r.retried)
	}
	if o := rep.ordered; o != nil {
		fmt.Fprintf(w, "nats, %d rows on one key: ordered %.0f msg/s, unordered %.0f msg/s, unordered without a key %.0f msg/s; ordered ÷ unordered %.3f (rounds %s), ordered ÷ without a key %.3f (rounds %s)\n",
			rep.cfg.OrderedN, median(o.rates[drainOrdered]), median(o.rates[drainUnordered]), median(o.rates[drainUnkeyed]),
			median(o.ratios(drainUnordered)), fmtRatios(o.ratios(drainUnordered)), median(o.ratios(drainUnkeyed)), fmtRatios(o.ratios(drainUnkeyed)))
	}
	fmt.Fprintln(w, "targets: e2e_<t>_vs_client >= 0.8, transport_<t>_vs_client >= 0.8, e2e_nats_ordered_1key_vs_unordered >= 0.5; e2e_<t>_vs_client_alone is bounded by PostgreSQL")
	fmt.Fprintln(w)
}

func fmtRates(rs []float64) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = fmt.Sprintf("%.0f", r)
	}
	return strings.Join(s, "/")
}

func fmtRatios(rs []float64) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = fmt.Sprintf("%.3f", r)
	}
	return strings.Join(s, "/")
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
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
