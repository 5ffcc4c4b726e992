// Command stdout shows the outbox's spans and metrics on standard output: a request span
// enqueues two events on SQLite, a publisher sends them (the first fails once and is
// retried), and the spans and metrics are printed as JSON by OpenTelemetry's stdout
// exporters.
//
//	go run ./examples/stdout
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	_ "modernc.org/sqlite"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
	outboxotel "github.com/outboxgo/outbox/otel"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx := context.Background()
	spans, err := stdouttrace.New(stdouttrace.WithPrettyPrint())
	if err != nil {
		return err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer func() { _ = tp.Shutdown(ctx) }()
	metrics, err := stdoutmetric.New(stdoutmetric.WithPrettyPrint())
	if err != nil {
		return err
	}
	reader := sdkmetric.NewPeriodicReader(metrics, sdkmetric.WithInterval(time.Hour)) // exported at shutdown
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(ctx) }()

	tel, err := outboxotel.New(outboxotel.Options{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "outbox-otel")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "outbox.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	if err != nil {
		return err
	}
	defer db.Close()
	if err := migrations.Up(ctx, db, "sqlite", migrations.Options{}); err != nil {
		return err
	}
	store, err := outbox.New(db, outbox.SQLite(), outbox.Options{Hooks: tel.StoreHooks()})
	if err != nil {
		return err
	}
	watcher, err := tel.WatchStore(store, outboxotel.WatchOptions{Interval: time.Second})
	if err != nil {
		return err
	}
	defer watcher.Close()

	// A request of the application: its span is the parent of the create spans.
	rctx, req := tp.Tracer("shop").Start(ctx, "POST /orders")
	tx, err := db.BeginTx(rctx, nil)
	if err != nil {
		return err
	}
	if _, err := store.EnqueueBatch(rctx, tx, []outbox.Message{
		{Namespace: "shop", Topic: "order.created", Payload: []byte(`{"order":1}`)},
		{Namespace: "shop", Topic: "order.created", Payload: []byte(`{"order":2}`)},
	}); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	req.End()

	var calls atomic.Int64
	tr := outbox.TransportFunc(func(_ context.Context, batch []outbox.Delivery) []error {
		if calls.Add(1) == 1 {
			errs := make([]error, len(batch))
			errs[0] = errors.New("broker busy")
			return errs
		}
		return nil
	})
	p, err := outbox.NewPublisher(store, tr, outbox.PublisherOptions{
		Scope: outbox.Scope{Namespace: "shop"}, Observer: tel.PublisherObserver(tr, "shop"),
		Retry: outbox.RetryPolicy{BaseDelay: 10 * time.Millisecond},
	})
	if err != nil {
		return err
	}
	pctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(pctx) }()
	for deadline := time.Now().Add(10 * time.Second); p.Stats().Delivered < 2; {
		if time.Now().After(deadline) {
			stop()
			return fmt.Errorf("not delivered: %+v", p.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	watcher.Refresh(ctx)
	return <-done
}
