package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
)

func TestSmokeSQLite(t *testing.T) {
	ctx := context.Background()
	db := testdb.SQLite(t)
	require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{}))
	s, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	require.NoError(t, err)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	r, err := s.Enqueue(ctx, tx, outbox.Message{Namespace: "n", Topic: "t", DedupeKey: "k", Payload: []byte(`{"a": 1}`), Headers: outbox.Headers{"x": "y"}})
	require.NoError(t, err)
	r2, err := s.Enqueue(ctx, tx, outbox.Message{Namespace: "n", Topic: "t", DedupeKey: "k", Payload: []byte(`{}`)})
	require.NoError(t, err)
	require.True(t, r2.Duplicate)
	rs, err := s.EnqueueBatch(ctx, tx, []outbox.Message{{Namespace: "n", Topic: "t", DedupeKey: "k", Payload: []byte(`1`)}, {Namespace: "n", Topic: "t", DedupeKey: "k2", Payload: []byte(`2`)}})
	require.NoError(t, err)
	require.True(t, rs[0].Duplicate)
	require.False(t, rs[1].Duplicate)
	require.NoError(t, tx.Commit())
	recs, err := s.Claim(ctx, outbox.ClaimOptions{Limit: 10, Lease: time.Minute, MaxAttempts: 3, WorkerID: "w"})
	require.NoError(t, err)
	require.Len(t, recs, 2)
	require.Equal(t, r.ID, recs[0].ID)
	require.Equal(t, `{"a": 1}`, string(recs[0].Payload))
	require.Equal(t, "y", recs[0].Headers["x"])
	require.NoError(t, s.Ack(ctx, recs[0].Lease()))
	require.NoError(t, s.Nack(ctx, outbox.RetryPolicy{}, outbox.Failure{Lease: recs[1].Lease(), Attempts: 1, Err: outbox.Permanent(nil)}))
	got, err := s.Get(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivered, got.Status)
	require.ErrorIs(t, s.Ack(ctx, recs[0].Lease()), outbox.ErrLeaseLost)
	t.Logf("%+v", got)
	require.NoError(t, migrations.Down(ctx, db, "sqlite", migrations.Options{}))
}
