package outboxwebhook_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
	"github.com/outboxgo/outbox/outboxtest/testdb"
	"github.com/outboxgo/outbox/transport/webhook"
)

// receiver is a webhook endpoint that verifies every request and counts deliveries per id.
type receiver struct {
	mu       sync.Mutex
	seen     map[string]int
	bad      int
	failFrom func(id string, attempt int) int // a status to answer instead of 204, or 0
}

func (rc *receiver) handle(secret string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		id := r.Header.Get("webhook-id")
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if verify(secret, r.Header, body) != nil {
			rc.bad++
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if rc.failFrom != nil {
			var attempt int
			_, _ = fmt.Sscan(r.Header.Get(outboxwebhook.HeaderAttempt), &attempt)
			if code := rc.failFrom(id, attempt); code != 0 {
				w.Header().Set("Retry-After", "0")
				w.WriteHeader(code)
				return
			}
		}
		rc.seen[id]++
		w.WriteHeader(http.StatusNoContent)
	}
}

func (rc *receiver) counts() (distinct, total, bad int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, n := range rc.seen {
		total += n
	}
	return len(rc.seen), total, rc.bad
}

// runE2E enqueues n events in PostgreSQL, runs a Publisher through the webhook transport to
// a TLS receiver until every event is recorded as delivered, and returns the publisher's
// stats, the receiver and the elapsed time.
func runE2E(t *testing.T, n int, rc *receiver) (outbox.PublisherStats, time.Duration) {
	t.Helper()
	db := testdb.Postgres(t)
	ctx := context.Background()
	require.NoError(t, migrations.Up(ctx, db, "postgres", migrations.Options{}))
	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{})
	require.NoError(t, err)
	for start := 0; start < n; start += 500 {
		var msgs []outbox.Message
		for i := start; i < min(start+500, n); i++ {
			msgs = append(msgs, outbox.Message{Namespace: "shop", Topic: "order.created", Payload: fmt.Appendf(nil, `{"order":%d}`, i)})
		}
		_, err := store.EnqueueStandalone(ctx, msgs...)
		require.NoError(t, err)
	}

	secret := newSecret()
	rc.seen = map[string]int{}
	srv := httptest.NewTLSServer(rc.handle(secret))
	t.Cleanup(srv.Close)
	// The test server's client trusts its certificate; keep as many idle connections as
	// requests in flight, or most requests would pay a TLS handshake.
	client := srv.Client()
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = 16
	tr := newTransport(t, outboxwebhook.Options{URL: srv.URL + "/{namespace}/{topic}", Secret: secret, Client: client, Concurrency: 16})
	p, err := outbox.NewPublisher(store, tr, outbox.PublisherOptions{
		Scope: outbox.Scope{Namespace: "shop"}, BatchSize: 100, PollInterval: 10 * time.Millisecond,
		Retry:  outbox.RetryPolicy{BaseDelay: 10 * time.Millisecond, MaxDelay: 100 * time.Millisecond, MaxAttempts: 100},
		Logger: slog.New(slog.DiscardHandler),
		OnDead: func(_ context.Context, dl outbox.DeadLetter) { t.Errorf("dead: %s: %s", dl.ID, dl.Reason) },
	})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- p.Run(runCtx) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		distinct, _, _ := rc.counts()
		if distinct == n && p.Stats().Delivered >= int64(n) {
			break
		}
		if time.Now().After(deadline) || p.Stats().Dead > 0 {
			cancel()
			<-errc
			t.Fatalf("receiver saw %d of %d events; publisher stats %+v", distinct, n, p.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	elapsed := time.Since(start)
	cancel()
	require.NoError(t, <-errc)
	return p.Stats(), elapsed
}

// TestEndToEnd: a Publisher drains a PostgreSQL outbox to a real HTTPS receiver that
// verifies every signature; every event arrives once. The test logs the throughput.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	const n = 3000
	rc := &receiver{}
	s, elapsed := runE2E(t, n, rc)
	distinct, total, bad := rc.counts()
	require.Equal(t, n, distinct)
	require.Equal(t, n, total)
	require.Zero(t, bad)
	require.Zero(t, s.Dead)
	require.Zero(t, s.Retried)
	t.Logf("end to end: %d events PostgreSQL -> webhook (TLS, 16 concurrent) in %s: %.0f msg/s", n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds())
}

// TestEndToEndRetries: the receiver answers 503 (with Retry-After: 0) to the first attempt
// of every fifth event and 429 to the second attempt of every tenth; they are retried and
// delivered, none is dead, and each is received once.
func TestEndToEndRetries(t *testing.T) {
	t.Parallel()
	const n = 500
	var mu sync.Mutex
	order := map[string]int{}
	seen := map[string]int{}
	// By the requests seen, not by the attempt number: a first 503 gives the attempt back, so
	// a message answered 503 comes again as the same attempt.
	rc := &receiver{failFrom: func(id string, attempt int) int {
		mu.Lock()
		k, ok := order[id]
		if !ok {
			k = len(order)
			order[id] = k
		}
		seen[id]++
		nth := seen[id]
		mu.Unlock()
		switch {
		case k%5 == 0 && nth == 1:
			return http.StatusServiceUnavailable // a first refusal: no attempt spent
		case k%10 == 0 && nth == 2:
			return http.StatusTooManyRequests // a retry: one attempt spent
		}
		return 0
	}}
	s, _ := runE2E(t, n, rc)
	distinct, total, bad := rc.counts()
	require.Equal(t, n, distinct)
	require.Equal(t, n, total)
	require.Zero(t, bad)
	require.Zero(t, s.Dead)
	require.EqualValues(t, n/10, s.Retried)
	require.EqualValues(t, n/5, s.Unavailable)
}

// TestRefusedForever: the endpoint answers 503 for good to one event and accepts every other.
// The endpoint is not down: the event's refusal beside the rest of its batch keeps its
// attempt, and every later one, retried alone, spends one, so it is dead-lettered at the
// attempt limit instead of being retried forever; the circuit never opens, and the other
// events are delivered once each.
func TestRefusedForever(t *testing.T) {
	t.Parallel()
	const n, maxAttempts = 50, 4
	db := testdb.Postgres(t)
	ctx := context.Background()
	require.NoError(t, migrations.Up(ctx, db, "postgres", migrations.Options{}))
	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{})
	require.NoError(t, err)
	var msgs []outbox.Message
	for i := range n {
		msgs = append(msgs, outbox.Message{Namespace: "shop", Topic: "order.created", Payload: fmt.Appendf(nil, `{"order":%d}`, i)})
	}
	res, err := store.EnqueueStandalone(ctx, msgs...)
	require.NoError(t, err)
	refused := res[7].ID.String()

	secret := newSecret()
	var mu sync.Mutex
	refusals := 0
	rc := &receiver{seen: map[string]int{}, failFrom: func(id string, _ int) int {
		if id != refused {
			return 0
		}
		mu.Lock()
		refusals++
		mu.Unlock()
		return http.StatusServiceUnavailable
	}}
	srv := httptest.NewServer(rc.handle(secret))
	t.Cleanup(srv.Close)
	tr := newTransport(t, outboxwebhook.Options{URL: srv.URL + "/{namespace}/{topic}", Secret: secret, AllowHTTP: true})
	var dead []outbox.DeadLetter
	p, err := outbox.NewPublisher(store, tr, outbox.PublisherOptions{
		Scope: outbox.Scope{Namespace: "shop"}, BatchSize: 100, PollInterval: 10 * time.Millisecond,
		Retry:  outbox.RetryPolicy{BaseDelay: 10 * time.Millisecond, MaxDelay: 20 * time.Millisecond, MaxAttempts: maxAttempts},
		Logger: slog.New(slog.DiscardHandler),
		OnDead: func(_ context.Context, dl outbox.DeadLetter) { mu.Lock(); dead = append(dead, dl); mu.Unlock() },
	})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- p.Run(runCtx) }()
	deadline := time.Now().Add(30 * time.Second)
	for p.Stats().Dead == 0 || p.Stats().Delivered < n-1 {
		if time.Now().After(deadline) {
			cancel()
			<-errc
			t.Fatalf("not settled within 30s: %+v, %d refusals", p.Stats(), refusals)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	require.NoError(t, <-errc)

	s := p.Stats()
	require.EqualValues(t, 1, s.Dead)
	require.EqualValues(t, n-1, s.Delivered)
	require.Zero(t, s.CircuitOpens)
	require.EqualValues(t, 1, s.Unavailable, "the first refusal")
	distinct, total, bad := rc.counts()
	require.Equal(t, []int{n - 1, n - 1, 0}, []int{distinct, total, bad})
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, maxAttempts+1, refusals, "one free refusal, then one per attempt")
	require.Len(t, dead, 1)
	require.Equal(t, refused, dead[0].ID.String())
	require.ErrorIs(t, dead[0].Err, outbox.ErrAttemptLimit)
	rec, err := store.Get(ctx, dead[0].ID)
	require.NoError(t, err)
	require.Equal(t, maxAttempts, rec.Attempts)
}
