package outbox

import "context"

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
func sqliteOrdered(t Table, p ClaimParams) string {
	if !p.Ordered {
		return ""
	}
	tbl := quoteIdent(t.Name(), '"')
	return ` AND ` + orderedHead(tbl, tbl, "partition_key", ` INDEXED BY `+quoteIdent(t.Index("order"), '"'), orderedLive(p.OrderedSkipDead))
}

// BlockedKeys implements [OrderedClaimer].
func (sqliteDialect) BlockedKeys(ctx context.Context, q DBTX, t Table, p BlockedKeysParams) ([]BlockedKey, error) {
	a := &args{}
	query := blockedKeysQuery(quoteIdent(t.Name(), '"'), "partition_key", ` INDEXED BY `+quoteIdent(t.Index("order"), '"'), a, p, uuidBytes)
	return queryBlockedKeys(ctx, q, query, a.vals)
}
