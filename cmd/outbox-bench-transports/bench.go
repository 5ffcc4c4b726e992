package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

// broker is one transport under test and the hand-written client code it is measured
// against. Both publish the same deliveries with the same headers.
type broker struct {
	name      string
	transport outbox.Transport
	client    outbox.Transport // the broker client used directly, as a hand-written relay would
	// stored reports how many messages the broker holds, to check a run; reset empties it.
	stored func(ctx context.Context) (int64, error)
	reset  func(ctx context.Context) error
	close  func()
}

// check fails unless the broker holds at least want messages.
func (b *broker) check(ctx context.Context, want int64) error {
	n, err := b.stored(ctx)
	if err != nil {
		return fmt.Errorf("counting: %w", err)
	}
	if n < want {
		return fmt.Errorf("the broker holds %d of %d messages", n, want)
	}
	return nil
}

// payloads are 64 deterministic order events of 200 to 500 bytes, as outbox-bench writes.
var payloads = func() [][]byte {
	out := make([][]byte, 64)
	for i := range out {
		size := 200 + (i*37)%301
		b := []byte(`{"order_id":` + strconv.Itoa(100000+i) + `,"status":"paid","currency":"EUR","note":"`)
		for len(b) < size-2 {
			b = append(b, 'x')
		}
		out[i] = append(b, `"}`...)
	}
	return out
}()

const topic = "order.paid"

func messages(ns string, n int) []outbox.Message {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Namespace: ns, Topic: topic, PartitionKey: "order-" + strconv.Itoa(i), Payload: payloads[i%len(payloads)]}
	}
	return msgs
}

func deliveries(msgs []outbox.Message) []outbox.Delivery {
	ds := make([]outbox.Delivery, len(msgs))
	now := time.Now()
	for i, m := range msgs {
		ds[i] = outbox.Delivery{ID: uuid.Must(uuid.NewV7()), Namespace: m.Namespace, Topic: m.Topic,
			PartitionKey: m.PartitionKey, Payload: m.Payload, Attempt: 1, CreatedAt: now}
	}
	return ds
}

func randomSuffix() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// pg is the bench's own PostgreSQL database.
type pg struct {
	server *sql.DB
	name   string
	db     *sql.DB
	store  *outbox.Store
}

func openPG(ctx context.Context, dsn string) (*pg, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL DSN must be a URL: %w", err)
	}
	server, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, err
	}
	p := &pg{server: server, name: "outbox_bt_" + randomSuffix()}
	if _, err := server.ExecContext(ctx, `CREATE DATABASE `+p.name); err != nil {
		_ = server.Close()
		return nil, fmt.Errorf("postgres: create database: %w", err)
	}
	u.Path = "/" + p.name
	if p.db, err = sql.Open("pgx", u.String()); err != nil {
		p.close()
		return nil, err
	}
	if err := migrations.Up(ctx, p.db, "postgres", migrations.Options{}); err != nil {
		p.close()
		return nil, err
	}
	if p.store, err = outbox.New(p.db, outbox.Postgres(), outbox.Options{}); err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

func (p *pg) close() {
	if p.db != nil {
		_ = p.db.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := p.server.ExecContext(ctx, `DROP DATABASE IF EXISTS `+p.name+` WITH (FORCE)`); err != nil {
		logf("postgres: drop database %s: %v", p.name, err)
	}
	_ = p.server.Close()
}

// preload empties the table and enqueues msgs.
func (p *pg) preload(ctx context.Context, msgs []outbox.Message) error {
	if _, err := p.db.ExecContext(ctx, `TRUNCATE outbox_events`); err != nil {
		return err
	}
	if err := p.enqueue(ctx, msgs); err != nil {
		return err
	}
	_, err := p.db.ExecContext(ctx, `ANALYZE outbox_events`)
	return err
}

// enqueue writes msgs in transactions of 1000.
func (p *pg) enqueue(ctx context.Context, msgs []outbox.Message) error {
	for lo := 0; lo < len(msgs); lo += 1000 {
		tx, err := p.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := p.store.EnqueueBatch(ctx, tx, msgs[lo:min(lo+1000, len(msgs))]); err != nil {
			_ = tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return nil
}

// burn preloads n messages of namespace ns and drains them with a Publisher through tr. The
// clock runs from the start of Run until the n-th row is recorded as delivered.
func (p *pg) burn(ctx context.Context, ns string, n, batch, workers int, tr outbox.Transport) (float64, outbox.PublisherStats, error) {
	if err := p.preload(ctx, messages(ns, n)); err != nil {
		return 0, outbox.PublisherStats{}, fmt.Errorf("preload: %w", err)
	}
	// The transport signals when it has seen n messages, so that the publisher's counters
	// are polled only for the settlement of the last batch (polling all along would steal
	// the CPU the drain runs on).
	var published atomic.Int64
	all := make(chan struct{})
	var once sync.Once
	counting := outbox.TransportFunc(func(ctx context.Context, ds []outbox.Delivery) []error {
		errs := tr.Publish(ctx, ds)
		if published.Add(int64(len(ds))) >= int64(n) {
			once.Do(func() { close(all) })
		}
		return errs
	})
	pub, err := outbox.NewPublisher(p.store, counting, outbox.PublisherOptions{
		Scope: outbox.Scope{Namespace: ns}, BatchSize: batch, Concurrency: workers,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return 0, outbox.PublisherStats{}, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- pub.Run(rctx) }()
	timeout := time.NewTimer(time.Duration(max(60, n/500)) * time.Second)
	defer timeout.Stop()
	select {
	case <-all:
	case err := <-done:
		return 0, pub.Stats(), fmt.Errorf("publisher returned early: %v", err)
	case <-timeout.C:
		cancel()
		<-done
		return 0, pub.Stats(), fmt.Errorf("timed out: %+v", pub.Stats())
	}
	var elapsed time.Duration
	for {
		st := pub.Stats()
		if st.Delivered+st.Dead >= int64(n) {
			elapsed = time.Since(start)
			break
		}
		time.Sleep(100 * time.Microsecond)
	}
	cancel()
	if err := <-done; err != nil {
		return 0, pub.Stats(), err
	}
	st := pub.Stats()
	if st.Dead > 0 || st.Errors > 0 || st.Delivered != int64(n) {
		return 0, st, fmt.Errorf("burn-down delivered %d of %d: %+v", st.Delivered, n, st)
	}
	return float64(n) / elapsed.Seconds(), st, nil
}

// race drains two preloaded namespaces of n rows each at the same time, one Publisher
// through a and one through b, both routed to the broker's namespace ns, and returns b's
// deliveries ÷ a's at the moment the first of them has published n: both sides ran under
// the same load from the database, the broker and everything else on the machine.
func (p *pg) race(ctx context.Context, ns string, n, batch, workers int, a, b outbox.Transport) (float64, error) {
	sides := [2]string{ns + "_a", ns + "_b"}
	if _, err := p.db.ExecContext(ctx, `TRUNCATE outbox_events`); err != nil {
		return 0, err
	}
	for _, side := range sides {
		if err := p.enqueue(ctx, messages(side, n)); err != nil {
			return 0, fmt.Errorf("preload: %w", err)
		}
	}
	if _, err := p.db.ExecContext(ctx, `ANALYZE outbox_events`); err != nil {
		return 0, err
	}
	var (
		counts   [2]atomic.Int64
		snapshot [2]int64
		once     sync.Once
		first    = make(chan struct{})
	)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 2)
	for i, tr := range [2]outbox.Transport{a, b} {
		counting := outbox.TransportFunc(func(ctx context.Context, ds []outbox.Delivery) []error {
			routed := make([]outbox.Delivery, len(ds))
			for j := range ds {
				routed[j] = ds[j]
				routed[j].Namespace = ns
			}
			errs := tr.Publish(ctx, routed)
			if counts[i].Add(int64(len(ds))) >= int64(n) {
				once.Do(func() {
					snapshot[0], snapshot[1] = counts[0].Load(), counts[1].Load()
					close(first)
				})
			}
			return errs
		})
		pub, err := outbox.NewPublisher(p.store, counting, outbox.PublisherOptions{
			Scope: outbox.Scope{Namespace: sides[i]}, BatchSize: batch, Concurrency: workers,
			Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			return 0, err
		}
		go func() { done <- pub.Run(rctx) }()
	}
	timeout := time.NewTimer(time.Duration(max(60, n/250)) * time.Second)
	defer timeout.Stop()
	var err error
	select {
	case <-first:
	case <-timeout.C:
		err = fmt.Errorf("race timed out at %d and %d of %d", counts[0].Load(), counts[1].Load(), n)
	}
	cancel()
	for range 2 {
		if rerr := <-done; rerr != nil && err == nil {
			err = rerr
		}
	}
	if err != nil {
		return 0, err
	}
	return float64(snapshot[1]) / float64(snapshot[0]), nil
}

// aloneChunk is how many batches each side publishes before the other takes its turn.
const aloneChunk = 10

// alone measures the client and the transport publishing n messages each without a
// database, interleaved chunk by chunk (aloneChunk batches from each side in turn, the
// first side alternating), so that both meet the same machine load. It returns both rates.
func alone(ctx context.Context, b *broker, ns string, cfg config, transportFirst bool) (clientRate, transportRate float64, err error) {
	if err := b.reset(ctx); err != nil {
		return 0, 0, fmt.Errorf("reset: %w", err)
	}
	sides := [2]outbox.Transport{b.client, b.transport}
	ds := [2][]outbox.Delivery{deliveries(messages(ns, cfg.N)), deliveries(messages(ns, cfg.N))}
	var spent [2]time.Duration
	chunk := aloneChunk * cfg.Batch
	for lo, k := 0, 0; lo < cfg.N; lo, k = lo+chunk, k+1 {
		first := k % 2
		if transportFirst {
			first = 1 - first
		}
		for _, side := range []int{first, 1 - first} {
			d, err := publishAlone(ctx, sides[side], ds[side][lo:min(lo+chunk, cfg.N)], cfg.Batch, cfg.Workers)
			if err != nil {
				return 0, 0, fmt.Errorf("%s alone: %w", []string{"client", "transport"}[side], err)
			}
			spent[side] += d
		}
	}
	if err := b.check(ctx, 2*int64(cfg.N)); err != nil {
		return 0, 0, err
	}
	return float64(cfg.N) / spent[0].Seconds(), float64(cfg.N) / spent[1].Seconds(), nil
}

// publishAlone publishes ds through tr in batches from workers goroutines, without a
// database, and returns the time it took.
func publishAlone(ctx context.Context, tr outbox.Transport, ds []outbox.Delivery, batch, workers int) (time.Duration, error) {
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for {
				lo := int(next.Add(int64(batch))) - batch
				if lo >= len(ds) || failed.Load() != nil {
					return
				}
				for _, err := range tr.Publish(ctx, ds[lo:min(lo+batch, len(ds))]) {
					if err != nil {
						failed.CompareAndSwap(nil, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

func run(ctx context.Context, cfg config) (*report, error) {
	rep := &report{cfg: cfg, started: time.Now()}
	rep.load[0] = loadAverage()
	db, err := openPG(ctx, cfg.PgDSN)
	if err != nil {
		return nil, err
	}
	defer db.close()
	ns := "bench_" + randomSuffix()

	stopNATS := func() {} // the embedded NATS server's, run after the brokers closed
	defer func() { stopNATS() }()
	var brokers []*broker
	defer func() {
		for _, b := range brokers {
			b.close()
		}
	}()
	for _, name := range cfg.Transports {
		var b *broker
		switch name {
		case "nats":
			url := cfg.NatsURL
			if cfg.NatsEmbedded {
				if url, stopNATS, err = startNATS(); err != nil {
					return nil, fmt.Errorf("nats: %w", err)
				}
			}
			b, err = newNATS(ctx, url, ns, cfg.NatsAtomic, cfg.NatsMemory)
		case "kafka":
			b, err = newKafka(ctx, ns)
		case "redis":
			b, err = newRedis(ctx, cfg.RedisAddr, ns)
		case "amqp":
			b, err = newAMQP(ctx, cfg.AMQPURL, ns)
		case "webhook":
			b, err = newWebhook(ctx)
		default:
			err = fmt.Errorf("unknown transport %q (nats, kafka, redis, amqp, webhook)", name)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		brokers = append(brokers, b)
		rep.results = append(rep.results, &result{name: name, rates: map[string][]float64{}})
	}

	natsAt := slices.Index(cfg.Transports, "nats")
	if cfg.OrderedN > 0 && natsAt < 0 {
		return nil, fmt.Errorf("-ordered measures through NATS: add nats to -transports")
	}
	noop := outbox.TransportFunc(func(context.Context, []outbox.Delivery) []error { return nil })
	for round := range cfg.Rounds {
		rate, _, err := db.burn(ctx, ns, cfg.N, cfg.Batch, cfg.Workers, noop)
		if err != nil {
			return nil, fmt.Errorf("no-op burn-down: %w", err)
		}
		rep.noop = append(rep.noop, rate)
		logf("round %d: postgres no-op burn-down %.0f msg/s", round+1, rate)
		for i, b := range brokers {
			r := rep.results[i]
			clientRate, transportRate, err := alone(ctx, b, ns, cfg, round%2 == 1)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", b.name, err)
			}
			r.rates[kindClient] = append(r.rates[kindClient], clientRate)
			r.rates[kindTransport] = append(r.rates[kindTransport], transportRate)
			logf("round %d: %s client alone %.0f msg/s, transport alone %.0f msg/s", round+1, b.name, clientRate, transportRate)
			// The namespace drained first wins a race by a wide margin on PostgreSQL (up to
			// 1.6x), so each round races both ways and takes the geometric mean.
			ab, err := db.race(ctx, ns, cfg.N, cfg.Batch, cfg.Workers, b.client, b.transport)
			if err != nil {
				return nil, fmt.Errorf("%s: concurrent burn-down: %w", b.name, err)
			}
			ba, err := db.race(ctx, ns, cfg.N, cfg.Batch, cfg.Workers, b.transport, b.client)
			if err != nil {
				return nil, fmt.Errorf("%s: concurrent burn-down: %w", b.name, err)
			}
			ratio := math.Sqrt(ab / ba)
			r.race = append(r.race, ratio)
			logf("round %d: %s concurrent burn-down, transport ÷ client %.3f", round+1, b.name, ratio)
			order := []string{kindE2EClient, kindE2E}
			if round%2 == 1 { // alternate which goes first
				order = []string{kindE2E, kindE2EClient}
			}
			for _, kind := range order {
				if err := b.reset(ctx); err != nil {
					return nil, fmt.Errorf("%s: reset: %w", b.name, err)
				}
				tr := b.transport
				if kind == kindE2EClient {
					tr = b.client
				}
				rate, st, err := db.burn(ctx, ns, cfg.N, cfg.Batch, cfg.Workers, tr)
				r.retried += st.Retried
				if err != nil {
					return nil, fmt.Errorf("%s: %s: %w", b.name, kind, err)
				}
				if err := b.check(ctx, int64(cfg.N)); err != nil {
					return nil, fmt.Errorf("%s: %s: %w", b.name, kind, err)
				}
				r.rates[kind] = append(r.rates[kind], rate)
				logf("round %d: %s %s %.0f msg/s", round+1, b.name, kind, rate)
			}
		}
	}
	if cfg.OrderedN > 0 {
		if rep.ordered, err = runOrdered(ctx, db, brokers[natsAt], ns, cfg); err != nil {
			return nil, fmt.Errorf("nats: ordered: %w", err)
		}
	}
	rep.load[1] = loadAverage()
	return rep, nil
}
