package postgres

import (
	"bytes"
	"context"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// Ordered claims on PostgreSQL add one term to the claim's candidate read (pgOrdered):
//
//	AND ("outbox_events".partition_key IS NULL OR NOT EXISTS (SELECT 1 FROM (
//	    SELECT e.id FROM "outbox_events" e
//	    WHERE e.namespace = "outbox_events".namespace
//	      AND e.partition_key = "outbox_events".partition_key
//	      AND e.status IN ('pending', 'processing', 'dead') [AND e.status <> 'dead']
//	      AND (e.created_at, e.id) < ("outbox_events".created_at, "outbox_events".id)
//	    ORDER BY e.created_at DESC, e.id DESC LIMIT 1) x))
//
// The candidate read still walks the claim index in (created_at, id) order under
// FOR UPDATE SKIP LOCKED; for each row with a key the subquery is one descent of the partial
// order index (namespace, partition_key, created_at, id) WHERE partition_key IS NOT NULL AND
// status IN ('pending', 'processing', 'dead'), whose predicate the status term repeats, to
// the entry just before the row. It is written as NOT EXISTS rather than as "id = (the
// key's first id)", which says the same: the planner takes an equality with a subquery for
// a filter that keeps one row in the whole table, expects the LIMIT to need the whole
// pending set, and sorts it (a bitmap scan of 20 000 rows and a Sort, in place of a walk
// of 200 index entries); a NOT EXISTS it estimates as keeping many, and walks the index.
// The descent goes backwards from the row, to its nearest earlier entry: the subquery in
// FROM keeps its ORDER BY ... DESC LIMIT 1, which EXISTS alone would drop. A plain NOT
// EXISTS walked forwards from the key's first entry, over the index entries that the key's
// delivered rows leave until vacuum, for every candidate: with one hot key that was the
// whole claim's cost (10,000 rows of one key drained in 20 s against 9 s, loaded machine).
//
// Why two claimers never hold two rows of one key: the subquery reads the statement's
// snapshot, and a row stops holding its key back only by becoming delivered (terminal) or
// being deleted. So when a claimer sees r as the head, every earlier row of r's key is
// gone for good, and any other claimer can take only r itself, which the row lock (SKIP
// LOCKED, then the re-check of r's own status by EvalPlanQual) gives to one of them. Two
// rows of a key in one batch cannot happen either: the later one sees the earlier pending.
// No advisory lock is needed. What the snapshot cannot see is a row committed later with
// an earlier (created_at, id): see docs/ordering.md.

// pgOrdered renders the ordered claim's extra term, or "" for an unordered claim.
func pgOrdered(tbl string, p dialect.ClaimParams) string {
	if !p.Ordered {
		return ""
	}
	return ` AND (` + tbl + `.partition_key IS NULL OR NOT EXISTS (SELECT 1 FROM (SELECT e.id FROM ` + tbl + ` e WHERE e.namespace = ` + tbl + `.namespace` +
		` AND e.partition_key = ` + tbl + `.partition_key AND ` + sqlkit.OrderedLive(p.OrderedSkipDead) +
		` AND (e.created_at, e.id) < (` + tbl + `.created_at, ` + tbl + `.id) ORDER BY e.created_at DESC, e.id DESC LIMIT 1) x))`
}

// pgClaimOrdered claims in order within a namespace: first by walking the claim index up to
// orderedWindow rows, then, when that found less than a batch, by visiting the keys
// (pgHeadsByKey). The window keeps the walk from passing a whole backlog of rows held back
// by heads in flight; the visit finds the heads beyond it.
//
// Only a key's first row in the window can be its head (every later one has that row live
// before it), so the walk keeps each key's first row (and every row without a key) and
// checks only those: a head check per key in the window, not per row, which is what a hot
// key's claim spent its time on (250 checks for one head).
func pgClaimOrdered(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ClaimParams) ([]dialect.Record, error) {
	tbl := pgTable(t)
	a := &dialect.Args{Numbered: true}
	firsts := `f AS MATERIALIZED (SELECT DISTINCT ON (x.partition_key IS NULL, COALESCE(x.partition_key, x.id::text)) x.id FROM` +
		` (SELECT w.id, w.partition_key, w.created_at FROM ` + tbl + ` w WHERE w.status IN ('pending', 'processing')` +
		` AND (SELECT true` + sqlkit.ScopeSQL(a, p.Scope, "w.", pgUUID) + `) ORDER BY w.created_at, w.id LIMIT ` +
		a.Add(sqlkit.OrderedWindow(p.Limit)+1) + `::bigint) x` +
		` ORDER BY x.partition_key IS NULL, COALESCE(x.partition_key, x.id::text), x.created_at, x.id)`
	shared := sqlkit.SharesKeys(p)
	recs, err := pgLease(ctx, q, t, p, a, `WITH `+firsts+`, `+pgLockHeads(tbl, a, p, `SELECT id FROM f`, pgOrdered(tbl, p)))
	if recs, err = pgWithRuns(ctx, q, t, p, recs, err); err != nil || len(recs) == p.Limit || shared && len(recs) > 0 {
		return recs, err // with a share taken, the keys beyond the window are the other claimers'
	}
	rest := p
	rest.Limit -= len(recs)
	a = &dialect.Args{Numbered: true}
	more, err := pgLease(ctx, q, t, rest, a, pgHeadsByKey(tbl, a, rest))
	more, err = pgWithRuns(ctx, q, t, rest, more, err)
	return append(recs, more...), err
}

// pgWithRuns adds to heads, just claimed on q, their runs when p asks for them
// (pgClaimRuns), in the same transaction; the runs of the heads found in the window come
// before a visit of the keys, which a hot key's run often makes needless.
func pgWithRuns(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ClaimParams, heads []dialect.Record, err error) ([]dialect.Record, error) {
	if err != nil || !p.Ordered || !p.Runs {
		return heads, err
	}
	runs, err := pgClaimRuns(ctx, q, t, p, heads)
	return append(heads, runs...), err
}

// pgHeadsByKey renders the WITH clause of a claim that visits the keys of p.Namespace: a
// skip scan of the order index lists the keys (one descent per key), the key's first row
// that holds it back is its head; the unkeyed index gives the oldest rows without a key;
// and the oldest eligible of both are locked. It costs a descent per key with rows, however
// many rows wait behind the heads.
//
// The heads reach the locking read as one array (id = ANY(ARRAY(...))), computed once, not
// as id IN (...): on a table the planner holds to be tiny (never analyzed, a backlog
// enqueued since) it planned the IN as a nested loop that checked every eligible row
// against every head, 1.2 s for 4,000 rows and 200 keys; an array is read once whatever
// the estimates (TestPostgresHeadsByKeyPlanUnanalyzed).
func pgHeadsByKey(tbl string, a *dialect.Args, p dialect.ClaimParams) string {
	ns := a.Add(p.Namespace)
	keyed := ` AND e.status IN ('pending', 'processing', 'dead')`
	return `WITH RECURSIVE k(pk) AS (SELECT min(e.partition_key) FROM ` + tbl + ` e WHERE e.namespace = ` + ns +
		` AND e.partition_key IS NOT NULL` + keyed +
		` UNION ALL SELECT (SELECT min(e.partition_key) FROM ` + tbl + ` e WHERE e.namespace = ` + ns + ` AND e.partition_key > k.pk` + keyed +
		`) FROM k WHERE k.pk IS NOT NULL),` +
		` h AS MATERIALIZED (SELECT (SELECT e.id FROM ` + tbl + ` e WHERE e.namespace = ` + ns + ` AND e.partition_key = k.pk AND ` +
		sqlkit.OrderedLive(p.OrderedSkipDead) + ` ORDER BY e.created_at, e.id LIMIT 1) AS id FROM k WHERE k.pk IS NOT NULL),` +
		` ` + pgLockHeads(tbl, a, p, `SELECT h.id FROM h UNION ALL (SELECT id FROM `+tbl+
		` WHERE partition_key IS NULL AND `+pgEligible(a, p)+` ORDER BY created_at, id LIMIT `+a.Add(p.Limit)+`::bigint)`, "")
}

// pgLockHeads renders the CTE c of an ordered claim, which locks the oldest eligible of
// the candidate ids (a query) that pass check as well, up to p.Limit. With a share of the
// keys to take (p.RunShare), it finds the heads first, e, and locks the share of them
// (sqlkit.HeadShare): the count of heads found is what the share divides. e keeps every
// head the candidates hold, not the first p.Limit: the lock skips the heads that another
// claimer holds and goes on to the next, as the plain claim does (two loops capped at the
// same first heads took half a batch each, 1,000 keys 0.65 -> 0.43 of unordered).
func pgLockHeads(tbl string, a *dialect.Args, p dialect.ClaimParams, ids, check string) string {
	if !sqlkit.SharesKeys(p) {
		return `c AS MATERIALIZED (SELECT id FROM ` + tbl + ` WHERE id = ANY(ARRAY(` + ids + `)) AND ` + pgEligibleByID(a, p) + check +
			` ORDER BY created_at, id LIMIT ` + a.Add(p.Limit) + `::bigint FOR UPDATE SKIP LOCKED)`
	}
	return `e AS MATERIALIZED (SELECT id FROM ` + tbl + ` WHERE id = ANY(ARRAY(` + ids + `)) AND ` + pgEligibleByID(a, p) + check + `),` +
		` c AS MATERIALIZED (SELECT id FROM ` + tbl + ` WHERE id = ANY(ARRAY(SELECT id FROM e)) AND ` + pgEligibleByID(a, p) +
		` ORDER BY created_at, id LIMIT ` + sqlkit.HeadShareSQL(a, p, "e") + ` FOR UPDATE SKIP LOCKED)`
}

// BlockedKeys implements [dialect.OrderedClaimer].
func (*Dialect) BlockedKeys(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.BlockedKeysParams) ([]dialect.BlockedKey, error) {
	a := &dialect.Args{Numbered: true}
	query := sqlkit.BlockedKeysQuery(pgTable(t), "partition_key", "", a, p, pgUUID)
	return sqlkit.QueryBlockedKeys(ctx, q, query, a.Values)
}

// Runs ([dialect.ClaimParams.Runs]) on PostgreSQL: the heads are claimed as above, then one
// more statement of the same transaction (pgRuns) takes each keyed head's run:
//
//	WITH h AS (the claimed keyed heads, numbered in claim order),
//	f AS (per head, LATERAL: the next $n rows of its key in the order index after the head,
//	      each with whether it is claimable now: pending, due, below the limit, in scope),
//	r AS (each key's prefix of claimable rows (bool_and over the key, in order), taken in
//	      turns across the keys (row_number within the key, then the head), LIMIT $n),
//	l AS (those rows still claimable, locked FOR UPDATE SKIP LOCKED),
//	c AS (each key's rows of r up to its first row that l did not lock)
//	UPDATE ... (pgLeaseUpdate, the heads' lease) WHERE id = ANY(ARRAY(SELECT id FROM c))
//
// Each lateral read is one range of the order index, no sort. No other claim can take a
// row of a run: it follows the head, which this transaction holds (processing in its own
// view, locked and pending in others' snapshots), so to any other claimer the row is not a
// head; a replayed earlier row that became its key's new head in the meantime is the only
// way another claimer reaches the key, and its run stops at our head (in flight in its
// snapshot, or locked and skipped). A run row that another transaction holds locked (a
// settle of it in flight) is skipped by the lock, and the key's run ends before it, never
// after it. Rows locked but cut away stay locked until the commit, unleased. The lock's
// re-check is a CASE, which implies no partial index's predicate: written as status =
// 'pending' AND ..., on a table the planner held to be small it read the partial claim
// index whole for the ids (id is its second column) instead of probing the primary key.
func pgRuns(tbl string, a *dialect.Args, p dialect.ClaimParams, heads []uuid.UUID, share, n int) string {
	hs := a.Add(pgUUIDArray(len(heads), func(i int) uuid.UUID { return heads[i] }))
	return `WITH ` + pgRunsAfterRows(tbl, a, p, `SELECT id, namespace, partition_key, created_at FROM `+tbl+
		` WHERE id = ANY(`+hs+`::uuid[]) AND partition_key IS NOT NULL`, a.Add(share)+`::bigint`, n)
}

// pgRunsAfterRows renders pgRuns's CTEs, h to c, after the rows that the query after
// returns (id, namespace, partition_key, created_at; each with a key), reading up to per
// (an expression) rows of each key.
func pgRunsAfterRows(tbl string, a *dialect.Args, p dialect.ClaimParams, after, per string, n int) string {
	lim := a.Add(n)
	mx := a.Add(p.MaxAttempts)
	ok := `(e.status = 'pending' AND e.next_attempt_at <= now() AND e.attempts < ` + mx + `::bigint` + sqlkit.ScopeSQL(a, p.Scope, "e.", pgUUID) + `)`
	return `h AS MATERIALIZED (SELECT id, namespace, partition_key, created_at, row_number() OVER (ORDER BY created_at, id) AS hn FROM (` + after + `) x),` +
		` f AS MATERIALIZED (SELECT x.id, h.hn, x.created_at, x.ok FROM h CROSS JOIN LATERAL (SELECT e.id, e.created_at, ` + ok + ` AS ok FROM ` + tbl +
		` e WHERE e.namespace = h.namespace AND e.partition_key = h.partition_key AND ` + sqlkit.OrderedLive(p.OrderedSkipDead) +
		` AND (e.created_at, e.id) > (h.created_at, h.id) ORDER BY e.created_at, e.id LIMIT ` + per + `) x),` +
		` r AS MATERIALIZED (SELECT q.id, q.hn, q.created_at FROM (SELECT f.id, f.hn, f.created_at, bool_and(f.ok) OVER w AS run, row_number() OVER w AS rn` +
		` FROM f WINDOW w AS (PARTITION BY f.hn ORDER BY f.created_at, f.id)) q WHERE q.run ORDER BY q.rn, q.hn LIMIT ` + lim + `::bigint),` +
		` l AS MATERIALIZED (SELECT id FROM ` + tbl + ` WHERE id = ANY(ARRAY(SELECT id FROM r))` +
		` AND CASE WHEN status = 'pending' THEN next_attempt_at <= now() AND attempts < ` + mx + `::bigint END FOR UPDATE SKIP LOCKED),` +
		` c AS MATERIALIZED (SELECT q.id FROM (SELECT r.id, bool_and(r.id = ANY(ARRAY(SELECT id FROM l))) OVER (PARTITION BY r.hn ORDER BY r.created_at, r.id) AS held` +
		` FROM r) q WHERE q.held)`
}

// pgClaimRuns claims the runs of heads, rows this transaction q has just claimed in order,
// within what is left of p.Limit: none when no head has a key or the heads filled the
// batch. It reads each key's share of what is left first, so that many keys read about a
// batch of rows rather than a batch each (50 keys: 6 ms a claim against 10–16 ms), and
// only when the batch came back short, a second statement for the keys whose share was
// all claimed, from their last row: a hot key among cold ones still fills the batch, as
// MySQL's and SQLite's run reads do (sqlkit.ReadRuns).
func pgClaimRuns(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ClaimParams, heads []dialect.Record) ([]dialect.Record, error) {
	n := p.Limit - len(heads)
	var keyed []uuid.UUID
	for _, h := range heads {
		if h.PartitionKey != "" {
			keyed = append(keyed, h.ID)
		}
	}
	if n <= 0 || len(keyed) == 0 {
		return nil, nil
	}
	return pgRunsAfter(ctx, q, t, p, keyed, n)
}

// pgRunsAfter claims, in q's transaction, up to n rows of the runs that follow the rows
// after (rows this claimer holds and q has locked: heads it has just claimed, or the rows a
// continued claim leased, which pgStillLeased locked), each key's share first and then,
// when the batch came back short, more of the keys whose share was all claimable, from
// their last row.
func pgRunsAfter(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ClaimParams, after []uuid.UUID, n int) ([]dialect.Record, error) {
	share := (n + len(after) - 1) / len(after)
	a := &dialect.Args{Numbered: true}
	runs, err := pgLease(ctx, q, t, p, a, pgRuns(pgTable(t), a, p, after, share, n))
	if err != nil || len(runs) == n {
		return runs, err
	}
	from := pgFullRuns(runs, share)
	if len(from) == 0 {
		return runs, nil
	}
	a = &dialect.Args{Numbered: true}
	more, err := pgLease(ctx, q, t, p, a, pgRuns(pgTable(t), a, p, from, n-len(runs), n-len(runs)))
	return append(runs, more...), err
}

// pgFullRuns returns the last row of each key of runs that claimed share rows: its share
// was all claimable, so more of the key may wait after it.
func pgFullRuns(runs []dialect.Record, share int) []uuid.UUID {
	return pgLastOfKeys(runs, func(n int) bool { return n == share })
}

// pgLastOfKeys returns the last row, by (created_at, id), of each key of recs whose count
// of rows there keep accepts.
func pgLastOfKeys(recs []dialect.Record, keep func(n int) bool) []uuid.UUID {
	type key struct{ ns, pk string }
	count := map[key]int{}
	last := map[key]dialect.Record{}
	for _, r := range recs {
		if r.PartitionKey == "" {
			continue
		}
		k := key{r.Namespace, r.PartitionKey}
		count[k]++
		if l, ok := last[k]; !ok || l.CreatedAt.Before(r.CreatedAt) || l.CreatedAt.Equal(r.CreatedAt) && bytes.Compare(l.ID[:], r.ID[:]) < 0 {
			last[k] = r
		}
	}
	var out []uuid.UUID
	for k, c := range count {
		if keep(c) {
			out = append(out, last[k].ID)
		}
	}
	return out
}
