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
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
)

// TestPublisherPoolSizes runs a publisher on pools of 1 and 2 connections, with 1 and 4
// claim loops, ordered and not, with retention and without, on every backend. The pool is
// the application's too: half of a 240-message backlog (six events a partition key, six
// batches) is enqueued on it, in three transactions, while the publisher runs. Every message
// must be delivered within the deadline: no combination may hang (a path that holds one of
// the pool's connections while it waits for another, or a listener that keeps the only one).
// A hang needs claims, settles and enqueues to meet on the pool, not many rows in each: the
// batches are of 40 rows, the same six batches and three enqueues as 600 rows in batches of
// 100 made.
func TestPublisherPoolSizes(t *testing.T) {
	t.Parallel()
	const backlog = 240
	for _, backend := range pubBackends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			for _, pool := range []int{1, 2} {
				for _, loops := range []int{1, 4} {
					for _, ordered := range []bool{false, true} {
						for _, retention := range []bool{false, true} {
							name := fmt.Sprintf("pool%d/loops%d/ordered=%v/retention=%v", pool, loops, ordered, retention)
							t.Run(name, func(t *testing.T) {
								t.Parallel()
								e := pubSetup(t, backend)
								require.NoError(t, migrations.Up(context.Background(), e.db, e.backend, migrations.Options{Ordered: true}))
								poolCase(t, e, backlog, pool, loops, ordered, retention)
							})
						}
					}
				}
			}
		})
	}
}

// TestPublishersShareOnePool runs 1, 2, 4 and 8 Publishers (one per namespace, and all on
// one) on one Store whose pool, the application's too, allows 1, 2, 4 or 8 connections, and
// two Stores on one pool, on every backend. The library holds at most one connection for
// its listener and never the pool's last one; the application begins a transaction at
// once, every event is delivered, and the publishers stop on cancel.
func TestPublishersShareOnePool(t *testing.T) {
	t.Parallel()
	for _, backend := range pubBackends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			for _, pool := range []int{1, 2, 4, 8} {
				for _, n := range []int{1, 2, 4, 8} {
					for _, oneNamespace := range []bool{false, true} {
						t.Run(fmt.Sprintf("pool%d/publishers%d/one_namespace=%v", pool, n, oneNamespace), func(t *testing.T) {
							t.Parallel()
							sharedPoolCase(t, pubSetup(t, backend), pool, n, oneNamespace, 1)
						})
					}
				}
			}
			for _, pool := range []int{1, 2, 4} {
				t.Run(fmt.Sprintf("pool%d/two_stores", pool), func(t *testing.T) {
					t.Parallel()
					sharedPoolCase(t, pubSetup(t, backend), pool, 4, false, 2)
				})
			}
		})
	}
}

// sharedPoolCase runs n publishers on stores Stores of one pool of poolSize connections,
// then enqueues 10 events per publisher on the same pool and waits for all of them.
func sharedPoolCase(t *testing.T, e *pubEnv, poolSize, n int, oneNamespace bool, stores int) {
	ctx := context.Background()
	db := e.openPool(t)
	db.SetMaxOpenConns(poolSize)
	var ss []*outbox.Store
	for range stores {
		s, err := outbox.New(db, pubDialect(e.backend), outbox.Options{})
		require.NoError(t, err)
		ss = append(ss, s)
	}
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
	logs := &syncBuffer{}
	prefix := "shared_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	namespaces := make([]string, n)
	var stops []func()
	for i := range n {
		namespaces[i] = prefix
		if !oneNamespace {
			namespaces[i] = fmt.Sprintf("%s_%d", prefix, i)
		}
		pub, err := outbox.NewPublisher(ss[i%stores], tr, outbox.PublisherOptions{
			Scope:  outbox.Scope{Namespace: namespaces[i]},
			Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		})
		require.NoError(t, err)
		stops = append(stops, start(t, pub))
	}

	// The listener starts when the first publisher is ready, and only where the pool can
	// spare it a connection; a pool that cannot is said once.
	testdb.Poll(t, 60*time.Second, "every publisher started", func() bool {
		return strings.Count(logs.String(), "outbox publisher started") == n
	})
	want := 0
	if poolSize > 1 {
		want = 1
	}
	require.Equal(t, want, outbox.ListenerConns(db), "listeners on one pool and table")
	warnings := 1 - want
	require.Equal(t, warnings, strings.Count(logs.String(), "not listening for wake-ups from other processes"), "one warning per pool:\n%s", logs.String())

	// The application is never starved of its pool.
	begin, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tx, err := db.BeginTx(begin, nil)
	require.NoError(t, err, "the application could not begin a transaction on the publishers' pool")
	var ids []uuid.UUID
	for i := range n {
		msgs := make([]outbox.Message, 10)
		for j := range msgs {
			msgs[j] = outbox.Message{Namespace: namespaces[i], Topic: "t", Payload: json.RawMessage(`{}`)}
		}
		res, err := ss[i%stores].EnqueueBatch(ctx, tx, msgs)
		require.NoError(t, err)
		for _, r := range res {
			ids = append(ids, r.ID)
		}
	}
	require.NoError(t, tx.Commit())
	testdb.Poll(t, 60*time.Second, "every event delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(delivered) == len(ids)
	})
	require.Equal(t, want, outbox.ListenerConns(db), "listeners on one pool and table")
	for _, stop := range stops {
		stop()
	}
	require.Equal(t, 0, outbox.ListenerConns(db), "the last publisher out stops the listener")
	// Within a deadline, not at once: CI saw one connection in use at the moment the last
	// Run returned (once in 2,260 tests, not reproduced here); a leak never gives it back.
	testdb.Poll(t, 5*time.Second, "every connection back in the pool after every publisher stopped", func() bool { return db.Stats().InUse == 0 })
}

// poolCase drains backlog messages, in batches of backlog/6 over backlog/6 partition keys,
// through a publisher whose store, and the producer's, is a pool of poolSize connections.
func poolCase(t *testing.T, e *pubEnv, backlog, poolSize, loops int, ordered, retention bool) {
	ctx := context.Background()
	db := e.openPool(t)
	db.SetMaxOpenConns(poolSize)
	store, err := outbox.New(db, pubDialect(e.backend), outbox.Options{})
	require.NoError(t, err)
	ns := "pool_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	batch := backlog / 6

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
		BatchSize:      batch,
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
			msgs[i] = outbox.Message{Namespace: ns, Topic: "t", PartitionKey: fmt.Sprint((from + i) % batch),
				Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, from+i))}
		}
		_, err = store.EnqueueBatch(ctx, tx, msgs)
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
	}
	enqueue(0, backlog/2)
	stop := start(t, pub)
	for i := backlog / 2; i < backlog; i += batch {
		enqueue(i, batch)
	}
	// A hang (a path that holds one connection while it waits for another) shows as deliveries
	// that stop; a slow machine only makes them slower, so the test waits for progress, not
	// for a total within a deadline.
	last, progressed := 0, time.Now()
	for n := count(); n < backlog; n = count() {
		if n > last {
			last, progressed = n, time.Now()
		}
		if time.Since(progressed) > 30*time.Second {
			s := db.Stats()
			t.Fatalf("delivered %d of %d, none in the last 30s (pool: max %d, open %d, in use %d, waits %d)",
				n, backlog, s.MaxOpenConnections, s.OpenConnections, s.InUse, s.WaitCount)
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
