package sqlite_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

// TestSQLiteContinueNotPastLostLease: a settle that lost a lease continues no key. A run's
// leases ran out, another claimer took the key's head again, and the first claimer's settle
// still delivers the row after it (its lease there was not taken): continuing the key from
// that row would claim the next one while the other claimer holds the head.
func TestSQLiteContinueNotPastLostLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, db := newSQLiteStore(ctx, t)
	require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{Ordered: true}))
	var msgs []outbox.Message
	for range 4 {
		msgs = append(msgs, outbox.Message{Namespace: "n", Topic: "t", PartitionKey: "k", Payload: []byte(`{}`)})
	}
	_, err := s.EnqueueStandalone(ctx, msgs...)
	require.NoError(t, err)
	o := outbox.ClaimOptions{Scope: outbox.Scope{Namespace: "n"}, Limit: 2, Lease: time.Minute, MaxAttempts: 5, WorkerID: "a", Ordered: true, Runs: true}
	first, err := s.Claim(ctx, o)
	require.NoError(t, err)
	require.Len(t, first, 2)
	_, err = db.ExecContext(ctx, `UPDATE outbox_events SET locked_until = 0 WHERE status = 'processing'`) // both leases run out
	require.NoError(t, err)
	other := o
	other.Limit, other.Runs, other.WorkerID = 1, false, "b"
	head, err := s.Claim(ctx, other)
	require.NoError(t, err)
	require.Len(t, head, 1)
	require.Equal(t, first[0].ID, head[0].ID, "the other claimer holds the key's head")

	o.Continue = true
	next, lost, err := s.CompleteAndClaim(ctx, outcomesOf(first), o)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{first[0].ID}, lost)
	require.Empty(t, next, "nothing of the key while the other claimer holds its head")
}
