package outbox

import (
	"context"
	"database/sql"
	"slices"
	"strings"
)

// Ordered claims on MySQL and MariaDB find a key's head through the order index
// (namespace, order_key, created_at, id), where order_key is a virtual column holding the
// partition key while the row is pending, processing or dead and NULL otherwise: the
// stand-in for a partial index. The head check (mysqlOrdered) is one descent of it:
//
//	AND (`outbox_events`.partition_key IS NULL OR `outbox_events`.id = (
//	    SELECT e.id FROM `outbox_events` e FORCE INDEX (`outbox_events_order_idx`)
//	    WHERE e.namespace = `outbox_events`.namespace AND e.order_key = `outbox_events`.partition_key
//	      AND e.status IN ('pending', 'processing', 'dead') [AND e.status <> 'dead']
//	    ORDER BY e.created_at, e.id LIMIT 1))
//
// The pending rows are not taken with one locking walk of the claim index, as an unordered
// claim takes them, but in two steps (mysqlClaimHeads): a plain read of the claim index
// finds up to twice the wanted number of heads, in (created_at, id) order, and a locking
// read by primary key, FOR UPDATE SKIP LOCKED, locks those still pending and due. A locking
// read does not lock the rows its subqueries read, and how each server treats a subquery
// inside a SKIP LOCKED read is not something to build a guarantee on; a plain read is a
// consistent snapshot on both. Expired leases are found by the same plain read as for an
// unordered claim, with the head check added, and locked the same way.
//
// Why two claimers never hold two rows of one key: the plain read is one snapshot, and a
// row stops holding its key back only by becoming delivered (terminal) or being deleted.
// So when a claimer sees r as the head, every earlier row of r's key is gone for good, and
// any other claimer can take only r itself; the locking read re-checks r's own status
// under its row lock, which one claimer at a time holds. Within one claim, a later row of a
// key sees the earlier one pending and is not read.

// mysqlOrdered renders the head check for the claim's reads, or "" for an unordered claim.
func mysqlOrdered(t Table, p ClaimParams) string {
	if !p.Ordered {
		return ""
	}
	tbl := mysqlTable(t)
	return ` AND ` + orderedHead(tbl, tbl, "order_key", ` FORCE INDEX (`+quoteIdent(t.Index("order"), '`')+`)`, orderedLive(p.OrderedSkipDead))
}

// mysqlClaimHeads locks up to n due pending rows that are their key's head (or have no
// key), oldest first, on tx.
func mysqlClaimHeads(ctx context.Context, tx *sql.Tx, t Table, p ClaimParams, n int) ([]Record, int64, error) {
	// Twice n: concurrent claimers read the same heads and skip each other's locks, so a
	// margin keeps their batches full.
	recs, now, err := mysqlFindThenLock(ctx, tx, t, p, mysqlDue, 2*n)
	if err != nil {
		return nil, 0, err
	}
	// The rows locked beyond n stay untouched and are released at commit.
	sortClaimOrder(recs)
	return recs[:min(n, len(recs))], now, nil
}

// BlockedKeys implements [OrderedClaimer].
func (mysqlDialect) BlockedKeys(ctx context.Context, q DBTX, t Table, p BlockedKeysParams) ([]BlockedKey, error) {
	a := &args{}
	query := blockedKeysQuery(mysqlTable(t), "order_key", ` FORCE INDEX (`+quoteIdent(t.Index("order"), '`')+`)`, a, p, uuidBytes)
	return queryBlockedKeys(ctx, q, query, a.vals)
}

// sortClaimOrder sorts records in claim order, (created_at, id).
func sortClaimOrder(recs []Record) {
	slices.SortFunc(recs, func(x, y Record) int {
		if c := x.CreatedAt.Compare(y.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(string(x.ID[:]), string(y.ID[:]))
	})
}
