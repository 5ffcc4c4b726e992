package outbox_test

import (
	"context"
	"errors"
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
