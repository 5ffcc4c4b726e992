// Command prometheus serves the outbox's metrics for Prometheus at /metrics: it enqueues
// events on SQLite, publishes them (some fail once, one is dead-lettered), and keeps
// serving. With -scrape it scrapes its own endpoint once the events are settled, prints
// the outbox's series and exits.
//
//	go run ./examples/prometheus -addr 127.0.0.1:9464
//	curl -s 127.0.0.1:9464/metrics | grep -E '^(outbox|messaging)'
package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	_ "modernc.org/sqlite"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
	outboxotel "github.com/outboxgo/outbox/otel"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9464", "address to serve /metrics on")
	scrape := flag.Bool("scrape", false, "scrape /metrics once the events are settled, print the outbox's series and exit")
	flag.Parse()
	if err := run(*addr, *scrape); err != nil {
		log.Fatal(err)
	}
}

func run(addr string, scrape bool) error {
	ctx := context.Background()
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		return err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { _ = mp.Shutdown(ctx) }()
	tel, err := outboxotel.New(outboxotel.Options{MeterProvider: mp})
	if err != nil {
		return err
	}

	dir, err := os.MkdirTemp("", "outbox-prom")
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

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	log.Printf("serving http://%s/metrics", ln.Addr())

	// Ten orders and two refunds; the first attempt of every third order fails, and the
	// second refund is refused for good.
	var msgs []outbox.Message
	for i := range 10 {
		msgs = append(msgs, outbox.Message{Namespace: "shop", Topic: "order.created", Payload: fmt.Appendf(nil, `{"order":%d}`, i)})
	}
	for i := range 2 {
		msgs = append(msgs, outbox.Message{Namespace: "shop", Topic: "refund.issued", Payload: fmt.Appendf(nil, `{"refund":%d}`, i)})
	}
	if _, err := store.EnqueueStandalone(ctx, msgs...); err != nil {
		return err
	}
	var mu sync.Mutex
	seen := map[uuid.UUID]int{}
	tr := outbox.PerMessage(func(_ context.Context, d outbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		seen[d.ID]++
		switch {
		case string(d.Payload) == `{"refund":1}`:
			return outbox.Permanent(errors.New("account closed"))
		case d.Topic == "order.created" && len(seen)%3 == 0 && seen[d.ID] == 1:
			return errors.New("broker busy")
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
	defer stop()
	done := make(chan error, 1)
	go func() { done <- p.Run(pctx) }()
	if !scrape {
		return <-done // serve until killed
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if s := p.Stats(); s.Delivered == 11 && s.Dead == 1 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not settled: %+v", p.Stats())
		}
	}
	watcher.Refresh(ctx) // the gauges as they are now, rather than at the next interval
	resp, err := http.Get("http://" + ln.Addr().String() + "/metrics")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		name := strings.TrimPrefix(strings.TrimPrefix(line, "# HELP "), "# TYPE ")
		if strings.HasPrefix(name, "outbox_") || strings.HasPrefix(name, "messaging_") {
			fmt.Println(line)
		}
	}
	stop()
	if err := <-done; err != nil {
		return err
	}
	return sc.Err()
}
