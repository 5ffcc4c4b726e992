package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/testdb"
)

// slowPolling are publisher options whose polling is too slow to explain a delivery within
// the tests' deadlines: only a wake-up can. Their observer tells startIdle when the
// publisher's first claim has come back empty.
func slowPolling(t *testing.T, ns string) outbox.PublisherOptions {
	o := fastOptions(t, ns)
	o.PollInterval = 30 * time.Second
	o.IdleBackoffMax = 30 * time.Second
	o.Lease = 2 * time.Minute
	o.SweepInterval = time.Hour
	o.Observer = &idleWatch{}
	return o
}

// idleWatch counts a publisher's claims that found nothing.
type idleWatch struct{ empty atomic.Int64 }

func (*idleWatch) StartPublish(ctx context.Context, _ []outbox.Delivery) context.Context {
	return ctx
}
func (*idleWatch) EndPublish(context.Context, []outbox.Delivery, []outbox.AttemptResult) {}
func (*idleWatch) Settled(context.Context, []outbox.Settled)                             {}
func (*idleWatch) StartClaim(ctx context.Context) context.Context                        { return ctx }
func (w *idleWatch) EndClaim(_ context.Context, n int, err error) {
	if n == 0 && err == nil {
		w.empty.Add(1)
	}
}

// wakeWithin is how long a woken publisher may take to deliver on a loaded test machine:
// far below slowPolling's poll interval.
const wakeWithin = 10 * time.Second

// startIdle starts p, made with slowPolling's options o, and waits until its first claim
// has found nothing, so that what it delivers afterwards was enqueued while it was idle:
// polling would take 30 s now.
func startIdle(t *testing.T, o outbox.PublisherOptions, p *outbox.Publisher) {
	t.Helper()
	w := o.Observer.(*idleWatch)
	start(t, p)
	testdb.Poll(t, wakeWithin, "the publisher's first empty claim", func() bool { return w.empty.Load() > 0 })
	require.Zero(t, p.Stats().Claimed)
}

// commitOne enqueues one message in a business transaction on s and commits it.
func commitOne(t *testing.T, db *sql.DB, s *outbox.Store, ns string) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	res, err := s.Enqueue(ctx, tx, outbox.Message{Namespace: ns, Topic: "t", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	return res.ID
}

// An enqueue on the publisher's own Store wakes it in the same process, on every backend:
// the row is delivered long before the next poll.
func TestWakeInProcess(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		rec := newRecorder(nil)
		o := slowPolling(t, "n")
		p, err := outbox.NewPublisher(e.store, rec.transport("p"), o)
		require.NoError(t, err)
		startIdle(t, o, p)
		for range 3 {
			id := commitOne(t, e.db, e.store, "n")
			testdb.Poll(t, wakeWithin, "a woken delivery", func() bool { return len(rec.seen(id)) > 0 })
		}
		// Another namespace does not wake it.
		other := commitOne(t, e.db, e.store, "other")
		require.Equal(t, outbox.StatusPending, e.get(t, other).Status)
	})
}

// Publisher.Wake lets a signal of the user's own wake a publisher: here rows written by
// another Store, as another process would, to a publisher whose Store does not listen for
// other processes' commits (DisableNotify).
func TestWakeByHand(t *testing.T) {
	t.Parallel()
	e := pubSetup(t, "sqlite")
	rec := newRecorder(nil)
	quiet, err := outbox.New(e.db, outbox.SQLite(), outbox.Options{DisableNotify: true})
	require.NoError(t, err)
	o := slowPolling(t, "n")
	p, err := outbox.NewPublisher(quiet, rec.transport("p"), o)
	require.NoError(t, err)
	p.Wake() // not running: nothing happens, nothing blocks
	startIdle(t, o, p)
	other := e.newStore(t, e.openPool(t), outbox.SQLite())
	id := commitOne(t, e.db, other, "n")
	time.Sleep(200 * time.Millisecond) // the other store's enqueue woke nobody...
	require.Empty(t, rec.seen(id))
	p.Wake() // ...until the user's signal
	testdb.Poll(t, wakeWithin, "delivery after Wake", func() bool { return len(rec.seen(id)) > 0 })
}

// On PostgreSQL an enqueue from another process (another pool and Store) wakes the
// publisher through LISTEN/NOTIFY, also after the listener's connection was killed.
func TestWakeAcrossProcessesPostgres(t *testing.T) {
	t.Parallel()
	e := pubSetup(t, "postgres")
	app := "outbox_listen_" + uuid.NewString()[:8]
	u, err := url.Parse(e.dsn)
	require.NoError(t, err)
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	pubDB, err := sql.Open("pgx", u.String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = pubDB.Close() })

	rec := newRecorder(nil)
	o := slowPolling(t, "n")
	p, err := outbox.NewPublisher(e.newStore(t, pubDB, outbox.Postgres()), rec.transport("p"), o)
	require.NoError(t, err)
	startIdle(t, o, p)
	listening := func() int {
		var n int
		require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'`, app).Scan(&n))
		return n
	}
	testdb.Poll(t, wakeWithin, "the listener", func() bool { return listening() == 1 })

	producer := e.newStore(t, e.openPool(t), outbox.Postgres())
	id := commitOne(t, e.db, producer, "n")
	testdb.Poll(t, wakeWithin, "a delivery woken by NOTIFY", func() bool { return len(rec.seen(id)) > 0 })

	_, err = e.db.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'`, app)
	require.NoError(t, err)
	testdb.Poll(t, wakeWithin, "the listener to reconnect", func() bool { return listening() == 1 })
	producer = e.newStore(t, e.openPool(t), outbox.Postgres()) // its own signal limiter
	id = commitOne(t, e.db, producer, "n")
	testdb.Poll(t, wakeWithin, "a delivery woken after the reconnect", func() bool { return len(rec.seen(id)) > 0 })
}

// Signal sends one notification per namespace at commit, none on rollback, and none with
// DisableNotify.
func TestPostgresSignalFollowsTheTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := pubSetup(t, "postgres")
	listener, err := pgx.Connect(ctx, e.dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = listener.Close(context.Background()) })
	_, err = listener.Exec(ctx, `LISTEN outbox_events`)
	require.NoError(t, err)
	var schema string
	require.NoError(t, listener.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema))
	next := func() (string, bool) {
		ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		for {
			n, err := listener.WaitForNotification(ctx)
			if errors.Is(err, context.DeadlineExceeded) {
				return "", false
			}
			require.NoError(t, err)
			if ns, ok := strings.CutPrefix(n.Payload, schema+":"); ok { // other tests' schemas share the channel
				return ns, true
			}
		}
	}
	enqueue := func(s *outbox.Store, commit bool, nss ...string) {
		tx, err := e.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		for _, ns := range nss {
			_, err := s.Enqueue(ctx, tx, outbox.Message{Namespace: ns, Topic: "t", Payload: json.RawMessage(`{}`)})
			require.NoError(t, err)
		}
		if commit {
			require.NoError(t, tx.Commit())
		} else {
			require.NoError(t, tx.Rollback())
		}
	}

	enqueue(e.store, true, "a", "a", "b", "a")
	got := map[string]bool{}
	for range 2 {
		ns, ok := next()
		require.True(t, ok, "a notification per namespace")
		got[ns] = true
	}
	require.Equal(t, map[string]bool{"a": true, "b": true}, got)
	_, ok := next()
	require.False(t, ok, "one notification per namespace and transaction")

	// A fresh Store each time: a Store sends at most one signal per namespace every 50ms.
	fresh := func(o outbox.Options) *outbox.Store {
		s, err := outbox.New(e.db, outbox.Postgres(), o)
		require.NoError(t, err)
		return s
	}
	enqueue(fresh(outbox.Options{}), false, "a")
	_, ok = next()
	require.False(t, ok, "a rolled-back enqueue signals nothing")

	enqueue(fresh(outbox.Options{DisableNotify: true}), true, "a")
	_, ok = next()
	require.False(t, ok, "DisableNotify sends nothing")

	enqueue(fresh(outbox.Options{LogLease: time.Minute}), true, "a")
	_, ok = next()
	require.False(t, ok, "a row leased to the log's reader gives polling nothing to claim: no signal")

	// The limiter: a burst of transactions on one Store sends one signal, and a later one
	// another.
	s := fresh(outbox.Options{})
	for range 5 {
		enqueue(s, true, "a")
	}
	ns, ok := next()
	require.True(t, ok)
	require.Equal(t, "a", ns)
	time.Sleep(60 * time.Millisecond) // past the limiter's 50ms
	enqueue(s, true, "a")
	_, ok = next()
	require.True(t, ok, "a signal after the limiter's window")
}

// TestPublisherFollowsAStreamFromAnotherProcess: where nothing wakes the publisher for rows
// that another process commits (no listener: here DisableNotify, so PostgreSQL too), a
// batch that found rows is followed by a quick poll, not by PollInterval: the second of two
// events committed elsewhere a little apart is delivered long before PollInterval passes.
func TestPublisherFollowsAStreamFromAnotherProcess(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		store, err := outbox.New(e.db, pubDialect(e.backend), outbox.Options{DisableNotify: true})
		require.NoError(t, err)
		o := fastOptions(t, "follow")
		o.PollInterval, o.IdleBackoffMax, o.Lease = 3*time.Second, 3*time.Second, 10*time.Second
		rec := newRecorder(nil)
		p, err := outbox.NewPublisher(store, rec.transport("p"), o)
		require.NoError(t, err)
		start(t, p)
		// The first claim finds nothing (the publisher then waits PollInterval): the first
		// event is delivered by the poll after that pause.
		first := e.enqueue(t, "follow", 1)
		e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == 1 })
		require.Equal(t, []int{1}, rec.seen(first[0]))
		// That claim found a partial batch: the next poll comes within about 10ms, and then
		// at pauses that double from there. An event committed 50ms later is found within
		// a second; with a pause of PollInterval after the batch it would wait 3s.
		time.Sleep(50 * time.Millisecond)
		second := e.enqueue(t, "follow", 1)
		committed := time.Now()
		e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == 2 })
		took := time.Since(committed)
		t.Logf("%s: the second event was delivered %s after its commit", e.backend, took.Round(time.Millisecond))
		require.Less(t, took, 1500*time.Millisecond, "a poll of PollInterval (3s) after the partial batch")
		require.Equal(t, []int{1}, rec.seen(second[0]))
	})
}
