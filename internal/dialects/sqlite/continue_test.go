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

// TestSQLiteContinues: SQLite implements Continue, which the conformance suite's
// OrderedClaimer/RunsContinue only skips for a dialect that ignores it. A key's next run comes
// before another key's older head when each key's share of the batch is two rows or more,
// and the older head first when it would be one row.
func TestSQLiteContinues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, db := newSQLiteStore(ctx, t)
	require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{Ordered: true}))
	var ids []uuid.UUID
	for _, k := range []string{"a", "a", "b", "b", "a", "a", "a"} {
		res, err := s.EnqueueStandalone(ctx, outbox.Message{Namespace: "n", Topic: "t", PartitionKey: k, Payload: []byte(`{}`)})
		require.NoError(t, err)
		ids = append(ids, res[0].ID)
	}
	o := outbox.ClaimOptions{Scope: outbox.Scope{Namespace: "n"}, Limit: 1, Lease: time.Minute, MaxAttempts: 5, WorkerID: "w", Ordered: true, Runs: true}
	first, err := s.Claim(ctx, o)
	require.NoError(t, err)
	require.Equal(t, ids[:1], recordIDs(first))
	o.Limit, o.Continue = 2, true
	next, _, err := s.CompleteAndClaim(ctx, outcomesOf(first), o)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{ids[1], ids[4]}, recordIDs(next), "key a continued, before b's older head")
	o.Limit = 1
	next, _, err = s.CompleteAndClaim(ctx, outcomesOf(next), o)
	require.NoError(t, err)
	require.Equal(t, ids[2:3], recordIDs(next), "a share of one row: the older head first")
}

func recordIDs(recs []outbox.Record) []uuid.UUID {
	out := make([]uuid.UUID, len(recs))
	for i, r := range recs {
		out[i] = r.ID
	}
	return out
}
