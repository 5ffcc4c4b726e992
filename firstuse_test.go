package outbox_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
)

var firstUseMsg = outbox.Message{Namespace: "n", Topic: "t", Payload: json.RawMessage(`{}`)}

// The first enqueue of a Store whose dialect does not match its pool returns the error Check
// gives, on the caller's transaction, which stays usable: on a pool of one connection, which
// the caller's transaction holds, the check needs no other.
func TestFirstUseWrongDialect(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, wrapped := range []bool{false, true} {
			db := e.openPool(t)
			if wrapped {
				// A driver the check does not know (as one wrapped for tracing is): the
				// server is asked for its version instead, on the caller's transaction.
				db = sql.OpenDB(wrappedConnector{dsn: e.dsn, d: wrappedDriver{db.Driver()}})
				t.Cleanup(func() { _ = db.Close() })
			}
			firstUseWrongDialect(t, ctx, e, db)
		}
	})
}

func firstUseWrongDialect(t *testing.T, ctx context.Context, e *pubEnv, db *sql.DB) {
	db.SetMaxOpenConns(1)
	_, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS first_use (n INT)`)
	require.NoError(t, err)
	for _, other := range pubBackends {
		if other == e.backend {
			continue
		}
		s, err := outbox.New(db, pubDialect(other), outbox.Options{})
		require.NoError(t, err)
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		_, err = s.Enqueue(ctx, tx, firstUseMsg)
		var ce *outbox.CheckError
		require.ErrorAs(t, err, &ce, "dialect %s on a %s pool", other, e.backend)
		require.ErrorContains(t, err, "but the dialect is "+other)
		// The caller's transaction is intact: it still reads, writes and commits.
		var before, after int
		require.NoError(t, tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM first_use`).Scan(&before), "the transaction survives the check")
		_, err = tx.ExecContext(ctx, `INSERT INTO first_use (n) VALUES (1)`)
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM first_use`).Scan(&after))
		require.Equal(t, before+1, after, "committed")
		// The same verdict again, without a query: EnqueueStandalone too.
		_, err = s.EnqueueStandalone(ctx, firstUseMsg)
		require.ErrorAs(t, err, &ce)
		require.Equal(t, s.Check(ctx).Error(), err.Error(), "the message Check gives")
	}
	// The right dialect enqueues as before.
	s, err := outbox.New(db, pubDialect(e.backend), outbox.Options{})
	require.NoError(t, err)
	_, err = s.EnqueueStandalone(ctx, firstUseMsg)
	require.NoError(t, err)
}

// wrappedDriver hides a driver's type, as tracing wrappers do.
type wrappedDriver struct{ driver.Driver }

type wrappedConnector struct {
	dsn string
	d   driver.Driver
}

func (c wrappedConnector) Connect(context.Context) (driver.Conn, error) { return c.d.Open(c.dsn) }
func (c wrappedConnector) Driver() driver.Driver                        { return c.d }

// SQLite without WAL or a busy timeout fails the first enqueue with Check's error, on a pool
// of one connection held by the caller's transaction; a check that met a cancelled context
// reached no verdict and is run again by the next enqueue.
func TestFirstUseSQLiteSettings(t *testing.T) {
	t.Parallel()
	for name, params := range map[string]string{
		"NoPragmas":     "",
		"NoBusyTimeout": "?_pragma=journal_mode(WAL)",
		"NoWAL":         "?_pragma=busy_timeout(10000)",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := firstUseContext(t)
			db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "x.db")+params)
			require.NoError(t, err)
			t.Cleanup(func() { _ = db.Close() })
			db.SetMaxOpenConns(1)
			require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{}))
			s, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
			require.NoError(t, err)

			// A cancelled context: no verdict, the enqueue fails as it would have.
			cctx, ccancel := context.WithCancel(ctx)
			tx, err := db.BeginTx(cctx, nil)
			require.NoError(t, err)
			ccancel()
			_, err = s.Enqueue(cctx, tx, firstUseMsg)
			require.ErrorIs(t, err, context.Canceled)
			_ = tx.Rollback()

			tx, err = db.BeginTx(ctx, nil)
			require.NoError(t, err)
			_, err = s.Enqueue(ctx, tx, firstUseMsg)
			require.ErrorIs(t, err, outbox.ErrMisconfigured)
			require.ErrorContains(t, err, "SQLITE_BUSY")
			require.ErrorContains(t, err, "_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate")
			require.NoError(t, tx.Commit(), "the transaction survives the check")
			require.Equal(t, s.Check(ctx).Error(), err.Error(), "the message Check gives")
			var n int
			require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox_events`).Scan(&n))
			require.Zero(t, n, "nothing was written")
		})
	}
	t.Run("Documented", func(t *testing.T) {
		t.Parallel()
		ctx := firstUseContext(t)
		db := testdb.SQLite(t)
		db.SetMaxOpenConns(1)
		require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{}))
		s, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
		require.NoError(t, err)
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		_, err = s.Enqueue(ctx, tx, firstUseMsg)
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
	})
	t.Run("InMemory", func(t *testing.T) {
		t.Parallel()
		ctx := firstUseContext(t)
		db, err := sql.Open("sqlite", "file:firstuse?mode=memory&cache=shared")
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		db.SetMaxOpenConns(1)
		require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{}))
		s, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
		require.NoError(t, err)
		_, err = s.EnqueueStandalone(ctx, firstUseMsg)
		require.NoError(t, err, "an in-memory database needs neither WAL nor a busy timeout")
	})
}

// firstUseContext bounds a test from when it runs (a parallel subtest may wait long for its
// turn after its parent returned).
func firstUseContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
