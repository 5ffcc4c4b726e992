package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
)

// TestCompleteTx: outcomes settled on the caller's transaction land with its commit and
// vanish with its rollback, a lost lease is reported as by Complete, and a nil
// transaction is refused.
func TestCompleteTx(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ctx := context.Background()
		e.enqueue(t, "ns", 2)
		recs, err := e.store.Claim(ctx, outbox.ClaimOptions{Limit: 2, Lease: time.Minute, MaxAttempts: 5, WorkerID: "w"})
		require.NoError(t, err)
		require.Len(t, recs, 2)
		done := outbox.Outcome{Lease: recs[0].Lease(), Status: outbox.StatusDelivered}

		tx, err := e.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, e.store.CompleteTx(ctx, tx, done))
		require.NoError(t, tx.Rollback())
		r, err := e.store.Get(ctx, recs[0].ID)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusProcessing, r.Status, "rolled back with the transaction")

		tx, err = e.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		stale := outbox.Outcome{Lease: outbox.LogLeaseOf(recs[1].ID), Status: outbox.StatusDelivered} // not the claim's
		err = e.store.CompleteTx(ctx, tx, done, stale)
		var lost *outbox.LeaseLostError
		require.True(t, errors.As(err, &lost), "%v", err)
		require.Equal(t, recs[1].ID, lost.IDs[0])
		require.NoError(t, tx.Commit())
		r, err = e.store.Get(ctx, recs[0].ID)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusDelivered, r.Status, "committed with the transaction")

		require.ErrorIs(t, e.store.CompleteTx(ctx, nil, done), outbox.ErrInvalid)
	})
}
