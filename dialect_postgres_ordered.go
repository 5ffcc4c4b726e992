package outbox

import "context"

// Ordered claims on PostgreSQL add one term to the claim's candidate read (pgOrdered):
//
//	AND ("outbox_events".partition_key IS NULL OR "outbox_events".id = (
//	    SELECT e.id FROM "outbox_events" e
//	    WHERE e.namespace = "outbox_events".namespace
//	      AND e.partition_key = "outbox_events".partition_key
//	      AND e.status IN ('pending', 'processing', 'dead') [AND e.status <> 'dead']
//	    ORDER BY e.created_at, e.id LIMIT 1))
//
// The candidate read still walks the claim index in (created_at, id) order under
// FOR UPDATE SKIP LOCKED; for each row with a key the subquery is one descent of the partial
// order index (namespace, partition_key, created_at, id) WHERE partition_key IS NOT NULL AND
// status IN ('pending', 'processing', 'dead'), whose predicate the status term repeats.
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
func pgOrdered(tbl string, p ClaimParams) string {
	if !p.Ordered {
		return ""
	}
	return ` AND ` + orderedHead(tbl, tbl, "partition_key", "", orderedLive(p.OrderedSkipDead))
}

// BlockedKeys implements [OrderedClaimer].
func (*postgresDialect) BlockedKeys(ctx context.Context, q DBTX, t Table, p BlockedKeysParams) ([]BlockedKey, error) {
	a := &args{dollar: true}
	query := blockedKeysQuery(quoteIdent(t.Name(), '"'), "partition_key", "", a, p, pgUUID)
	return queryBlockedKeys(ctx, q, query, a.vals)
}
