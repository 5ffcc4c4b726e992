// Command outbox-otel-bench measures what the outbox's telemetry costs: enqueue and
// burn-down with tracing and metrics on (every span sampled, exported to a no-op exporter
// by the SDK's batch processor; metrics into the SDK, collected every second) against the
// same work with them off, in the same run, alternating rounds so that both see the same
// machine. It prints one line per measurement and the ratios (on/off throughput), and
// counts the Stats queries of a store's gauge poller while metrics are collected often.
//
//	go run ./cmd/outbox-otel-bench                  # quick: SQLite and PostgreSQL, about a minute
//	go run ./cmd/outbox-otel-bench -mode full       # more rows and rounds
//	go run ./cmd/outbox-otel-bench -only sqlite     # one backend
//
// PostgreSQL is OUTBOX_POSTGRES_DSN (default postgres://postgres@127.0.0.1:5432/test);
// each run works in a schema of its own, dropped at the end.
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	_ "modernc.org/sqlite"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
	outboxotel "github.com/outboxgo/outbox/otel"
)

type config struct {
	rows     int // per burn-down
	enqueues int // single-message transactions per enqueue round
	rounds   int // rounds of each, off and on alternating
}

func main() {
	mode := flag.String("mode", "quick", "quick or full")
	only := flag.String("only", "sqlite,postgres", "backends to run (comma list of sqlite, postgres)")
	flag.Parse()
	cfg := config{rows: 20000, enqueues: 500, rounds: 6}
	if *mode == "full" {
		cfg = config{rows: 50000, enqueues: 1000, rounds: 10}
	}
	log.SetFlags(0)
	fmt.Printf("mode %s: burn-down of %d rows, enqueue of %d single-message transactions, %d rounds each, off and on alternating\n",
		*mode, cfg.rows, cfg.enqueues, cfg.rounds)
	for _, b := range strings.Split(*only, ",") {
		if err := bench(strings.TrimSpace(b), cfg); err != nil {
			log.Fatalf("%s: %v", b, err)
		}
	}
}

// telemetry is tracing and metrics as a service would run them, exporting nowhere.
type telemetry struct {
	tel    *outboxotel.Telemetry
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	stop   func()
}

func newTelemetry() (*telemetry, error) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tel, err := outboxotel.New(outboxotel.Options{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { // a collection every second, as a scrape or a periodic reader would
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				var rm metricdata.ResourceMetrics
				_ = reader.Collect(ctx, &rm)
			}
		}
	}()
	return &telemetry{tel: tel, tp: tp, reader: reader, stop: func() {
		cancel()
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	}}, nil
}

// open returns a pool on a fresh database of backend, and a function that drops it.
func open(backend string) (*sql.DB, outbox.Dialect, func(), error) {
	switch backend {
	case "sqlite":
		dir, err := os.MkdirTemp("", "outbox-otel-bench")
		if err != nil {
			return nil, nil, nil, err
		}
		db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "bench.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(30000)&_pragma=synchronous(FULL)&_txlock=immediate")
		if err != nil {
			return nil, nil, nil, err
		}
		return db, outbox.SQLite(), func() { _ = db.Close(); _ = os.RemoveAll(dir) }, nil
	case "postgres":
		dsn := os.Getenv("OUTBOX_POSTGRES_DSN")
		if dsn == "" {
			dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
		}
		adm, err := sql.Open("pgx", dsn)
		if err != nil {
			return nil, nil, nil, err
		}
		schema := fmt.Sprintf("otelbench_%d", time.Now().UnixNano())
		if _, err := adm.Exec(`CREATE SCHEMA ` + schema); err != nil {
			return nil, nil, nil, err
		}
		u, err := url.Parse(dsn)
		if err != nil {
			return nil, nil, nil, err
		}
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		db, err := sql.Open("pgx", u.String())
		if err != nil {
			return nil, nil, nil, err
		}
		db.SetMaxOpenConns(16)
		return db, outbox.Postgres(), func() {
			_ = db.Close()
			_, _ = adm.Exec(`DROP SCHEMA ` + schema + ` CASCADE`)
			_ = adm.Close()
		}, nil
	}
	return nil, nil, nil, fmt.Errorf("unknown backend %q", backend)
}

func bench(backend string, cfg config) error {
	ctx := context.Background()
	db, d, drop, err := open(backend)
	if err != nil {
		return err
	}
	defer drop()
	if err := migrations.Up(ctx, db, backend, migrations.Options{}); err != nil {
		return err
	}
	tm, err := newTelemetry()
	if err != nil {
		return err
	}
	defer tm.stop()
	plain, err := outbox.New(db, d, outbox.Options{})
	if err != nil {
		return err
	}
	traced, err := outbox.New(db, d, outbox.Options{Hooks: tm.tel.StoreHooks()})
	if err != nil {
		return err
	}
	root := tm.tp.Tracer("bench")

	var enqOff, enqOn, burnOff, burnOn []float64
	for round := range cfg.rounds {
		for _, on := range []bool{round%2 == 1, round%2 == 0} { // alternate which goes first
			store := plain
			if on {
				store = traced
			}
			// Enqueue: single-message transactions, each in a request span when traced.
			ns := fmt.Sprintf("enq%d%t", round, on)
			began := time.Now()
			for i := range cfg.enqueues {
				// The application's request span, on or off: what the outbox adds is measured.
				rctx, span := root.Start(ctx, "request")
				tx, err := db.BeginTx(rctx, nil)
				if err != nil {
					return err
				}
				if _, err := store.Enqueue(rctx, tx, outbox.Message{Namespace: ns, Topic: "order.created",
					Payload: fmt.Appendf(nil, `{"order":%d,"note":"a payload of about a hundred bytes, as an order event might be"}`, i)}); err != nil {
					return err
				}
				if err := tx.Commit(); err != nil {
					return err
				}
				span.End()
			}
			rate := float64(cfg.enqueues) / time.Since(began).Seconds()
			if on {
				enqOn = append(enqOn, rate)
			} else {
				enqOff = append(enqOff, rate)
			}
			// Burn-down: a backlog drained through a transport that accepts everything.
			ns = fmt.Sprintf("burn%d%t", round, on)
			if err := fill(ctx, traced, ns, cfg.rows); err != nil {
				return err
			}
			tr := outbox.TransportFunc(func(context.Context, []outbox.Delivery) []error { return nil })
			o := outbox.PublisherOptions{Scope: outbox.Scope{Namespace: ns}, BatchSize: 100, Logger: quiet()}
			if on {
				o.Observer = tm.tel.PublisherObserver(tr, ns)
			}
			p, err := outbox.NewPublisher(store, tr, o)
			if err != nil {
				return err
			}
			enqRate := rate
			rate, err = drain(ctx, p, cfg.rows)
			if err != nil {
				return err
			}
			if on {
				burnOn = append(burnOn, rate)
			} else {
				burnOff = append(burnOff, rate)
			}
			fmt.Printf("%-8s round %d telemetry %-5t enqueue %8.0f msg/s   burn-down %8.0f msg/s\n", backend, round+1, on, enqRate, rate)
		}
	}
	fmt.Printf("%-8s enqueue   off %8.0f on %8.0f msg/s (medians): on/off = %.3f\n", backend, median(enqOff), median(enqOn), median(enqOn)/median(enqOff))
	fmt.Printf("%-8s burn-down off %8.0f on %8.0f msg/s (medians): on/off = %.3f\n", backend, median(burnOff), median(burnOn), median(burnOn)/median(burnOff))

	// The gauge poller: one Stats query per interval, however often metrics are collected.
	w, err := tm.tel.WatchStore(plain, outboxotel.WatchOptions{Interval: 500 * time.Millisecond})
	if err != nil {
		return err
	}
	began := time.Now()
	collections := 0
	for time.Since(began) < 5*time.Second {
		var rm metricdata.ResourceMetrics
		if err := tm.reader.Collect(ctx, &rm); err != nil {
			return err
		}
		collections++
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := time.Since(began)
	w.Close()
	fmt.Printf("%-8s gauge poller: %d Stats queries in %s at one per 500ms (%d intervals, plus the first at start), %d collections\n",
		backend, w.Queries(), elapsed.Round(time.Millisecond), int(elapsed/(500*time.Millisecond)), collections)
	return nil
}

// fill commits n rows in namespace ns, 500 to a transaction.
func fill(ctx context.Context, s *outbox.Store, ns string, n int) error {
	for start := 0; start < n; start += 500 {
		msgs := make([]outbox.Message, 0, 500)
		for i := start; i < min(n, start+500); i++ {
			msgs = append(msgs, outbox.Message{Namespace: ns, Topic: "order.created",
				Payload: fmt.Appendf(nil, `{"order":%d,"note":"a payload of about a hundred bytes, as an order event might be"}`, i)})
		}
		if _, err := s.EnqueueStandalone(ctx, msgs...); err != nil {
			return err
		}
	}
	return nil
}

// drain runs p until it delivered n rows and returns the rate.
func drain(ctx context.Context, p *outbox.Publisher, n int) (float64, error) {
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	began := time.Now()
	go func() { done <- p.Run(rctx) }()
	deadline := began.Add(10 * time.Minute)
	for p.Stats().Delivered < int64(n) {
		if time.Now().After(deadline) {
			stop()
			return 0, fmt.Errorf("drain: %d of %d delivered", p.Stats().Delivered, n)
		}
		time.Sleep(time.Millisecond)
	}
	rate := float64(n) / time.Since(began).Seconds()
	stop()
	return rate, <-done
}

func median(xs []float64) float64 {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }
