package outbox_test

import (
	"context"
	"database/sql"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
)

const (
	listenerStopped = "outbox publisher: wake-up listener stopped"
	listenerBack    = "outbox publisher: wake-up listener is back"
)

// When the SQLite database file is removed under a running publisher, its listener can no
// longer hear other processes: it stops, and keeps failing to come back. The publisher
// says so once, as a warning (later failures are debug lines), and polls: a row enqueued
// afterwards is delivered all the same.
func TestSQLiteListenerFileRemovedFallsBackToPolling(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "outbox.db")
	db, err := sql.Open("sqlite", testdb.SQLiteDSN(file))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	// The pool's connections stay open on the removed file: it never opens a new one,
	// which would create an empty file in its place.
	const conns = 3
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{}))
	held := make([]*sql.Conn, conns)
	for i := range held {
		held[i], err = db.Conn(ctx)
		require.NoError(t, err)
	}
	for _, c := range held {
		require.NoError(t, c.Close())
	}
	store, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	require.NoError(t, err)

	logs := &logCounter{Handler: testLogger(t).Handler()}
	opts := fastOptions(t, "n")
	opts.Logger = slog.New(logs)
	rec := newRecorder(nil)
	p, err := outbox.NewPublisher(store, rec.transport("p"), opts)
	require.NoError(t, err)
	start(t, p)
	testdb.Poll(t, wakeWithin, "the listener to hold a connection", func() bool { return db.Stats().InUse >= 1 })
	testdb.Poll(t, wakeWithin, "Stats to say the listener is connected", func() bool {
		return p.Stats().Listener == outbox.ListenerConnected
	})
	id := commitOne(t, db, store, "n")
	testdb.Poll(t, wakeWithin, "a delivery before the removal", func() bool { return len(rec.seen(id)) > 0 })

	require.NoError(t, os.Remove(file))
	testdb.Poll(t, wakeWithin, "the listener to fail to come back three times", func() bool {
		return logs.count("DEBUG "+listenerStopped) >= 3
	})
	id = commitOne(t, db, store, "n")
	testdb.Poll(t, wakeWithin, "a delivery by polling", func() bool { return len(rec.seen(id)) > 0 })
	require.Equal(t, 1, logs.count("WARN "+listenerStopped), "the outage is logged once, as a warning")
	require.Zero(t, logs.count("INFO "+listenerBack))
	require.Equal(t, outbox.ListenerDown, p.Stats().Listener, "the listener is wanted and cannot come back")
}

// When MySQL kills the listener's connection, the publisher says so once, polls, and
// says once more when the listener is back; rows are delivered throughout.
func TestMySQLListenerKilledFallsBackToPolling(t *testing.T) {
	t.Parallel()
	e := pubSetup(t, "mysql")
	logs := &logCounter{Handler: testLogger(t).Handler()}
	opts := fastOptions(t, "n")
	opts.Logger = slog.New(logs)
	rec := newRecorder(nil)
	d := &readyNotifier{Dialect: outbox.MySQL(), ready: make(chan struct{})}
	p, err := outbox.NewPublisher(e.newStore(t, e.db, d), rec.transport("p"), opts)
	require.NoError(t, err)
	start(t, p)
	select {
	case <-d.ready:
	case <-time.After(wakeWithin):
		t.Fatal("the listener was not ready in time")
	}

	admin := e.openPool(t)
	rows, err := admin.Query(`SELECT ID FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND ID <> CONNECTION_ID()`)
	require.NoError(t, err)
	var ids []int64
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, ids)
	for _, id := range ids {
		_, _ = admin.Exec(`KILL ?`, id) // a connection may have closed meanwhile
	}
	testdb.Poll(t, wakeWithin, "the listener to stop", func() bool { return logs.count("WARN "+listenerStopped) >= 1 })
	id := commitOne(t, e.db, e.store, "n")
	testdb.Poll(t, wakeWithin, "a delivery after the kill", func() bool { return len(rec.seen(id)) > 0 })
	testdb.Poll(t, wakeWithin, "the listener to be back", func() bool { return logs.count("INFO "+listenerBack) == 1 })
	require.Equal(t, 1, logs.count("WARN "+listenerStopped), "the outage is logged once, as a warning")
	testdb.Poll(t, wakeWithin, "Stats to say the listener is connected", func() bool {
		return p.Stats().Listener == outbox.ListenerConnected
	})

	// A publisher that polls by design (on a pool of its own: publishers of one pool and
	// table share one listener) has no listener to be down.
	polling := fastOptions(t, "m")
	polling.Logger = testLogger(t)
	quiet, err := outbox.New(e.openPool(t), outbox.MySQL(), outbox.Options{DisableNotify: true})
	require.NoError(t, err)
	q, err := outbox.NewPublisher(quiet, rec.transport("q"), polling)
	require.NoError(t, err)
	start(t, q)
	id = commitOne(t, e.db, e.store, "m")
	testdb.Poll(t, wakeWithin, "a delivery", func() bool { return len(rec.seen(id)) > 0 })
	require.Equal(t, outbox.ListenerNone, q.Stats().Listener)
	require.Equal(t, outbox.ListenerNone, outbox.PublisherStats{}.Listener)
}

// readyNotifier is a dialect with a Notifier that reports when its listener is first
// ready. It hides the dialect's other optional abilities, which a publisher does without.
type readyNotifier struct {
	outbox.Dialect
	ready chan struct{}
	once  sync.Once
}

func (d *readyNotifier) Signal(ctx context.Context, q dialect.DBTX, t dialect.Table, ns string) error {
	return d.Dialect.(dialect.Notifier).Signal(ctx, q, t, ns)
}

func (d *readyNotifier) Listen(ctx context.Context, db *sql.DB, t dialect.Table, ready func(), wake func(string)) error {
	return d.Dialect.(dialect.Notifier).Listen(ctx, db, t, func() {
		ready()
		d.once.Do(func() { close(d.ready) })
	}, wake)
}
