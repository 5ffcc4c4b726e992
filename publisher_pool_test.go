package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

// TestPublisherPoolSizes runs a publisher on pools of 1, 2 and 4 connections, with 1, 2
// and 4 claim loops, ordered and not, with retention and without, with cross-process
// wake-ups and without, on every backend. The pool is the application's too: half of a
// 600-message backlog (six events a partition key) is enqueued on it while the publisher
// runs. Every message must be delivered within the deadline: no combination may hang (a
// path that holds one of the pool's connections while it waits for another, or a listener
// that keeps the only one).
func TestPublisherPoolSizes(t *testing.T) {
	t.Parallel()
	const backlog = 600
	for _, backend := range pubBackends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			for _, pool := range []int{1, 2, 4} {
				for _, loops := range []int{1, 2, 4} {
					for _, ordered := range []bool{false, true} {
						for _, retention := range []bool{false, true} {
							for _, wake := range []bool{false, true} {
								name := fmt.Sprintf("pool%d/loops%d/ordered=%v/retention=%v/wake=%v", pool, loops, ordered, retention, wake)
								t.Run(name, func(t *testing.T) {
									// Each combination on a database of its own, beside the others:
									// one after another, with a backlog of 2,000, they took nine minutes under the race
									// detector on SQLite.
									t.Parallel()
									e := pubSetup(t, backend)
									require.NoError(t, migrations.Up(context.Background(), e.db, e.backend, migrations.Options{Ordered: true}))
									poolCase(t, e, backlog, pool, loops, ordered, retention, wake)
								})
							}
						}
					}
				}
			}
		})
	}
}

// poolCase drains backlog messages through a publisher whose store, and the producer's,
// is a pool of poolSize connections.
func poolCase(t *testing.T, e *pubEnv, backlog, poolSize, loops int, ordered, retention, wake bool) {
	ctx := context.Background()
	db := e.openPool(t)
	db.SetMaxOpenConns(poolSize)
	store, err := outbox.New(db, pubDialect(e.backend), outbox.Options{DisableNotify: !wake})
	require.NoError(t, err)
	ns := "pool_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")

	var mu sync.Mutex
	delivered := map[uuid.UUID]bool{}
	tr := outbox.TransportFunc(func(ctx context.Context, batch []outbox.Delivery) []error {
		mu.Lock()
		defer mu.Unlock()
		for _, d := range batch {
			delivered[d.ID] = true
		}
		return make([]error, len(batch))
	})
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(delivered)
	}
	opts := outbox.PublisherOptions{
		Scope:          outbox.Scope{Namespace: ns},
		BatchSize:      100,
		Concurrency:    loops,
		Ordered:        ordered,
		PollInterval:   20 * time.Millisecond,
		IdleBackoffMax: 100 * time.Millisecond,
		Logger:         slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if retention {
		opts.Retention = outbox.Retention{Delivered: time.Millisecond, Interval: 50 * time.Millisecond}
	}
	pub, err := outbox.NewPublisher(store, tr, opts)
	require.NoError(t, err)

	enqueue := func(from, n int) {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			msgs[i] = outbox.Message{Namespace: ns, Topic: "t", PartitionKey: fmt.Sprint((from + i) % 100),
				Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, from+i))}
		}
		_, err = store.EnqueueBatch(ctx, tx, msgs)
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
	}
	enqueue(0, backlog/2)
	stop := start(t, pub)
	for i := backlog / 2; i < backlog; i += 100 {
		enqueue(i, 100)
	}
	deadline := time.Now().Add(60 * time.Second)
	for count() < backlog {
		if time.Now().After(deadline) {
			s := db.Stats()
			t.Fatalf("delivered %d of %d in 60s (pool: max %d, open %d, in use %d, waits %d)",
				count(), backlog, s.MaxOpenConnections, s.OpenConnections, s.InUse, s.WaitCount)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
}

// TestPublisherWarnsWhenStarved: a publisher on a one-connection pool whose connection a
// long transaction holds says so once, with the pool's counters, and delivers once it is
// released.
func TestPublisherWarnsWhenStarved(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ctx := context.Background()
		db := e.openPool(t)
		db.SetMaxOpenConns(1)
		store, err := outbox.New(db, pubDialect(e.backend), outbox.Options{DisableNotify: true})
		require.NoError(t, err)
		ids := e.enqueue(t, "starved", 3)
		logs := &syncBuffer{}
		opts := fastOptions(t, "starved")
		opts.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
		rec := newRecorder(nil)
		pub, err := outbox.NewPublisher(store, rec.transport("p"), opts)
		require.NoError(t, err)
		// The publisher checks the table at start: let it, then take the pool's connection.
		stop := start(t, pub)
		require.Eventually(t, func() bool { return strings.Contains(logs.String(), "outbox publisher started") }, 30*time.Second, 10*time.Millisecond)
		conn, err := db.Conn(ctx)
		require.NoError(t, err)
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(logs.String(), " has waited 5s for the database") {
			require.True(t, time.Now().Before(deadline), "no warning about the starved claim within 30s:\n%s", logs.String())
			time.Sleep(20 * time.Millisecond)
		}
		require.Contains(t, logs.String(), "every connection of the pool is in use (1 of db.SetMaxOpenConns(1))")
		require.Contains(t, logs.String(), "pool_wait_count=")
		require.NoError(t, conn.Close())
		for _, id := range ids {
			require.Eventually(t, func() bool { return len(rec.seen(id)) > 0 }, 30*time.Second, 10*time.Millisecond, "delivered after the connection was released")
		}
		require.Eventually(t, func() bool { return strings.Contains(logs.String(), "the database answers in time again") }, 30*time.Second, 10*time.Millisecond)
		stop()
		require.Equal(t, 1, strings.Count(logs.String(), " has waited 5s for the database"), "one warning per episode:\n%s", logs.String())
	})
}
