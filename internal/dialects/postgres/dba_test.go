package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
)

// The DBA's settings on the application's role: each ends in a clear error or a recovery,
// never a stuck publisher, an open transaction or a lost event.

// sqlState returns the SQLSTATE of err, "" when it has none.
func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// TestRoleTimeoutsOnEnqueue: an enqueue that waits for a racing producer's uncommitted
// dedupe key ends at the role's lock_timeout or statement_timeout with the server's error
// (55P03, 57014) on the caller's transaction, which the caller rolls back; its retry finds
// the key taken once the racer commits: one row, nothing lost.
func TestRoleTimeoutsOnEnqueue(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ setting, state string }{
		{"lock_timeout=200ms", "55P03"},
		{"statement_timeout=200ms", "57014"},
	} {
		t.Run(c.setting, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			r := testdb.NewRole(t, c.setting)
			db := r.Open(t, testdb.PostgresDSN())
			require.NoError(t, migrations.Up(ctx, db, "postgres", migrations.Options{}))
			store, err := outbox.New(db, outbox.Postgres(), outbox.Options{})
			require.NoError(t, err)
			msg := pgMsg(1)
			msg.DedupeKey = "order-1"

			racer, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			defer func() { _ = racer.Rollback() }()
			_, err = store.Enqueue(ctx, racer, msg)
			require.NoError(t, err)

			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			start := time.Now()
			_, err = store.Enqueue(ctx, tx, msg)
			require.Error(t, err, "the enqueue waits for the racer's key until the role's timeout")
			require.Equal(t, c.state, sqlState(err), "the server's error comes through: %v", err)
			require.Less(t, time.Since(start), 20*time.Second)
			require.NoError(t, tx.Rollback())

			require.NoError(t, racer.Commit())
			tx, err = db.BeginTx(ctx, nil)
			require.NoError(t, err)
			res, err := store.Enqueue(ctx, tx, msg)
			require.NoError(t, err)
			require.True(t, res.Duplicate, "the retry finds the racer's row")
			require.NoError(t, tx.Commit())
			var n int
			require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM outbox_events`).Scan(&n))
			require.Equal(t, 1, n)
		})
	}
}

// TestRoleLockTimeoutOnSettle: an operator's transaction that locks a row while the
// publisher has it in the transport makes the settle wait; the role's lock_timeout ends
// the wait with 55P03, the publisher retries the settle (saying so) and records the
// delivery once the operator is done: delivered once, not stuck behind the lock.
func TestRoleLockTimeoutOnSettle(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := testdb.NewRole(t, "lock_timeout=200ms")
	db := r.Open(t, testdb.PostgresDSN())
	require.NoError(t, migrations.Up(ctx, db, "postgres", migrations.Options{}))
	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{})
	require.NoError(t, err)

	inTransport := make(chan uuid.UUID, 1)
	release := make(chan struct{})
	var publishes atomic.Int64
	var logs lockedBuffer
	p, err := outbox.NewPublisher(store, outbox.PerMessage(func(ctx context.Context, d outbox.Delivery) error {
		if publishes.Add(1) == 1 {
			inTransport <- d.ID
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil
	}), outbox.PublisherOptions{
		Scope:  outbox.Scope{Namespace: "orders"},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	require.NoError(t, err)
	runPublisher(t, ctx, p)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	res, err := store.Enqueue(ctx, tx, pgMsg(1))
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	require.Equal(t, res.ID, <-inTransport)

	operator, err := testdb.Postgres(t).BeginTx(ctx, nil) // a superuser: no lock_timeout
	require.NoError(t, err)
	defer func() { _ = operator.Rollback() }()
	_, err = operator.ExecContext(ctx, `SELECT 1 FROM `+r.Schema+`.outbox_events WHERE id = $1 FOR UPDATE`, res.ID.String())
	require.NoError(t, err)
	close(release)
	testdb.Poll(t, 30*time.Second, "the settle to time out on the operator's lock", func() bool {
		return strings.Contains(logs.String(), "55P03")
	})
	require.NoError(t, operator.Rollback())
	testdb.Poll(t, 30*time.Second, "the retried settle to record the delivery", func() bool {
		var status string
		err := db.QueryRowContext(ctx, `SELECT status FROM outbox_events WHERE id = $1`, res.ID.String()).Scan(&status)
		return err == nil && status == "delivered"
	})
	require.EqualValues(t, 1, publishes.Load(), "delivered once")
}

// TestRoleIdleInTransactionTimeout: a Publisher holds no transaction open while it
// publishes, so a publish slower than the role's idle_in_transaction_session_timeout is
// acknowledged; a caller's transaction left idle past it is ended by the server, and its
// commit fails rather than reporting an event that was never stored.
func TestRoleIdleInTransactionTimeout(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const idle = 300 * time.Millisecond
	r := testdb.NewRole(t, "idle_in_transaction_session_timeout=300ms")
	db := r.Open(t, testdb.PostgresDSN())
	require.NoError(t, migrations.Up(ctx, db, "postgres", migrations.Options{}))
	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{})
	require.NoError(t, err)

	var logs lockedBuffer
	var delivered atomic.Int64
	p, err := outbox.NewPublisher(store, outbox.PerMessage(func(ctx context.Context, _ outbox.Delivery) error {
		select { // a publish three times as long as the server lets a transaction idle
		case <-time.After(3 * idle):
		case <-ctx.Done():
		}
		delivered.Add(1)
		return nil
	}), outbox.PublisherOptions{
		Scope:  outbox.Scope{Namespace: "orders"},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	require.NoError(t, err)
	runPublisher(t, ctx, p)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	res, err := store.Enqueue(ctx, tx, pgMsg(1))
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	testdb.Poll(t, 30*time.Second, "the slow publish to be acknowledged", func() bool {
		var status string
		err := db.QueryRowContext(ctx, `SELECT status FROM outbox_events WHERE id = $1`, res.ID.String()).Scan(&status)
		return err == nil && status == "delivered"
	})
	require.EqualValues(t, 1, delivered.Load())
	require.Empty(t, logs.String(), "no failed settle")

	// The caller's transaction, idle past the limit.
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	var pid int
	require.NoError(t, conn.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	tx, err = conn.BeginTx(ctx, nil)
	require.NoError(t, err)
	lost, err := store.Enqueue(ctx, tx, pgMsg(2))
	require.NoError(t, err)
	admin := testdb.Postgres(t)
	testdb.Poll(t, 30*time.Second, "the server to end the idle transaction's session", func() bool {
		var n int
		return admin.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n) == nil && n == 0
	})
	require.Error(t, tx.Commit(), "the commit of a transaction the server ended fails")
	var n int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM outbox_events WHERE id = $1`, lost.ID.String()).Scan(&n))
	require.Zero(t, n, "nothing was stored, and the caller was told")
}

// TestDMLOnlyRole: on a table an administrator migrated, a role with SELECT, INSERT, UPDATE
// and DELETE on it (and USAGE on its schema) passes Check, enqueues and publishes;
// migrations.Up needs more (the goose version table, CREATE on the schema), and says so
// with the server's permission error.
func TestDMLOnlyRole(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := testdb.NewRole(t)
	admin := testdb.Postgres(t)
	for _, st := range []string{
		`ALTER SCHEMA ` + r.Schema + ` OWNER TO CURRENT_USER`,
		`REVOKE ALL ON SCHEMA ` + r.Schema + ` FROM ` + r.Name,
		`GRANT USAGE ON SCHEMA ` + r.Schema + ` TO ` + r.Name,
	} {
		_, err := admin.ExecContext(ctx, st)
		require.NoError(t, err, st)
	}
	require.NoError(t, migrations.Up(ctx, admin, "postgres", migrations.Options{Schema: r.Schema}))
	_, err := admin.ExecContext(ctx, `GRANT SELECT, INSERT, UPDATE, DELETE ON `+r.Schema+`.outbox_events TO `+r.Name)
	require.NoError(t, err)

	db := r.Open(t, testdb.PostgresDSN())
	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{})
	require.NoError(t, err)
	require.NoError(t, store.Check(ctx), "a DML-only role passes the Store's check")
	delivered := make(chan uuid.UUID, 1)
	p, err := outbox.NewPublisher(store, outbox.PerMessage(func(_ context.Context, d outbox.Delivery) error {
		delivered <- d.ID
		return nil
	}), outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "orders"}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	runPublisher(t, ctx, p)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	res, err := store.Enqueue(ctx, tx, pgMsg(1))
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	select {
	case id := <-delivered:
		require.Equal(t, res.ID, id)
	case <-ctx.Done():
		t.Fatal("a DML-only role's publisher did not deliver")
	}
	_, err = store.Purge(ctx, outbox.PurgeOptions{DeliveredOlderThan: time.Nanosecond})
	require.NoError(t, err, "retention needs DELETE only")

	err = migrations.Up(ctx, db, "postgres", migrations.Options{})
	require.Error(t, err, "migrations need more than DML")
	require.Equal(t, "42501", sqlState(err), "the server's permission error: %v", err)
}

// TestRoleConnectionLimit: while the role's connections are all taken (its CONNECTION
// LIMIT, as max_connections would be), a starting Publisher says why it waits and retries;
// once one is free it delivers what was enqueued meanwhile.
func TestRoleConnectionLimit(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := testdb.NewRole(t)
	migrate := r.Open(t, testdb.PostgresDSN())
	require.NoError(t, migrations.Up(ctx, migrate, "postgres", migrations.Options{}))
	require.NoError(t, migrate.Close())
	admin := testdb.Postgres(t) // a superuser's pool: the limit is not its
	_, err := admin.ExecContext(ctx, `ALTER ROLE `+r.Name+` CONNECTION LIMIT 2`)
	require.NoError(t, err)

	// Take the role's connections until the server refuses one.
	hog := r.Open(t, testdb.PostgresDSN())
	var held []*sql.Conn
	for {
		c, err := hog.Conn(ctx)
		if err == nil {
			err = c.PingContext(ctx)
		}
		if err != nil {
			require.Equal(t, "53300", sqlState(err), "the role is at its limit: %v", err)
			break
		}
		held = append(held, c)
		require.LessOrEqual(t, len(held), 2, "CONNECTION LIMIT 2 holds")
	}
	db := r.Open(t, testdb.PostgresDSN())
	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{})
	require.NoError(t, err)
	var logs lockedBuffer
	delivered := make(chan uuid.UUID, 1)
	p, err := outbox.NewPublisher(store, outbox.PerMessage(func(_ context.Context, d outbox.Delivery) error {
		delivered <- d.ID
		return nil
	}), outbox.PublisherOptions{
		Scope:  outbox.Scope{Namespace: "orders"},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	require.NoError(t, err)
	runPublisher(t, ctx, p)
	testdb.Poll(t, 30*time.Second, "the publisher to say why it waits", func() bool {
		return strings.Contains(logs.String(), "too many connections")
	})

	producer, err := outbox.New(admin, outbox.Postgres(), outbox.Options{Schema: r.Schema, DisableNotify: true})
	require.NoError(t, err)
	tx, err := admin.BeginTx(ctx, nil)
	require.NoError(t, err)
	res, err := producer.Enqueue(ctx, tx, pgMsg(1))
	require.NoError(t, err)
	require.NoError(t, tx.Commit())

	for _, c := range held {
		require.NoError(t, c.Close())
	}
	require.NoError(t, hog.Close()) // closes the connections given back
	select {
	case id := <-delivered:
		require.Equal(t, res.ID, id)
	case <-time.After(30 * time.Second):
		t.Fatalf("not delivered once connections were free: %s", logs.String())
	}
}
