package postgres_test

import (
	"strings"
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
	res, first := pgClaimFirst(t, b, pgKeyed("k", 0), pgKeyed("k", 1), pgKeyed("k", 2), pgKeyed("j", 0))
	// Leasing j's head, which only the top-up's search for heads reaches, fails.
	pgBeforeLease(t, b, "review_topup_fail", res[3].ID, `RAISE EXCEPTION 'top-up refused';`)
	next, lost, err := pgContinueFrom(b, first, pgRunOpts(4))
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
	res, first := pgClaimFirst(t, b, pgKeyed("a", 0), pgKeyed("b", 0), pgKeyed("a", 1), pgKeyed("a", 2))
	next, _, err := pgContinueFrom(b, first, pgRunOpts(2))
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{res[2].ID, res[3].ID}, pgRecIDs(next), "a's run, before b's older head")
}

// TestPostgresContinueTopUpNeedsTheLease: the top-up after a continued claim runs in a
// transaction of its own, so it first checks that the rows the claim leased are still
// processing under its lease; when one is not (here a trigger changes it as it is leased: as
// if its lease had been taken over, or the row put back, in between), the batch comes back
// short rather than with j's head, or with the row put back claimed a second time.
func TestPostgresContinueTopUpNeedsTheLease(t *testing.T) {
	t.Parallel()
	for name, change := range map[string]string{
		"taken over": `NEW.lease_token := gen_random_uuid(); RETURN NEW;`,
		"put back":   `NEW.status := 'pending'; RETURN NEW;`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			table := "outbox_review_topup_" + strings.ReplaceAll(name, " ", "_")
			b := pgRunsSetup(t, table)
			res, first := pgClaimFirst(t, b, pgKeyed("k", 0), pgKeyed("k", 1), pgKeyed("k", 2), pgKeyed("j", 0))
			pgBeforeLease(t, b, table+"_change", res[2].ID, change)
			next, _, err := pgContinueFrom(b, first, pgRunOpts(4))
			require.NoError(t, err)
			require.Equal(t, []uuid.UUID{res[1].ID, res[2].ID}, pgRecIDs(next), "k's run; no top-up")
			require.Equal(t, 1, b.count(t, `status = 'pending' AND id = '`+res[3].ID.String()+`'`), "j's head left for another claim")
		})
	}
}

// TestPostgresContinueTopUpAfterTheLeaseRanOut: a continued claim whose lease runs out before
// its top-up (a 3 ms lease, a statement slowed by 30 ms) does not top up: its search for heads
// would find the leased row claimable again and put it in the batch twice.
func TestPostgresContinueTopUpAfterTheLeaseRanOut(t *testing.T) {
	t.Parallel()
	b := pgRunsSetup(t, "outbox_review_topup_expired")
	res, first := pgClaimFirst(t, b, pgKeyed("k", 0), pgKeyed("k", 1), pgKeyed("j", 0))
	pgBeforeLease(t, b, "review_topup_slow", res[1].ID, `PERFORM pg_sleep(0.03); RETURN NEW;`)
	o := pgRunOpts(4)
	o.Lease = 3 * time.Millisecond
	next, _, err := pgContinueFrom(b, first, o)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{res[1].ID}, pgRecIDs(next), "k's run once; no top-up")
	require.Equal(t, 1, b.count(t, `status = 'pending' AND id = '`+res[2].ID.String()+`'`), "j's head left for another claim")
}

// pgBeforeLease installs a trigger, name, that runs body (PL/pgSQL statements) before each
// lease of the pending row id, as the claim's UPDATE sets it processing.
func pgBeforeLease(t *testing.T, b *pgBundle, name string, id uuid.UUID, body string) {
	t.Helper()
	_, err := b.db.ExecContext(b.ctx, `CREATE FUNCTION `+name+`() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN `+body+` END $$`)
	require.NoError(t, err)
	_, err = b.db.ExecContext(b.ctx, `CREATE TRIGGER `+name+` BEFORE UPDATE ON "`+b.table+`" FOR EACH ROW`+
		` WHEN (NEW.id = '`+id.String()+`'::uuid AND OLD.status = 'pending' AND NEW.status = 'processing') EXECUTE FUNCTION `+name+`()`)
	require.NoError(t, err)
}

// pgClaimFirst enqueues msgs and claims the first of them alone, in order, with runs.
func pgClaimFirst(t *testing.T, b *pgBundle, msgs ...outbox.Message) ([]outbox.Result, outbox.Record) {
	t.Helper()
	res := b.enqueue(t, msgs...)
	first, err := b.store.Claim(b.ctx, pgRunOpts(1))
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{res[0].ID}, pgRecIDs(first))
	return res, first[0]
}

// pgContinueFrom settles first as delivered with a claim that continues its key (o with
// Continue).
func pgContinueFrom(b *pgBundle, first outbox.Record, o outbox.ClaimOptions) ([]outbox.Record, []uuid.UUID, error) {
	o.Continue = true
	return b.store.CompleteAndClaim(b.ctx, []outbox.Outcome{{Lease: first.Lease(), Status: outbox.StatusDelivered}}, o)
}
