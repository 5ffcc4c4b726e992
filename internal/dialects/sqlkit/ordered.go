package sqlkit

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
)

// OrderedWindow is how many rows of the claim index an ordered claim of limit rows walks
// before it visits the keys instead (when it has a namespace to visit): enough to fill a
// batch while up to half the rows are held back. The bound itself is a walk of that many
// index entries, so it is kept near what a healthy claim walks anyway.
func OrderedWindow(limit int) int { return 2*limit + 50 }

// OrderedHead renders the condition under which the row of the enclosing query, named
// outer (the quoted table name or its alias), may be claimed in order: it has no partition
// key, or it is the first row of its key among those that hold the key back. keyCol is the
// column the index keeps the key in for such rows (partition_key, or MySQL's order_key),
// live the status terms that make a row hold the key back, matching the order index's
// predicate, and index an index hint placed after the inner table's alias ("" for none).
// The inner read is one descent of the order index: its first entry for the key.
func OrderedHead(tbl, outer, keyCol, index, live string) string {
	return `(` + outer + `.partition_key IS NULL OR ` + outer + `.id = (SELECT e.id FROM ` + tbl + ` e` + index +
		` WHERE e.namespace = ` + outer + `.namespace AND e.` + keyCol + ` = ` + outer + `.partition_key AND ` + live +
		` ORDER BY e.created_at, e.id LIMIT 1))`
}

// OrderedLive returns the status terms of the rows that hold a key back: pending,
// processing and, unless skipDead, dead. The first term is the order index's own predicate,
// written the same way, so that every database sees that the index applies.
func OrderedLive(skipDead bool) string {
	live := `e.status IN ('pending', 'processing', 'dead')`
	if skipDead {
		live += ` AND e.status <> 'dead'`
	}
	return live
}

// BlockedKeysQuery renders the query of BlockedKeys for the built-in dialects: dead rows
// that are their key's head, with the count of pending and processing rows of the key,
// where at least one waits. keyCol is as for OrderedHead; a renders Placeholders; enc binds
// the scope's tenant.
//
// The inner select finds the blocked heads, oldest first, testing each dead row with two
// descents of the order index: its key's head, and whether a live row of the key exists
// (EXISTS, which stops at the first). Only the up to p.Limit heads it returns are counted.
// Counting in the filter instead read every waiting row of every dead head, twice, and on
// PostgreSQL its estimate (10,000 dead rows: above jit_above_cost) set off JIT compilation,
// which took longer than the query: 75 ms against 36 ms.
func BlockedKeysQuery(tbl, keyCol, index string, a *dialect.Args, p dialect.BlockedKeysParams, enc func(uuid.UUID) any) string {
	live := func(alias, of string) string {
		return alias + `.namespace = ` + of + `.namespace AND ` + alias + `.` + keyCol + ` = ` + of +
			`.partition_key AND ` + alias + `.status IN ('pending', 'processing', 'dead') AND ` + alias + `.status <> 'dead'`
	}
	return `SELECT b.namespace, b.partition_key, b.id, b.topic, b.last_error, (SELECT COUNT(*) FROM ` + tbl + ` w` + index +
		` WHERE ` + live("w", "b") + `) AS waiting FROM (SELECT h.namespace, h.partition_key, h.id, h.topic, h.last_error, h.created_at FROM ` + tbl + ` h` +
		` WHERE h.status = 'dead' AND h.partition_key IS NOT NULL` + ScopeSQL(a, p.Scope, "h.", enc) +
		` AND ` + OrderedHead(tbl, "h", keyCol, index, OrderedLive(false)) +
		` AND EXISTS (SELECT 1 FROM ` + tbl + ` x` + index + ` WHERE ` + live("x", "h") + `)` +
		` ORDER BY h.created_at, h.id LIMIT ` + a.Add(p.Limit) + `) b ORDER BY b.created_at, b.id`
}

// QueryBlockedKeys runs a query rendered by BlockedKeysQuery.
func QueryBlockedKeys(ctx context.Context, q dialect.DBTX, query string, vals []any) ([]dialect.BlockedKey, error) {
	return QueryAll(ctx, q, query, vals, func(s RowScanner) (dialect.BlockedKey, error) {
		var (
			k       dialect.BlockedKey
			lastErr NullString
		)
		err := s.Scan(&k.Namespace, &k.PartitionKey, &k.HeadID, &k.Topic, &lastErr, &k.Waiting)
		k.LastError = string(lastErr)
		return k, err
	})
}

// NullString scans a nullable text or binary column as a string ("" for NULL).
type NullString string

func (n *NullString) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*n = ""
	case string:
		*n = NullString(v)
	case []byte:
		*n = NullString(v)
	default:
		return fmt.Errorf("outbox: cannot scan %T into a string", src)
	}
	return nil
}

// HeadShare is how many of the heads an ordered claim found it takes, up to n: all of them,
// or with a share of the keys to take (p.RunShare, with runs) and fewer heads than n, that
// share of them, rounded up, so that a lone key is never left. With n heads or more there
// are keys enough for every claimer, and heads fill a batch at less cost than runs.
func HeadShare(p dialect.ClaimParams, found, n int) int {
	if !SharesKeys(p) || found >= n {
		return n
	}
	return (found + p.RunShare - 1) / p.RunShare
}

// SharesKeys reports whether an ordered claim takes a share of the keys it finds
// (p.RunShare above one, with runs).
func SharesKeys(p dialect.ClaimParams) bool { return p.Runs && p.RunShare > 1 }

// HeadShareSQL renders HeadShare of the count of the query heads, for a claim's LIMIT.
func HeadShareSQL(a *dialect.Args, p dialect.ClaimParams, heads string) string {
	return `(SELECT CASE WHEN count(*) >= ` + a.Add(p.Limit) + ` THEN ` + a.Add(p.Limit) + ` ELSE (count(*) + ` + a.Add(p.RunShare-1) + `) / ` +
		a.Add(p.RunShare) + ` END FROM ` + heads + `)` // each placeholder its own argument, for ? placeholders
}
