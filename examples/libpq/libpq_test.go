package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/conformance"
	"github.com/outboxgo/outbox/migrations"
	"github.com/outboxgo/outbox/outboxtest/testdb"
)

// TestMain closes the shared admin pool before it looks for leaked goroutines.
func TestMain(m *testing.M) {
	code := m.Run()
	if admin != nil {
		_ = admin.Close()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

var (
	adminOnce sync.Once
	admin     *sql.DB
	adminErr  error
)

// openFresh returns a lib/pq pool whose search_path is a new schema, dropped when t ends.
// The schema is created and dropped on an admin pool, also lib/pq; search_path is a DSN
// parameter, which lib/pq sends to the server as a run-time parameter of every connection.
func openFresh(t testing.TB) *sql.DB { return openWith(t) }

// openWith is openFresh with extra DSN parameters, as key=value pairs.
func openWith(t testing.TB, params ...string) *sql.DB {
	t.Helper()
	adminOnce.Do(func() {
		admin, adminErr = sql.Open("postgres", testdb.PostgresDSN())
		if adminErr == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			adminErr = admin.PingContext(ctx)
		}
	})
	if adminErr != nil {
		testdb.Unavailable(t, "postgres", adminErr)
	}
	schema := "outbox_libpq_" + uuid.NewString()[:8]
	_, err := admin.Exec(`CREATE SCHEMA ` + schema)
	require.NoError(t, err)
	u, err := url.Parse(testdb.PostgresDSN())
	require.NoError(t, err)
	q := u.Query()
	q.Set("search_path", schema)
	for _, kv := range params {
		k, v, _ := strings.Cut(kv, "=")
		q.Set(k, v)
	}
	u.RawQuery = q.Encode()
	db, err := sql.Open("postgres", u.String())
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = db.Close()
		if _, err := admin.Exec(`DROP SCHEMA ` + schema + ` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return db
}

// The search_path DSN parameter must reach the server, or every test would share the
// public schema and the suite below would prove nothing about isolation.
func TestSearchPathParameter(t *testing.T) {
	db := openFresh(t)
	var sp string
	require.NoError(t, db.QueryRow(`SHOW search_path`).Scan(&sp))
	require.Contains(t, sp, "outbox_libpq_")
}

// The PostgreSQL dialect passes the whole conformance suite over lib/pq.
func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.Harness{Dialect: outbox.Postgres(), OpenDB: openFresh})
}

// And with binary_parameters=yes, where lib/pq sends []byte arguments in binary.
func TestConformanceBinaryParameters(t *testing.T) {
	conformance.Run(t, conformance.Harness{Dialect: outbox.Postgres(), OpenDB: func(t testing.TB) *sql.DB {
		return openWith(t, "binary_parameters=yes")
	}})
}

// A Publisher delivers over lib/pq end to end: a batch with dedupe keys and headers
// enqueued in a business transaction, a rolled-back one that must never be delivered, a
// failure that is retried and a permanent one that is dead-lettered.
func TestPublisher(t *testing.T) {
	ctx := context.Background()
	db := openFresh(t)
	require.NoError(t, migrations.Up(ctx, db, "postgres", migrations.Options{}))
	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{})
	require.NoError(t, err)
	require.NoError(t, store.Check(ctx))

	_, err = db.Exec(`CREATE TABLE orders (id bigint PRIMARY KEY)`)
	require.NoError(t, err)
	msg := func(topic, key string) outbox.Message {
		return outbox.Message{Namespace: "shop", Topic: topic, DedupeKey: key,
			Headers: outbox.Headers{"content-type": "application/json"}, Payload: []byte(`{"order": 1}`)}
	}

	// begin starts a transaction that is rolled back at the end of the test if it is
	// still open: an open one would hold locks that keep the schema from being dropped.
	begin := func() *sql.Tx {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback() })
		return tx
	}

	// Committed: three events, one of them twice under one dedupe key.
	tx := begin()
	_, err = tx.Exec(`INSERT INTO orders (id) VALUES (1)`)
	require.NoError(t, err)
	res, err := store.EnqueueBatch(ctx, tx, []outbox.Message{
		msg("order.created", "order-1/created"), msg("order.paid", "order-1/paid"),
		msg("order.shipped", "order-1/shipped"), msg("order.created", "order-1/created"),
	})
	require.NoError(t, err)
	require.Equal(t, []bool{false, false, false, true}, duplicates(res))
	r, err := store.Enqueue(ctx, tx, msg("order.paid", "order-1/paid"))
	require.NoError(t, err, "a duplicate leaves the transaction usable")
	require.True(t, r.Duplicate)
	require.NoError(t, tx.Commit())

	// Rolled back: its event must never be published.
	tx = begin()
	_, err = store.Enqueue(ctx, tx, msg("order.cancelled", ""))
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())

	var mu sync.Mutex
	seen := map[string][]int{} // topic → attempts seen
	tr := outbox.PerMessage(func(_ context.Context, d outbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		seen[d.Topic] = append(seen[d.Topic], d.Attempt)
		if d.Headers["content-type"] != "application/json" || string(d.Payload) != `{"order": 1}` {
			return outbox.Permanent(errors.New("delivery changed on the way"))
		}
		switch {
		case d.Topic == "order.paid" && d.Attempt == 1:
			return errors.New("broker busy")
		case d.Topic == "order.shipped":
			return outbox.Permanent(errors.New("no route"))
		}
		return nil
	})
	dead := make(chan outbox.DeadLetter, 10)
	pub, err := outbox.NewPublisher(store, tr, outbox.PublisherOptions{
		Scope:        outbox.Scope{Namespace: "shop"},
		Lease:        time.Second,
		PollInterval: 10 * time.Millisecond,
		Retry:        outbox.RetryPolicy{BaseDelay: 10 * time.Millisecond, MaxDelay: 20 * time.Millisecond},
		Logger:       slog.New(slog.DiscardHandler),
		OnDead:       func(_ context.Context, dl outbox.DeadLetter) { dead <- dl },
	})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- pub.Run(runCtx) }()
	stopped := false
	t.Cleanup(func() { // on failure too, so that the publisher never outlives its schema
		if !stopped {
			stop()
			<-errc
		}
	})

	require.Eventually(t, func() bool {
		s := pub.Stats()
		return s.Delivered == 2 && s.Dead == 1
	}, 10*time.Second, 10*time.Millisecond, "stats: %+v", pub.Stats())
	stop()
	stopped = true
	require.NoError(t, <-errc)

	dl := <-dead
	require.Equal(t, "order.shipped", dl.Topic)
	require.True(t, outbox.IsPermanent(dl.Err))
	mu.Lock()
	require.Equal(t, map[string][]int{"order.created": {1}, "order.paid": {1, 2}, "order.shipped": {1}}, seen)
	mu.Unlock()
	s := pub.Stats()
	require.Equal(t, outbox.PublisherStats{Claimed: 4, Delivered: 2, Retried: 1, Dead: 1}, s)

	counts := map[string]int{}
	rows, err := db.Query(`SELECT status, count(*) FROM outbox_events GROUP BY status`)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var st string
		var n int
		require.NoError(t, rows.Scan(&st, &n))
		counts[st] = n
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]int{"delivered": 2, "dead": 1}, counts)
}

func duplicates(rs []outbox.Result) []bool {
	out := make([]bool, len(rs))
	for i, r := range rs {
		out[i] = r.Duplicate
	}
	return out
}
