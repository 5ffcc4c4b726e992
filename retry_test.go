package outbox_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
)

func TestRetryPolicyBackoff(t *testing.T) {
	t.Parallel()
	p := outbox.RetryPolicy{BaseDelay: time.Second, MaxDelay: time.Minute}
	for attempts, want := range map[int]time.Duration{
		0: time.Second, 1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second,
		6: 32 * time.Second, 7: time.Minute, 1000: time.Minute, math.MaxInt: time.Minute,
	} {
		require.Equal(t, want, p.Backoff(attempts), "attempts %d", attempts)
	}
	// Doubling must clamp, never overflow into a negative or zero delay.
	huge := outbox.RetryPolicy{BaseDelay: time.Second, MaxDelay: math.MaxInt64}
	prev := time.Duration(0)
	for attempts := 1; attempts < 200; attempts++ {
		d := huge.Backoff(attempts)
		require.GreaterOrEqual(t, d, prev, "attempts %d: backoff must never shrink", attempts)
		prev = d
		j := huge.Jittered(attempts)
		require.True(t, j >= d/2 && j <= d, "attempts %d: jittered %s outside [%s, %s]", attempts, j, d/2, d)
	}
	require.Equal(t, time.Duration(math.MaxInt64), huge.Backoff(199))
}

// TestSettleNamesEachRowOnce: a settle or renewal that names a row under two leases (it
// was claimed again, and only the latest lease can hold) is refused with a validation error
// before anything changes. Reported by row, the stale lease would pass for applied. The
// same lease repeated is one row.
func TestSettleNamesEachRowOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.SQLite(t)
	require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{}))
	store, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	require.NoError(t, err)
	_, err = store.EnqueueStandalone(ctx, outbox.Message{Namespace: "n", Topic: "t", Payload: []byte(`{}`)}, outbox.Message{Namespace: "n", Topic: "t", Payload: []byte(`{}`)})
	require.NoError(t, err)
	recs, err := store.Claim(ctx, outbox.ClaimOptions{Scope: outbox.Scope{Namespace: "n"}, Limit: 2, Lease: time.Minute, MaxAttempts: 3, WorkerID: "w"})
	require.NoError(t, err)
	require.Len(t, recs, 2)
	x, y := recs[0].Lease(), recs[1].Lease()
	stale := outbox.Lease{ID: x.ID, Token: uuid.New()}

	for name, err := range map[string]error{
		"ack":    store.Ack(ctx, x, y, stale),
		"nack":   store.Nack(ctx, outbox.RetryPolicy{}, outbox.Failure{Lease: stale, Err: errors.New("e")}, outbox.Failure{Lease: x, Err: errors.New("e")}),
		"extend": store.Extend(ctx, time.Minute, stale, x),
	} {
		var ve *outbox.ValidationError
		require.ErrorAs(t, err, &ve, name)
		require.ErrorIs(t, err, outbox.ErrInvalid, name)
		require.Contains(t, ve.Error(), x.ID.String(), name)
	}
	_, _, err = store.CompleteAndClaim(ctx, []outbox.Outcome{{Lease: x, Status: outbox.StatusDelivered}, {Lease: stale, Status: outbox.StatusDelivered}},
		outbox.ClaimOptions{Scope: outbox.Scope{Namespace: "n"}, Limit: 1, Lease: time.Minute, MaxAttempts: 3, WorkerID: "w"})
	require.ErrorIs(t, err, outbox.ErrInvalid)
	for _, l := range []outbox.Lease{x, y} {
		r, err := store.Get(ctx, l.ID)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusProcessing, r.Status, "refused calls change nothing")
	}
	require.NoError(t, store.Extend(ctx, time.Minute, x, x), "the same lease twice")
	require.NoError(t, store.Ack(ctx, x, y, x))
}
