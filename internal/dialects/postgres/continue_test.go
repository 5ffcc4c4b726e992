package postgres_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
)

// TestPostgresContinueTopUpFails: a claim that continues keys commits its settle and the
// runs it leased before it tops the batch up with a search for heads; when the top-up
// fails, those stand, the claim returns them without an error (the caller must not settle
// again: its outcomes are applied), and the top-up leaves nothing behind.
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
	next, lost, err := b.store.CompleteAndClaim(b.ctx, []outbox.Outcome{{Lease: first[0].Lease(), Status: outbox.StatusDelivered}}, o)
	require.NoError(t, err)
	require.Empty(t, lost)
	require.Equal(t, []uuid.UUID{res[1].ID, res[2].ID}, pgRecIDs(next), "k's run, without j's head")
	require.Equal(t, 1, b.count(t, `status = 'delivered'`), "the settle applied")
	require.Equal(t, 2, b.count(t, `status = 'processing'`), "k's run leased")
	require.Equal(t, 1, b.count(t, `status = 'pending' AND id = '`+res[3].ID.String()+`'`), "j's head untouched")
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

// TestPostgresContinueTopUpNeedsTheLease: the top-up after a continued claim runs in a
// transaction of its own, so it first checks that the rows the claim leased are still under
// its lease; when one is not (here a trigger gives it another token as it is leased, as if
// its lease had run out and been taken over in between), the batch comes back short.
func TestPostgresContinueTopUpNeedsTheLease(t *testing.T) {
	t.Parallel()
	b := pgRunsSetup(t, "outbox_review_topup_lease")
	res := b.enqueue(t, pgKeyed("k", 0), pgKeyed("k", 1), pgKeyed("k", 2), pgKeyed("j", 0))
	first, err := b.store.Claim(b.ctx, pgRunOpts(1))
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{res[0].ID}, pgRecIDs(first))
	_, err = b.db.ExecContext(b.ctx, `CREATE FUNCTION review_topup_steal() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.lease_token := gen_random_uuid(); RETURN NEW; END $$`)
	require.NoError(t, err)
	_, err = b.db.ExecContext(b.ctx, `CREATE TRIGGER review_topup_steal BEFORE UPDATE ON "`+b.table+`" FOR EACH ROW`+
		` WHEN (NEW.id = '`+res[2].ID.String()+`'::uuid AND NEW.status = 'processing') EXECUTE FUNCTION review_topup_steal()`)
	require.NoError(t, err)
	o := pgRunOpts(4)
	o.Continue = true
	next, _, err := b.store.CompleteAndClaim(b.ctx, []outbox.Outcome{{Lease: first[0].Lease(), Status: outbox.StatusDelivered}}, o)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{res[1].ID, res[2].ID}, pgRecIDs(next), "k's run; no top-up")
	require.Equal(t, 1, b.count(t, `status = 'pending' AND id = '`+res[3].ID.String()+`'`), "j's head left for another claim")
}

// TestPostgresContinueTopUpAfterTheLeaseRanOut: a continued claim whose lease runs out before
// its top-up (a 3 ms lease, a statement slowed by 30 ms) does not top up: its search for heads
// would find the leased row claimable again and put it in the batch twice.
func TestPostgresContinueTopUpAfterTheLeaseRanOut(t *testing.T) {
	t.Parallel()
	b := pgRunsSetup(t, "outbox_review_topup_expired")
	res := b.enqueue(t, pgKeyed("k", 0), pgKeyed("k", 1), pgKeyed("j", 0))
	first, err := b.store.Claim(b.ctx, pgRunOpts(1))
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{res[0].ID}, pgRecIDs(first))
	_, err = b.db.ExecContext(b.ctx, `CREATE FUNCTION review_topup_slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.03); RETURN NEW; END $$`)
	require.NoError(t, err)
	_, err = b.db.ExecContext(b.ctx, `CREATE TRIGGER review_topup_slow BEFORE UPDATE ON "`+b.table+`" FOR EACH ROW`+
		` WHEN (NEW.id = '`+res[1].ID.String()+`'::uuid AND OLD.status = 'pending' AND NEW.status = 'processing') EXECUTE FUNCTION review_topup_slow()`)
	require.NoError(t, err)
	o := pgRunOpts(4)
	o.Continue, o.Lease = true, 3*time.Millisecond
	next, _, err := b.store.CompleteAndClaim(b.ctx, []outbox.Outcome{{Lease: first[0].Lease(), Status: outbox.StatusDelivered}}, o)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{res[1].ID}, pgRecIDs(next), "k's run once; no top-up")
	require.Equal(t, 1, b.count(t, `status = 'pending' AND id = '`+res[2].ID.String()+`'`), "j's head left for another claim")
}
