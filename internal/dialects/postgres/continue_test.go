package postgres_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
)

// TestPostgresContinueTopUpFails: a claim that continues keys and tops the batch up with a
// search for heads commits once: when the top-up fails, nothing of the claim is left, the
// settle included, and the caller settles again.
func TestPostgresContinueTopUpFails(t *testing.T) {
	t.Parallel()
	b := pgRunsSetup(t, "outbox_review_topup")
	res := b.enqueue(t, pgKeyed("k", 0), pgKeyed("k", 1), pgKeyed("k", 2), pgKeyed("j", 0))
	first, err := b.store.Claim(b.ctx, pgRunOpts(1))
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{res[0].ID}, pgRecIDs(first))
	// Leasing j's head, which only the top-up's search for heads reaches, fails.
	_, err = b.db.ExecContext(b.ctx, `CREATE FUNCTION review_topup_fail() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'top-up refused'; END $$`)
	require.NoError(t, err)
	_, err = b.db.ExecContext(b.ctx, `CREATE TRIGGER review_topup_fail BEFORE UPDATE ON "`+b.table+`" FOR EACH ROW`+
		` WHEN (NEW.id = '`+res[3].ID.String()+`'::uuid AND NEW.status = 'processing') EXECUTE FUNCTION review_topup_fail()`)
	require.NoError(t, err)
	o := pgRunOpts(4)
	o.Continue = true
	_, _, err = b.store.CompleteAndClaim(b.ctx, []outbox.Outcome{{Lease: first[0].Lease(), Status: outbox.StatusDelivered}}, o)
	require.ErrorContains(t, err, "top-up refused")
	require.Equal(t, 1, b.count(t, `status = 'processing'`), "the first row still held, under its lease")
	require.Equal(t, 3, b.count(t, `status = 'pending'`), "the continued run rolled back with the top-up")
	require.NoError(t, b.store.Ack(b.ctx, first[0].Lease()), "the caller settles again")
}

// TestPostgresContinues: PostgreSQL honours Continue, which the conformance suite only
// checks when a dialect does (OrderedClaimer/RunsContinue skips otherwise): the delivered
// key's next run comes before another key's older head.
func TestPostgresContinues(t *testing.T) {
	t.Parallel()
	b := pgRunsSetup(t, "outbox_review_continues")
	res := b.enqueue(t, pgKeyed("a", 0), pgKeyed("b", 0), pgKeyed("a", 1), pgKeyed("a", 2))
	first, err := b.store.Claim(b.ctx, pgRunOpts(1))
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{res[0].ID}, pgRecIDs(first))
	o := pgRunOpts(2)
	o.Continue = true
	next, _, err := b.store.CompleteAndClaim(b.ctx, []outbox.Outcome{{Lease: first[0].Lease(), Status: outbox.StatusDelivered}}, o)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{res[2].ID, res[3].ID}, pgRecIDs(next), "a's run, before b's older head")
}
