package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
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
	base := outbox.ClaimOptions{Scope: outbox.Scope{Namespace: "n"}, Limit: 10, Lease: time.Minute, MaxAttempts: 3, WorkerID: "w", Ordered: true}
	for _, bad := range []func(o *outbox.ClaimOptions){
		func(o *outbox.ClaimOptions) { o.Runs = true; o.Ordered = false },
		func(o *outbox.ClaimOptions) { o.RunShare = 2 },
		func(o *outbox.ClaimOptions) { o.Runs = true; o.RunShare = -1 },
		func(o *outbox.ClaimOptions) { o.Continue = true },
	} {
		o := base
		bad(&o)
		_, err = s.Claim(ctx, o)
		require.ErrorIs(t, err, outbox.ErrInvalid, "%+v", o)
	}
	o := base
	o.Runs, o.RunShare, o.Continue = true, 2, true
	recs, err := s.Claim(ctx, o)
	require.NoError(t, err)
	require.Empty(t, recs)
	for _, limit := range []int{0, outbox.MaxBatch + 1} {
		_, err = s.BlockedKeys(ctx, outbox.Scope{}, limit)
		require.ErrorIs(t, err, outbox.ErrInvalid)
	}
	keys, err := s.BlockedKeys(ctx, outbox.Scope{}, 10)
	require.NoError(t, err)
	require.Empty(t, keys)
}

// TestOrderedHotKeyNeedsNoPause: a key's next row is claimable once its head is settled, so
// an ordered publisher claims again at once after a batch that freed keys, and pauses only
// when a claim finds nothing. With every pause an hour long (a listener brings wake-ups, so
// polling is only a safety net), one key's 20 events must still all be delivered, in order.
func TestOrderedHotKeyNeedsNoPause(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ctx := context.Background()
		require.NoError(t, migrations.Up(ctx, e.db, e.backend, migrations.Options{Ordered: true}))
		store := e.store // its listener makes a partial batch pause PollInterval
		tx, err := e.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		msgs := make([]outbox.Message, 20)
		for i := range msgs {
			msgs[i] = outbox.Message{Namespace: "hot", Topic: "t", PartitionKey: "k", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
		}
		res, err := store.EnqueueBatch(ctx, tx, msgs)
		require.NoError(t, err)
		require.NoError(t, tx.Commit())

		var mu sync.Mutex
		var got []uuid.UUID
		tr := outbox.TransportFunc(func(ctx context.Context, batch []outbox.Delivery) []error {
			mu.Lock()
			defer mu.Unlock()
			for _, d := range batch {
				got = append(got, d.ID)
			}
			return make([]error, len(batch))
		})
		opts := fastOptions(t, "hot")
		opts.Ordered = true
		opts.PollInterval, opts.IdleBackoffMax, opts.Lease = time.Hour, time.Hour, 3*time.Hour
		pub, err := outbox.NewPublisher(store, tr, opts)
		require.NoError(t, err)
		start(t, pub)
		testdb.Poll(t, 30*time.Second, "the hot key's 20 events", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(got) == len(res)
		})
		mu.Lock()
		defer mu.Unlock()
		for i := range res {
			require.Equal(t, res[i].ID, got[i], "event %d out of order", i)
		}
	})
}
