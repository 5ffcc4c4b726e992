package postgres_test

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

// pgHold locks ids in a transaction left open until the test ends, as a claimer or a
// settle in flight holds them.
func pgHold(t *testing.T, b *pgBundle, ids ...uuid.UUID) {
	t.Helper()
	tx, err := b.db.BeginTx(b.ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	strs := make([]string, len(ids))
	for i, id := range ids {
		strs[i] = id.String()
	}
	list, err := json.Marshal(strs)
	require.NoError(t, err)
	rows, err := tx.QueryContext(b.ctx, `SELECT id FROM "`+b.table+`" WHERE id::text IN (SELECT json_array_elements_text($1::json)) FOR UPDATE`, string(list))
	require.NoError(t, err)
	require.NoError(t, rows.Close())
}

func pgRunsSetup(t *testing.T, table string) *pgBundle {
	t.Helper()
	b := setupPostgres(t, table)
	require.NoError(t, migrations.Up(b.ctx, b.db, "postgres", migrations.Options{Table: table, Ordered: true}))
	return b
}

func pgKeyed(key string, i int) outbox.Message {
	return outbox.Message{Namespace: "orders", Topic: "t", PartitionKey: key, Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
}

func pgRunOpts(limit int) outbox.ClaimOptions {
	return outbox.ClaimOptions{Scope: outbox.Scope{Namespace: "orders"}, Limit: limit, Lease: time.Minute, MaxAttempts: 5,
		WorkerID: "w", Ordered: true, Runs: true}
}

func pgRecIDs(recs []outbox.Record) []uuid.UUID {
	ids := make([]uuid.UUID, len(recs))
	for i, r := range recs {
		ids[i] = r.ID
	}
	return ids
}

// TestPostgresRunShareSkipsHeldHeads: a claim that takes a share of the heads it found
// skips the heads another claimer holds locked and takes the next one.
func TestPostgresRunShareSkipsHeldHeads(t *testing.T) {
	t.Parallel()
	b := pgRunsSetup(t, "outbox_review_share")
	res := b.enqueue(t, pgKeyed("a", 0), pgKeyed("b", 0), pgKeyed("c", 0))
	pgHold(t, b, res[0].ID, res[1].ID)
	o := pgRunOpts(10)
	o.RunShare = 4
	recs, err := b.store.Claim(b.ctx, o)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{res[2].ID}, pgRecIDs(recs))
}

// TestPostgresRunsFillAfterLockCut: a key whose run the lock cut short in the first pass
// (a row after its head held by another transaction) gets nothing past that row, and the
// fill pass gives what it left to the key whose share was all claimed, from its share's
// last row on, none skipped.
func TestPostgresRunsFillAfterLockCut(t *testing.T) {
	t.Parallel()
	b := pgRunsSetup(t, "outbox_review_fill")
	var msgs []outbox.Message
	for i := range 12 {
		msgs = append(msgs, pgKeyed("a", i), pgKeyed("b", i))
	}
	res := b.enqueue(t, msgs...)
	var a, bk []uuid.UUID
	for i, m := range msgs {
		if m.PartitionKey == "a" {
			a = append(a, res[i].ID)
		} else {
			bk = append(bk, res[i].ID)
		}
	}
	pgHold(t, b, a[2]) // a's run stops before its third row
	recs, err := b.store.Claim(b.ctx, pgRunOpts(10))
	require.NoError(t, err)
	var gotA, gotB []uuid.UUID
	for _, r := range recs {
		if r.PartitionKey == "a" {
			gotA = append(gotA, r.ID)
		} else {
			gotB = append(gotB, r.ID)
		}
	}
	require.Equal(t, a[:2], gotA, "a's head and the row before the held one, nothing past it")
	require.Equal(t, bk[:8], gotB, "b fills the batch in sequence: its share, then from its share's last row")
}

// TestPostgresRunShareBeyondHeldBatch: with a batch of heads or more found, a shared claim
// takes a batch of them, and when another claimer holds the first batch's heads locked it
// takes the next ones. A claim that found only the first Limit heads and then locked them
// came back empty here, and two loops took half a batch each.
func TestPostgresRunShareBeyondHeldBatch(t *testing.T) {
	t.Parallel()
	b := pgRunsSetup(t, "outbox_review_share_batch")
	var msgs []outbox.Message
	for i := range 30 {
		msgs = append(msgs, pgKeyed(fmt.Sprintf("k%02d", i), 0))
	}
	res := b.enqueue(t, msgs...)
	var held []uuid.UUID
	for _, r := range res[:10] {
		held = append(held, r.ID)
	}
	pgHold(t, b, held...)
	o := pgRunOpts(10)
	o.RunShare = 2
	recs, err := b.store.Claim(b.ctx, o)
	require.NoError(t, err)
	want := make([]uuid.UUID, 10)
	for i, r := range res[10:20] {
		want[i] = r.ID
	}
	require.Equal(t, want, pgRecIDs(recs), "the ten heads after the held ones")
}
