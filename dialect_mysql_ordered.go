package outbox

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strconv"
	"strings"

	"github.com/google/uuid"
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
// unordered claim, with the head check added, and locked the same way. With a namespace,
// the plain read of pending rows is bounded to a window, and the heads beyond it are found
// by visiting the keys (mysqlHeadsByKey), whose heads are checked again after locking.
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
// key), oldest first, on tx. With a namespace it runs in two steps, as the claims on the
// other databases do: a walk of the claim index bounded to the first orderedWindow(n)
// pending rows in scope, then, when that locked fewer than n rows and there are pending
// rows beyond the window, a visit of the keys (mysqlHeadsByKey). Without a namespace the
// walk has no bound.
func mysqlClaimHeads(ctx context.Context, tx *sql.Tx, t Table, p ClaimParams, n int) ([]Record, int64, error) {
	if p.Namespace == "" {
		return mysqlWalkHeads(ctx, tx, t, p, n, nil)
	}
	edge, ok, err := mysqlWindowEdge(ctx, tx, t, p, orderedWindow(n))
	if err != nil {
		return nil, 0, err
	}
	if !ok {
		// The whole pending set in scope is within the window: the walk sees all of it.
		return mysqlWalkHeads(ctx, tx, t, p, n, nil)
	}
	recs, now, err := mysqlWalkHeads(ctx, tx, t, p, n, func(a *args) string {
		return ` AND (created_at < ` + mysqlFromMicros(a.add(edge.at)) + ` OR (created_at = ` + mysqlFromMicros(a.add(edge.at)) +
			` AND id <= ` + a.add(uuidBytes(edge.id)) + `))`
	})
	if err != nil || len(recs) == n {
		return recs, now, err
	}
	more, now2, err := mysqlHeadsByKey(ctx, tx, t, p, n-len(recs), edge, recs)
	if err != nil {
		return nil, 0, err
	}
	recs = append(recs, more...)
	sortClaimOrder(recs)
	return recs, max(now, now2), nil
}

// mysqlWalkHeads is the walk: it finds up to 2n heads in the claim index, in claim order,
// with a plain read (bound, when not nil, limits it to the window), locks them and returns
// the first n it locked.
func mysqlWalkHeads(ctx context.Context, tx *sql.Tx, t Table, p ClaimParams, n int, bound func(a *args) string) ([]Record, int64, error) {
	// Twice n: concurrent claimers read the same heads and skip each other's locks, so a
	// margin keeps their batches full.
	recs, now, err := mysqlFindThenLock(ctx, tx, t, p, mysqlDue, 2*n, bound)
	if err != nil {
		return nil, 0, err
	}
	// The rows locked beyond n stay untouched and are released at commit.
	sortClaimOrder(recs)
	return recs[:min(n, len(recs))], now, nil
}

// mysqlPosition is a row's place in claim order: created_at in Unix microseconds, then id.
type mysqlPosition struct {
	at int64
	id uuid.UUID
}

// mysqlWindowEdge returns the position of the pending row in scope just past the first
// window ones, and false when there are no more than window: one walk of the claim index.
func mysqlWindowEdge(ctx context.Context, tx *sql.Tx, t Table, p ClaimParams, window int) (mysqlPosition, bool, error) {
	a := &args{}
	var edge mysqlPosition
	err := tx.QueryRowContext(ctx, `SELECT `+mysqlMicros(`created_at`)+`, id FROM `+mysqlTable(t)+
		` FORCE INDEX (`+quoteIdent(t.Index("claim"), '`')+`) WHERE status = 'pending'`+scopeSQL(a, p.Scope, "", uuidBytes)+
		` ORDER BY created_at, id LIMIT 1 OFFSET `+a.add(window), a.vals...).Scan(&edge.at, &edge.id)
	if errors.Is(err, sql.ErrNoRows) {
		return edge, false, nil
	}
	return edge, err == nil, err
}

// mysqlVisitStep is how many order-index entries one statement of the key visit reads.
const mysqlVisitStep = 32

// mysqlHeadsByKey is the key visit. It goes through the keys of p.Namespace in key order,
// a step of mysqlVisitStep order-index entries per statement starting after the last key
// of the step before, and looks up each key's first entry, its head; it stops once it has
// 2n heads that are due. It adds the oldest 2n rows without a key beyond the window (past
// edge), read from the order index's NULL part, locks those of all these that are not
// among taken, checks again, under the locks, that each is still its key's head, and
// returns the oldest n that are. It reads at most mysqlVisitStep index entries and a head
// per key visited, and the entries past the edge without a key, however many rows wait
// behind the heads.
func mysqlHeadsByKey(ctx context.Context, tx *sql.Tx, t Table, p ClaimParams, n int, edge mysqlPosition, taken []Record) ([]Record, int64, error) {
	tbl := mysqlTable(t)
	order := tbl + ` e FORCE INDEX (` + quoteIdent(t.Index("order"), '`') + `)`
	// One statement per step, with the last key of the step before it bound: neither
	// server skips through an index on a virtual column by itself (MariaDB 10.11 takes no
	// loose index scan for GROUP BY order_key), and in a recursive query the lookup of the
	// next key, which depends on the key before it, reads the order index from the
	// namespace's first entry each time, a full pass per key. A step reads the next
	// mysqlVisitStep entries of the order index and looks up the head of each key among
	// them: one key per step when keys have many rows waiting, many when they have few.
	a := &args{}
	next, err := tx.PrepareContext(ctx, `SELECT d.pk, (SELECT h.id FROM `+tbl+` h FORCE INDEX (PRIMARY) WHERE h.id = (SELECT e.id FROM `+order+
		` WHERE e.namespace = `+a.add(p.Namespace)+` AND e.order_key = d.pk AND `+orderedLive(p.OrderedSkipDead)+` ORDER BY e.created_at, e.id LIMIT 1)`+
		` AND h.status = 'pending' AND h.next_attempt_at <= UTC_TIMESTAMP(6) AND h.attempts < `+a.add(p.MaxAttempts)+scopeSQL(a, p.Scope, "h.", uuidBytes)+
		`) FROM (SELECT DISTINCT s.order_key AS pk FROM (SELECT e.order_key FROM `+order+` WHERE e.namespace = `+a.add(p.Namespace)+
		` AND e.order_key > ? ORDER BY e.order_key LIMIT `+strconv.Itoa(mysqlVisitStep)+`) s) d ORDER BY d.pk`)
	if err != nil {
		return nil, 0, err
	}
	defer next.Close()
	var keyed []uuid.UUID // due heads, in key order
	// Partition keys are never empty (an empty key is no key), so every key sorts after "".
	for after := any(""); after != nil && len(keyed) < 2*n; {
		rows, err := next.QueryContext(ctx, append(slices.Clone(a.vals), after)...)
		if err != nil {
			return nil, 0, err
		}
		after = nil
		for rows.Next() {
			var (
				pk []byte
				id uuid.NullUUID
			)
			if err := rows.Scan(&pk, &id); err != nil {
				rows.Close()
				return nil, 0, err
			}
			if id.Valid {
				keyed = append(keyed, id.UUID)
			}
			after = pk
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, 0, err
		}
	}

	a = &args{}
	unkeyed, err := queryIDs(ctx, tx, `SELECT e.id FROM `+order+
		` WHERE e.namespace = `+a.add(p.Namespace)+` AND e.order_key IS NULL AND (e.created_at > `+mysqlFromMicros(a.add(edge.at))+
		` OR (e.created_at = `+mysqlFromMicros(a.add(edge.at))+` AND e.id > `+a.add(uuidBytes(edge.id))+`))`+
		` AND e.status = 'pending' AND e.next_attempt_at <= UTC_TIMESTAMP(6) AND e.partition_key IS NULL AND e.attempts < `+a.add(p.MaxAttempts)+
		scopeSQL(a, p.Scope, "e.", uuidBytes)+` ORDER BY e.created_at, e.id LIMIT `+a.add(2*n), a.vals...)
	if err != nil {
		return nil, 0, err
	}
	held := make(map[uuid.UUID]bool, len(taken))
	for _, r := range taken {
		held[r.ID] = true
	}
	var ids []uuid.UUID
	for _, id := range slices.Concat(keyed, unkeyed) {
		if !held[id] {
			held[id] = true
			ids = append(ids, id)
		}
	}
	recs, now, err := mysqlLock(ctx, tx, t, p, mysqlDue, ids)
	if err != nil || len(recs) == 0 {
		return nil, 0, err
	}
	// The heads were found in the snapshot of the visit; check them again in a snapshot
	// taken after they were locked. A row that is still its key's head then stays so until
	// this claim commits: the rows before it are gone for good, and no one else can take it.
	a = &args{}
	heads, err := queryIDs(ctx, tx, `SELECT id FROM `+tbl+` FORCE INDEX (PRIMARY) WHERE id IN `+
		a.list(len(recs), func(i int) any { return uuidBytes(recs[i].ID) })+mysqlOrdered(t, p), a.vals...)
	if err != nil {
		return nil, 0, err
	}
	still := make(map[uuid.UUID]bool, len(heads))
	for _, id := range heads {
		still[id] = true
	}
	recs = slices.DeleteFunc(recs, func(r Record) bool { return !still[r.ID] })
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
