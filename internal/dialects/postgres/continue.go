package postgres

import (
	"context"
	"database/sql"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// pgCompleteAndContinue is CompleteAndClaim with [dialect.ClaimParams.Continue]: one
// statement (settleAndLease) settles the outcomes and leases the runs after the keys they
// delivered, on its own, without a transaction around it (BEGIN and COMMIT were two more
// round trips on every claim); only when those leave the batch short does the search for
// heads run (the larger part of an ordered claim's time: the window's walk, a head check per
// key), in a transaction of its own that first locks the rows just leased (pgStillLeased).
//
// A key is continued from its last settled row when every outcome of the key is a delivery
// the settle applied (in s's RETURNING): a row put back, buried, or whose lease was lost
// keeps the key for a search of heads. The row after the last delivered one is the key's
// head, given what Continue asks of its caller: every row of the key it held up to that one
// is settled in this call. The runs are read in the statement's snapshot, which the settle
// does not change for them (it writes only rows before them), each key reading its share of
// the batch at most (the count of continued keys is known only in the statement, so the
// share is a subquery of h). No other claimer can take a row of these runs: until the
// commit, the rows the settle delivers are in flight to them. s's ids are read as one
// array: joined to s, which the planner holds to one row, they were a nested loop that
// compared every outcome with every settled row, a third of the statement's time.
func pgCompleteAndContinue(ctx context.Context, d *Dialect, db *sql.DB, t dialect.Table, outcomes []dialect.Outcome, p dialect.ClaimParams) ([]dialect.Record, []uuid.UUID, error) {
	var delivered []uuid.UUID
	for _, o := range outcomes {
		if o.Status == dialect.StatusDelivered {
			delivered = append(delivered, o.ID)
		}
	}
	if len(delivered) == 0 {
		return pgCompleteThenClaimOrdered(ctx, d, db, t, outcomes, p)
	}
	tbl := pgTable(t)
	continued := func(a *dialect.Args) string {
		dl := a.Add(pgUUIDArray(len(delivered), func(i int) uuid.UUID { return delivered[i] }))
		after := `SELECT id, namespace, partition_key, created_at FROM (SELECT e.id, e.namespace, e.partition_key, e.created_at,` +
			` bool_and(e.id = ANY(ARRAY(SELECT id FROM s)) AND e.id = ANY(` + dl + `::uuid[])) OVER k AS ok, row_number() OVER (k ORDER BY e.created_at DESC, e.id DESC) AS rn` +
			` FROM ` + tbl + ` e WHERE e.id = ANY($1::uuid[]) AND e.partition_key IS NOT NULL` +
			` WINDOW k AS (PARTITION BY e.namespace, e.partition_key)) o WHERE ok AND rn = 1`
		n := a.Add(p.Limit)
		per := `(SELECT (` + n + `::bigint + count(*) - 1) / GREATEST(count(*), 1) FROM h)`
		return pgRunsAfterRows(tbl, a, p, after, per, p.Limit)
	}
	c, err := pgRetryDeadlock(ctx, func() (pgClaimed, error) {
		recs, lost, err := d.settleAndLease(ctx, db, t, outcomes, p, continued)
		return pgClaimed{recs, lost}, err
	})
	if err != nil || len(c.recs) == p.Limit {
		return c.recs, c.lost, err
	}
	// The settle is applied and the runs are leased. A top-up that fails leaves the batch
	// short instead: an error would have the caller drop the leased rows, whose keys would
	// then wait out the lease, and back off. The next claim finds what the top-up missed.
	more, err := pgRetryDeadlock(ctx, func() (more []dialect.Record, err error) {
		err = sqlkit.InTx(ctx, db, nil, func(tx *sql.Tx) error {
			if held, err := pgStillLeased(ctx, tx, t, p, c.recs); err != nil || !held {
				return err
			}
			more, err = pgClaimAfter(ctx, tx, t, p, c.recs)
			return err
		})
		return more, err
	})
	if err != nil {
		return c.recs, c.lost, nil
	}
	return append(c.recs, more...), c.lost, nil
}

// pgStillLeased locks recs, rows just leased under p.Token, in the transaction q, and
// reports whether every one of them is still under that lease, unexpired: a top-up reads
// runs after them and its search for heads passes them over as held, which is sound only
// while they are. A lease that ran out since (a short one, on a slow machine) leaves the
// top-up undone rather than a row in the batch twice, or a key's rows in two claimers'
// batches; a row another transaction has locked (a renewal, an operator's change) leaves it
// undone too, rather than waiting. It also turns bitmap scans off for the transaction, as
// claimRows does, without a round trip of its own: the head search's window walk must stay
// a walk of the claim index whatever the statistics say. That setting comes too late for
// this statement's own plan, so it tests the status in a CASE, as the settles do, to find
// the rows by primary key (TestPostgresStillLeasedByID).
func pgStillLeased(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ClaimParams, recs []dialect.Record) (bool, error) {
	var n int
	err := q.QueryRowContext(ctx, `SELECT count(*), set_config('enable_bitmapscan', 'off', true) FROM (SELECT id FROM `+pgTable(t)+
		` WHERE id = ANY($1::uuid[]) AND CASE status WHEN 'processing' THEN true END AND lease_token = $2 AND locked_until > now() FOR UPDATE SKIP LOCKED) x`,
		pgUUIDArray(len(recs), func(i int) uuid.UUID { return recs[i].ID }), pgUUID(p.Token)).Scan(&n, new(string))
	return n == len(recs), err
}

// pgClaimAfter claims, in q's transaction, what is left of p.Limit after claimed (rows
// this claimer holds): more of the runs after each of their keys' last rows, then heads.
func pgClaimAfter(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ClaimParams, claimed []dialect.Record) ([]dialect.Record, error) {
	n := p.Limit - len(claimed)
	var more []dialect.Record
	if after := pgLastOfKeys(claimed, func(int) bool { return true }); len(after) > 0 {
		var err error
		if more, err = pgRunsAfter(ctx, q, t, p, after, n); err != nil || len(more) == n {
			return more, err
		}
	}
	rest := p
	rest.Limit = n - len(more)
	heads, err := pgClaim(ctx, q, t, rest)
	return append(more, heads...), err
}
