package outboxamqp_test

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
	"github.com/outboxgo/outbox/outboxtest/testdb"
	"github.com/outboxgo/outbox/transport/amqp"
)

// e2e is a PostgreSQL outbox whose namespace is the test's exchange.
type e2e struct {
	store *outbox.Store
	b     *broker
}

func e2eSetup(t *testing.T) *e2e {
	t.Helper()
	b := setup(t, "#", nil)
	db := testdb.Postgres(t)
	ctx := context.Background()
	require.NoError(t, migrations.Up(ctx, db, "postgres", migrations.Options{}))
	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{})
	require.NoError(t, err)
	return &e2e{store: store, b: b}
}

// enqueue commits n events in the namespace, with a partition key and a header each.
func (e *e2e) enqueue(t *testing.T, n int) map[string]bool {
	t.Helper()
	ids := map[string]bool{}
	for start := 0; start < n; start += 500 {
		var msgs []outbox.Message
		for i := start; i < min(start+500, n); i++ {
			msgs = append(msgs, outbox.Message{
				Namespace: e.b.exchange, Topic: "order.created", PartitionKey: fmt.Sprintf("order-%d", i%7),
				Headers: outbox.Headers{"source": "e2e"}, Payload: fmt.Appendf(nil, `{"order":%d}`, i),
			})
		}
		res, err := e.store.EnqueueStandalone(context.Background(), msgs...)
		require.NoError(t, err)
		for _, r := range res {
			ids[r.ID.String()] = true
		}
	}
	return ids
}

// run starts a publisher over tr and returns a function that stops it and waits for Run.
func (e *e2e) run(t *testing.T, tr outbox.Transport) (*outbox.Publisher, func()) {
	t.Helper()
	p, err := outbox.NewPublisher(e.store, tr, outbox.PublisherOptions{
		Scope:        outbox.Scope{Namespace: e.b.exchange},
		BatchSize:    100,
		PollInterval: 10 * time.Millisecond,
		Retry:        outbox.RetryPolicy{BaseDelay: 10 * time.Millisecond, MaxDelay: 100 * time.Millisecond, MaxAttempts: 1000},
		Logger:       quiet(),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			require.NoError(t, <-errc)
		}
	}
	t.Cleanup(stop)
	return p, stop
}

// waitAll polls until the consumer has seen every id at least once and the publisher has
// recorded them all as delivered; it returns how many deliveries were duplicates.
func (e *e2e) waitAll(t *testing.T, p *outbox.Publisher, ids map[string]bool, within time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := e.b.received()
		seen := map[string]int{}
		for _, d := range got {
			require.True(t, ids[d.MessageId], "unexpected message %s", d.MessageId)
			seen[d.MessageId]++
		}
		if len(seen) == len(ids) && p.Stats().Delivered >= int64(len(ids)) {
			return len(got) - len(seen)
		}
		if time.Now().After(deadline) {
			t.Fatalf("received %d of %d distinct messages, publisher stats %+v", len(seen), len(ids), p.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestEndToEnd: a Publisher drains a PostgreSQL outbox through the transport to a real
// consumer, which receives every message; the test logs the throughput.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	e := e2eSetup(t)
	const n = 3000
	ids := e.enqueue(t, n)
	tr := newTransport(t, outboxamqp.Options{URL: e.b.url})
	start := time.Now()
	p, stop := e.run(t, tr)
	dups := e.waitAll(t, p, ids, 60*time.Second)
	elapsed := time.Since(start)
	stop()
	s := p.Stats()
	require.Zero(t, s.Dead)
	require.Zero(t, s.Retried)
	require.Zero(t, dups, "duplicates without any failure")
	t.Logf("end to end: %d messages PostgreSQL -> RabbitMQ -> consumer in %s: %.0f msg/s", n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds())
}

// TestEndToEndOutage: the broker is cut away from the publisher mid-run. The failed
// batches open the publisher's circuit and keep their attempts, nothing is dead-lettered, and once the broker is back every message
// arrives at least once; the duplicates (RabbitMQ has no publisher-side deduplication) are
// counted.
func TestEndToEndOutage(t *testing.T) {
	t.Parallel()
	e := e2eSetup(t)
	const n = 3000
	ids := e.enqueue(t, n/2)
	u, proxy := proxied(t, e.b.url)
	tr := newTransport(t, outboxamqp.Options{URL: u, ReconnectMin: 20 * time.Millisecond, ReconnectMax: 100 * time.Millisecond})
	p, stop := e.run(t, tr)

	e.b.waitFor(t, 100, 30*time.Second)
	proxy.Cut()
	// Rows committed during the outage: the first half may all be confirmed by now.
	maps.Copy(ids, e.enqueue(t, n/2))
	deadline := time.Now().Add(30 * time.Second)
	for !p.Stats().CircuitOpen { // the batches fail Unavailable and the circuit opens
		require.True(t, time.Now().Before(deadline), "the circuit did not open during the outage: %+v", p.Stats())
		time.Sleep(10 * time.Millisecond)
	}
	during := len(e.b.received())
	proxy.Restore()

	dups := e.waitAll(t, p, ids, 60*time.Second)
	stop()
	s := p.Stats()
	require.Zero(t, s.Dead)
	require.Positive(t, s.Unavailable)
	t.Logf("outage: %d received before the broker came back, %d attempts given back, %d duplicate deliveries of %d messages", during, s.Unavailable, dups, n)
}
