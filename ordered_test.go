package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
)

// plainDialect hides every optional ability of the dialect it wraps, as a dialect written
// before ordered claims existed would have none.
type plainDialect struct{ outbox.Dialect }

// TestOrderedNeedsTheAbility: ordered claims, BlockedKeys and an ordered Publisher on a
// dialect without OrderedClaimer fail with errors.ErrUnsupported instead of claiming out of
// order; the dialect's Claim is never called with Ordered.
func TestOrderedNeedsTheAbility(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.SQLite(t)
	require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{}))
	s, err := outbox.New(db, plainDialect{outbox.SQLite()}, outbox.Options{})
	require.NoError(t, err)

	o := outbox.ClaimOptions{Limit: 1, Lease: time.Minute, MaxAttempts: 1, WorkerID: "w", Ordered: true}
	_, err = s.Claim(ctx, o)
	require.ErrorIs(t, err, errors.ErrUnsupported)
	require.ErrorContains(t, err, "sqlite cannot claim in order")
	_, err = s.BlockedKeys(ctx, outbox.Scope{}, 10)
	require.ErrorIs(t, err, errors.ErrUnsupported)
	noop := outbox.TransportFunc(func(context.Context, []outbox.Delivery) []error { return nil })
	_, err = outbox.NewPublisher(s, noop, outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "n"}, Ordered: true})
	require.ErrorIs(t, err, errors.ErrUnsupported)

	o.Ordered = false
	_, err = s.Claim(ctx, o)
	require.NoError(t, err, "unordered claims work as before")
	_, err = outbox.NewPublisher(s, noop, outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "n"}})
	require.NoError(t, err)
}

// TestOrderedOptionsValidate: OrderedSkipDead alone, and BlockedKeys' bounds, are refused.
func TestOrderedOptionsValidate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.SQLite(t)
	require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{Ordered: true}))
	s, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	require.NoError(t, err)
	noop := outbox.TransportFunc(func(context.Context, []outbox.Delivery) []error { return nil })
	_, err = outbox.NewPublisher(s, noop, outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "n"}, OrderedSkipDead: true})
	require.ErrorIs(t, err, outbox.ErrInvalid)
	_, err = outbox.NewPublisher(s, noop, outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "n"}, Ordered: true, OrderedSkipDead: true})
	require.NoError(t, err)
	for _, limit := range []int{0, outbox.MaxBatch + 1} {
		_, err = s.BlockedKeys(ctx, outbox.Scope{}, limit)
		require.ErrorIs(t, err, outbox.ErrInvalid)
	}
	keys, err := s.BlockedKeys(ctx, outbox.Scope{}, 10)
	require.NoError(t, err)
	require.Empty(t, keys)
}

// TestOrderedCheckRunsOnce: a Store looks for the order index before its first ordered claim
// and BlockedKeys, and not again once it was found: the claims' hot path runs no extra query.
func TestOrderedCheckRunsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, db, rec := newLoggedSQLiteStore(ctx, t)
	require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{Ordered: true}))
	_, err := s.EnqueueStandalone(ctx, outbox.Message{Namespace: "n", Topic: "t", PartitionKey: "k", Payload: []byte(`{}`)})
	require.NoError(t, err)
	rec.reset()
	o := outbox.ClaimOptions{Scope: outbox.Scope{Namespace: "n"}, Limit: 10, Lease: time.Minute, MaxAttempts: 5, WorkerID: "w", Ordered: true}
	for range 3 {
		_, err := s.Claim(ctx, o)
		require.NoError(t, err)
		_, _, err = s.CompleteAndClaim(ctx, nil, o)
		require.NoError(t, err)
		_, err = s.BlockedKeys(ctx, outbox.Scope{}, 10)
		require.NoError(t, err)
	}
	var checks int
	for _, q := range rec.all() {
		if strings.Contains(q, "sqlite_master") {
			checks++
		}
	}
	require.Equal(t, 1, checks, "the order index is looked for once per Store")
}

// TestPostgresOrderedIndexByHand: on a large table the order indexes may be built by hand
// with CREATE INDEX CONCURRENTLY under the migration's names, before the ordered set runs.
// One that failed is left invalid, which PostgreSQL never reads: ordered claims refuse it
// and say how to rebuild it, and accept it once it is.
func TestPostgresOrderedIndexByHand(t *testing.T) {
	t.Parallel()
	b := setupPostgres(t, "")
	pgOrdered := func(s *outbox.Store) error {
		_, err := s.Claim(b.ctx, outbox.ClaimOptions{Scope: outbox.Scope{Namespace: "orders"}, Limit: 10, Lease: time.Minute,
			MaxAttempts: 5, WorkerID: "w", Ordered: true})
		return err
	}
	fresh := func() *outbox.Store {
		s, err := outbox.New(b.db, outbox.Postgres(), outbox.Options{})
		require.NoError(t, err)
		return s
	}
	b.enqueue(t, pgMsg(1), pgMsg(2)) // one namespace twice: a unique index on it fails
	exec := func(q string) {
		_, err := b.db.ExecContext(b.ctx, q)
		require.NoError(t, err, q)
	}
	exec(`CREATE INDEX CONCURRENTLY "outbox_events_order_idx" ON "outbox_events" (namespace, partition_key, created_at, id)` +
		` WHERE partition_key IS NOT NULL AND status IN ('pending', 'processing', 'dead')`)
	err := pgOrdered(fresh())
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "lacks index outbox_events_unkeyed_idx:\nordered delivery (PublisherOptions.Ordered) needs the order index.\n")
	require.NotContains(t, err.Error(), "outbox_events_order_idx", "only what is missing")

	// A CREATE INDEX CONCURRENTLY that fails leaves an invalid index of that name.
	_, err = b.db.ExecContext(b.ctx, `CREATE UNIQUE INDEX CONCURRENTLY "outbox_events_unkeyed_idx" ON "outbox_events" (namespace)`)
	require.Error(t, err, "duplicate namespaces")
	err = pgOrdered(fresh())
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, `index outbox_events_unkeyed_idx of table "outbox_events" is invalid`)
	require.ErrorContains(t, err, `REINDEX INDEX CONCURRENTLY "outbox_events_unkeyed_idx"`)

	exec(`DROP INDEX CONCURRENTLY "outbox_events_unkeyed_idx"`)
	exec(`CREATE INDEX CONCURRENTLY "outbox_events_unkeyed_idx" ON "outbox_events" (namespace, created_at, id)` +
		` WHERE partition_key IS NULL AND status IN ('pending', 'processing')`)
	require.NoError(t, pgOrdered(fresh()), "indexes built by hand under the migration's names")
	require.NoError(t, migrations.Up(b.ctx, b.db, "postgres", migrations.Options{Ordered: true}), "the ordered set skips them")
	require.NoError(t, pgOrdered(fresh()))
}
