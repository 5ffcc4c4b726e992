package sqlite

import (
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"slices"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// Ordered claims on SQLite add one term to the claim's candidate read and to its probe
// (sqliteOrdered): the row has no partition key, or it is the first entry of its namespace
// and key in the partial order index (namespace, partition_key, created_at, id) WHERE
// partition_key IS NOT NULL AND status IN ('pending', 'processing', 'dead'), read with one
// descent (INDEXED BY, so a planner with stale statistics cannot walk the table instead).
//
// SQLite has one writer: the claim's UPDATE ... WHERE id IN (SELECT ...) reads and writes
// under the write lock, so no other claim runs between the head check and the lease, and
// within one claim a later row of a key sees the earlier one pending and is not taken.

// sqliteOrdered renders the ordered claim's extra term, or "" for an unordered claim.
func sqliteOrdered(t dialect.Table, p dialect.ClaimParams) string {
	if !p.Ordered {
		return ""
	}
	tbl := sqlkit.QuoteIdent(t.Name(), '"')
	return ` AND ` + sqlkit.OrderedHead(tbl, tbl, "partition_key", ` INDEXED BY `+sqlkit.QuoteIdent(t.Index("order"), '"'), sqlkit.OrderedLive(p.OrderedSkipDead))
}

// claimOrdered claims in order within a namespace, as pgClaimOrdered does: a walk of the
// claim index bounded to orderedWindow rows, then, when that found less than a batch, a
// visit of the keys (sqliteHeadsByKey). Both are probed first without the write lock, so
// that idle publishers leave the lock to producers; an ordered claim always probes.
func (d Dialect) claimOrdered(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) (recs []dialect.Record, err error) {
	byKey := func(p dialect.ClaimParams) func(a *dialect.Args) string {
		return func(a *dialect.Args) string { return sqliteHeadsByKey(t, a, p) }
	}
	found := func(candidates func(a *dialect.Args) string) (bool, error) {
		a := &dialect.Args{}
		var one int
		switch err := d.stmts.On(db).QueryRowContext(ctx, `SELECT 1 FROM (`+candidates(a)+`) LIMIT 1`, a.Values...).Scan(&one); {
		case err == sql.ErrNoRows:
			return false, nil
		case err != nil:
			return false, err
		}
		return true, nil
	}
	inWindow, err := found(sqliteWalk(t, p))
	if err != nil {
		return nil, err
	}
	if !inWindow {
		if beyond, err := found(byKey(p)); err != nil || !beyond {
			return nil, err
		}
	}
	if p.Runs {
		recs, _, err = d.completeAndClaimRows(ctx, db, t, nil, p) // heads and runs in one transaction
		return recs, err
	}
	err = d.write(ctx, db, func(_, prep dialect.DBTX) error {
		recs, err = sqliteLeaseOrdered(ctx, prep, t, p, inWindow)
		return err
	})
	return recs, err
}

// sqliteLeaseOrdered leases in order on q, which must hold the write lock: from the walk of
// the claim index when inWindow (a probe found a candidate there), then from the visit of
// the keys for what the walk left of the batch; with p.Runs, and the runs of each step's
// heads.
func sqliteLeaseOrdered(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ClaimParams, inWindow bool) (recs []dialect.Record, err error) {
	shared := sqlkit.SharesKeys(p)
	if inWindow {
		recs, err = sqliteLease(ctx, q, t, p, sqliteShare(t, p, sqliteWalk(t, p)))
		if recs, err = sqliteWithRuns(ctx, q, t, p, recs, err); err != nil || len(recs) == p.Limit || shared && len(recs) > 0 {
			return recs, err // with a share taken, the keys beyond the window are the other claimers'
		}
	}
	rest := p
	rest.Limit -= len(recs)
	more, err := sqliteLease(ctx, q, t, rest, sqliteShare(t, rest, func(a *dialect.Args) string { return sqliteHeadsByKey(t, a, rest) }))
	more, err = sqliteWithRuns(ctx, q, t, rest, more, err)
	return append(recs, more...), err
}

// sqliteWithRuns adds to heads, just leased in the transaction q, their runs when p asks
// for them (sqliteClaimRuns); the runs of the heads found in the window come before a visit
// of the keys, which a hot key's run often makes needless.
func sqliteWithRuns(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ClaimParams, heads []dialect.Record, err error) ([]dialect.Record, error) {
	if err != nil || !p.Ordered || !p.Runs {
		return heads, err
	}
	runs, err := sqliteClaimRuns(ctx, q, t, p, heads, p.Limit-len(heads))
	return append(heads, runs...), err
}

// sqliteShare renders candidates, the heads an ordered claim found, as they are, or with a
// share of the keys to take (p.RunShare, with runs) the oldest of them up to that share
// (sqlkit.HeadShare).
func sqliteShare(t dialect.Table, p dialect.ClaimParams, candidates func(a *dialect.Args) string) func(a *dialect.Args) string {
	if !sqlkit.SharesKeys(p) {
		return candidates
	}
	return func(a *dialect.Args) string {
		// CROSS JOIN keeps h the outer loop: the heads, each looked up by its id, not the
		// table walked in order and each row looked for among them.
		return `WITH h(id) AS MATERIALIZED (` + candidates(a) + `) SELECT r.id FROM h CROSS JOIN ` + sqlkit.QuoteIdent(t.Name(), '"') +
			` r ON r.id = h.id ORDER BY r.created_at, r.id LIMIT ` + sqlkit.HeadShareSQL(a, p, "h")
	}
}

// sqliteWalk renders the candidates of an ordered claim's bounded walk of the claim index.
// The window's bound comes first, so that a row past it is dropped before its head check.
func sqliteWalk(t dialect.Table, p dialect.ClaimParams) func(a *dialect.Args) string {
	return func(a *dialect.Args) string {
		return `SELECT id FROM ` + sqlkit.QuoteIdent(t.Name(), '"') + ` INDEXED BY ` + sqlkit.QuoteIdent(t.Index("claim"), '"') + ` WHERE ` +
			sqliteWindow(t, a, p) + ` AND ` + sqliteEligible(a, p) + sqliteOrdered(t, p) + ` ORDER BY created_at, id LIMIT ` + a.Add(p.Limit)
	}
}

// sqliteWindow bounds the ordered claim's walk to orderedWindow rows in scope: the rows up to
// the one orderedWindow rows in, by (created_at, id). The bound on created_at ends the range
// of the index the walk reads; the row value keeps out the rows past the bound that share
// its created_at (a transaction's rows share it, and a bound on created_at alone took in all
// of them). With fewer rows in scope, both subqueries are empty: no bound.
func sqliteWindow(t dialect.Table, a *dialect.Args, p dialect.ClaimParams) string {
	edge := func(cols string) string {
		return `(SELECT ` + cols + ` FROM ` + sqlkit.QuoteIdent(t.Name(), '"') + ` w INDEXED BY ` +
			sqlkit.QuoteIdent(t.Index("claim"), '"') + ` WHERE w.status IN ('pending', 'processing')` + sqlkit.ScopeSQL(a, p.Scope, "w.", sqlkit.UUIDBytes) +
			` ORDER BY w.created_at, w.id LIMIT 1 OFFSET ` + a.Add(sqlkit.OrderedWindow(p.Limit)) + `)`
	}
	return `created_at <= coalesce(` + edge("w.created_at") + `, 9223372036854775807) AND ((created_at, id) <= ` + edge("w.created_at, w.id") + `) IS NOT FALSE`
}

// sqliteHeadsByKey renders the candidates of a claim that visits the keys of p.Namespace:
// a skip scan of the order index lists the keys, one descent per key, the key's first row
// that holds it back is its head; the unkeyed index gives the oldest rows without a key; and
// the oldest eligible of both are chosen.
func sqliteHeadsByKey(t dialect.Table, a *dialect.Args, p dialect.ClaimParams) string {
	tbl := sqlkit.QuoteIdent(t.Name(), '"')
	e := tbl + ` e INDEXED BY ` + sqlkit.QuoteIdent(t.Index("order"), '"')
	keyed := ` AND e.status IN ('pending', 'processing', 'dead') ORDER BY e.partition_key LIMIT 1`
	return `WITH RECURSIVE k(pk) AS (SELECT (SELECT e.partition_key FROM ` + e + ` WHERE e.namespace = ` + a.Add(p.Namespace) +
		` AND e.partition_key IS NOT NULL` + keyed + `)` +
		` UNION ALL SELECT (SELECT e.partition_key FROM ` + e + ` WHERE e.namespace = ` + a.Add(p.Namespace) + ` AND e.partition_key > k.pk` +
		keyed + `) FROM k WHERE k.pk IS NOT NULL)` +
		` SELECT id FROM ` + tbl + ` WHERE id IN (SELECT (SELECT e.id FROM ` + e + ` WHERE e.namespace = ` + a.Add(p.Namespace) +
		` AND e.partition_key = k.pk AND ` + sqlkit.OrderedLive(p.OrderedSkipDead) + ` ORDER BY e.created_at, e.id LIMIT 1) FROM k WHERE k.pk IS NOT NULL` +
		` UNION ALL SELECT * FROM (SELECT id FROM ` + tbl + ` INDEXED BY ` + sqlkit.QuoteIdent(t.Index("unkeyed"), '"') +
		` WHERE partition_key IS NULL AND ` + sqliteEligible(a, p) + ` ORDER BY created_at, id LIMIT ` + a.Add(p.Limit) + `))` +
		` AND ` + sqliteEligible(a, p) + ` ORDER BY created_at, id LIMIT ` + a.Add(p.Limit)
}

// BlockedKeys implements [dialect.OrderedClaimer].
func (Dialect) BlockedKeys(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.BlockedKeysParams) ([]dialect.BlockedKey, error) {
	a := &dialect.Args{}
	query := sqlkit.BlockedKeysQuery(sqlkit.QuoteIdent(t.Name(), '"'), "partition_key", ` INDEXED BY `+sqlkit.QuoteIdent(t.Index("order"), '"'), a, p, sqlkit.UUIDBytes)
	return sqlkit.QueryBlockedKeys(ctx, q, query, a.Values)
}

// sqliteClaimRuns leases, on q, the runs ([dialect.ClaimParams.Runs]) of heads, rows the
// same transaction has just claimed in order, up to n rows in all. Two statements: a read
// of the order index, one range per keyed head (the heads passed as one JSON list, each
// head's range a correlated subquery: its next entries after the head, each with whether
// it can be claimed now), from which sqlkit.RunTake keeps each key's claimable prefix, in
// turns across the keys; then the lease of those rows (sqliteLease, with its guard, the
// ids a JSON list too). Both texts are the same whatever the heads, so both are prepared
// once: a UNION ALL of a range per head was a text per number of heads, parsed at every
// claim, a quarter of the ordered claim's time with 50 keys. The transaction holds
// SQLite's one write lock from its first statement (BEGIN IMMEDIATE's effect: the heads'
// claim writes first), so no other claimer runs between the read and the lease, and no
// row can be held by another.
func sqliteClaimRuns(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ClaimParams, heads []dialect.Record, n int) ([]dialect.Record, error) {
	var keyed []dialect.Record
	for _, h := range heads {
		if h.PartitionKey != "" {
			keyed = append(keyed, h)
		}
	}
	if n <= 0 || len(keyed) == 0 {
		return nil, nil
	}
	tbl := sqlkit.QuoteIdent(t.Name(), '"')
	order := tbl + ` e INDEXED BY ` + sqlkit.QuoteIdent(t.Index("order"), '"')
	read := func(from []sqlkit.RunHead, keys []int, limit int) ([]sqlkit.RunRow, error) {
		heads := make([][]any, len(from))
		for i, h := range from {
			heads[i] = []any{keys[i], h.Namespace, h.PartitionKey, h.At, hex.EncodeToString(h.ID[:])}
		}
		list, err := json.Marshal(heads)
		if err != nil {
			return nil, err
		}
		a := &dialect.Args{}
		query := `WITH h(k, ns, pk, at, id) AS MATERIALIZED (SELECT json_extract(j.value, '$[0]'), json_extract(j.value, '$[1]'),` +
			` json_extract(j.value, '$[2]'), json_extract(j.value, '$[3]'), unhex(json_extract(j.value, '$[4]')) FROM json_each(` + a.Add(string(list)) + `) j)` +
			` SELECT h.k, r.id, r.status = 'pending' AND r.next_attempt_at <= ` + sqliteNow + ` AND r.attempts < ` + a.Add(p.MaxAttempts) +
			sqlkit.ScopeSQL(a, p.Scope, "r.", sqlkit.UUIDBytes) + `, r.created_at FROM h CROSS JOIN ` + tbl + ` r WHERE r.id IN (SELECT e.id FROM ` + order +
			` WHERE e.namespace = h.ns AND e.partition_key = h.pk AND ` + sqlkit.OrderedLive(p.OrderedSkipDead) +
			` AND (e.created_at > h.at OR (e.created_at = h.at AND e.id > h.id)) ORDER BY e.created_at, e.id LIMIT ` + a.Add(limit) + `)`
		rows, err := sqlkit.QueryAll(ctx, q, query, a.Values, func(s sqlkit.RowScanner) (sqlkit.RunRow, error) {
			var r sqlkit.RunRow
			err := s.Scan(&r.Key, &r.ID, &r.OK, &r.At)
			return r, err
		})
		sqlkit.SortRuns(rows)
		return rows, err
	}
	runs, err := sqlkit.ReadRuns(sqlkit.RunHeads(keyed), n, read)
	if err != nil {
		return nil, err
	}
	ids := slices.Concat(runs...)
	if len(ids) == 0 {
		return nil, nil
	}
	hexes := make([]string, len(ids))
	for i, id := range ids {
		hexes[i] = hex.EncodeToString(id[:])
	}
	list, err := json.Marshal(hexes)
	if err != nil {
		return nil, err
	}
	leased, err := sqliteLease(ctx, q, t, p, func(a *dialect.Args) string {
		return `SELECT unhex(value) FROM json_each(` + a.Add(string(list)) + `)`
	})
	if err != nil {
		return nil, err
	}
	byID := make(map[uuid.UUID]dialect.Record, len(leased))
	for _, r := range leased {
		byID[r.ID] = r
	}
	// Under the write lock the guard drops nothing; were it to, the run would end there.
	var out []dialect.Record
	for _, id := range sqlkit.RunCut(runs, func(id uuid.UUID) bool { _, ok := byID[id]; return ok }) {
		out = append(out, byID[id])
	}
	return out, nil
}
