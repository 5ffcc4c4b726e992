package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
)

// BlockedKey is a partition key whose head row is dead, as [Store.BlockedKeys] reports it:
// its Namespace and PartitionKey, the dead head row (HeadID, Topic, LastError) and how many
// rows are Waiting behind it. Ordered publishers with the default head-of-line policy
// deliver nothing more of the key until an operator replays the head (it goes back to
// pending and is delivered first) or discards it (the next row becomes the head).
type BlockedKey = dialect.BlockedKey

// orderedWindow is how many rows of the claim index an ordered claim of limit rows walks
// before it visits the keys instead (when it has a namespace to visit): enough to fill a
// batch while up to half the rows are held back. The bound itself is a walk of that many
// index entries, so it is kept near what a healthy claim walks anyway.
func orderedWindow(limit int) int { return 2*limit + 50 }

// errOrderedUnsupported is the error for an ordered claim on a dialect without the ability.
func errOrderedUnsupported(d Dialect) error {
	return fmt.Errorf("outbox: dialect %s cannot claim in order per partition key: %w", d.Name(), errors.ErrUnsupported)
}

// orderedClaimer returns the store's dialect as an [dialect.OrderedClaimer], or the error to report.
func (s *Store) orderedClaimer() (dialect.OrderedClaimer, error) {
	oc, ok := s.dialect.(dialect.OrderedClaimer)
	if !ok {
		return nil, errOrderedUnsupported(s.dialect)
	}
	return oc, nil
}

// checkOrdered runs the dialect's [dialect.OrderedClaimer.CheckOrdered] until it passes once for
// the store, and returns its [*CheckError] when the table lacks what ordered claims need:
// an ordered claim without the order index would not fail, it would read the whole table
// each time. After the check passed, ordered claims run no extra query. A dialect that
// cannot tell passes.
func (s *Store) checkOrdered(ctx context.Context, oc dialect.OrderedClaimer) error {
	if s.orderedReady.Load() {
		return nil
	}
	err := oc.CheckOrdered(ctx, s.db, s.table)
	if err == nil || errors.Is(err, errors.ErrUnsupported) {
		s.orderedReady.Store(true)
		return nil
	}
	var ce *CheckError
	if errors.As(err, &ce) {
		return err
	}
	return fmt.Errorf("outbox: check ordered: %w", err)
}

// BlockedKeys lists up to limit (1..[MaxBatch]) partition keys in scope whose head row is
// dead while at least one later row of the key is pending or processing, oldest head
// first: the keys that ordered publishers with the default head-of-line policy hold back.
// Replay or discard the head to release a key. A dialect without the ordered ability
// ([dialect.OrderedClaimer]) returns an error matching [errors.ErrUnsupported], and a table without
// the order index (the ordered migration set) a [*CheckError].
//
// It reads every dead row in scope (through the retention index), so it is an operator's
// query, not one to poll many times a second.
func (s *Store) BlockedKeys(ctx context.Context, scope Scope, limit int) ([]BlockedKey, error) {
	if err := validateScope(scope); err != nil {
		return nil, err
	}
	if limit < 1 || limit > MaxBatch {
		return nil, invalid("Limit", "must be between 1 and %d, got %d", MaxBatch, limit)
	}
	oc, err := s.orderedClaimer()
	if err != nil {
		return nil, err
	}
	if err := s.checkOrdered(ctx, oc); err != nil {
		return nil, err
	}
	keys, err := oc.BlockedKeys(ctx, s.db, s.table, dialect.BlockedKeysParams{Scope: scope, Limit: limit})
	if err != nil {
		return nil, s.sqlError("blocked keys", err)
	}
	return keys, nil
}

// orderedHead renders the condition under which the row of the enclosing query, named
// outer (the quoted table name or its alias), may be claimed in order: it has no partition
// key, or it is the first row of its key among those that hold the key back. keyCol is the
// column the index keeps the key in for such rows (partition_key, or MySQL's order_key),
// live the status terms that make a row hold the key back, matching the order index's
// predicate, and index an index hint placed after the inner table's alias ("" for none).
// The inner read is one descent of the order index: its first entry for the key.
func orderedHead(tbl, outer, keyCol, index, live string) string {
	return `(` + outer + `.partition_key IS NULL OR ` + outer + `.id = (SELECT e.id FROM ` + tbl + ` e` + index +
		` WHERE e.namespace = ` + outer + `.namespace AND e.` + keyCol + ` = ` + outer + `.partition_key AND ` + live +
		` ORDER BY e.created_at, e.id LIMIT 1))`
}

// orderedLive returns the status terms of the rows that hold a key back: pending,
// processing and, unless skipDead, dead. The first term is the order index's own predicate,
// written the same way, so that every database sees that the index applies.
func orderedLive(skipDead bool) string {
	live := `e.status IN ('pending', 'processing', 'dead')`
	if skipDead {
		live += ` AND e.status <> 'dead'`
	}
	return live
}

// blockedKeysQuery renders the query of BlockedKeys for the built-in dialects: dead rows
// that are their key's head, with the count of pending and processing rows of the key,
// where at least one waits. keyCol is as for orderedHead; a renders placeholders; enc binds
// the scope's tenant.
//
// The inner select finds the blocked heads, oldest first, testing each dead row with two
// descents of the order index: its key's head, and whether a live row of the key exists
// (EXISTS, which stops at the first). Only the up to p.Limit heads it returns are counted.
// Counting in the filter instead read every waiting row of every dead head, twice, and on
// PostgreSQL its estimate (10,000 dead rows: above jit_above_cost) set off JIT compilation,
// which took longer than the query: 75 ms against 36 ms.
func blockedKeysQuery(tbl, keyCol, index string, a *args, p dialect.BlockedKeysParams, enc func(uuid.UUID) any) string {
	live := func(alias, of string) string {
		return alias + `.namespace = ` + of + `.namespace AND ` + alias + `.` + keyCol + ` = ` + of +
			`.partition_key AND ` + alias + `.status IN ('pending', 'processing', 'dead') AND ` + alias + `.status <> 'dead'`
	}
	return `SELECT b.namespace, b.partition_key, b.id, b.topic, b.last_error, (SELECT COUNT(*) FROM ` + tbl + ` w` + index +
		` WHERE ` + live("w", "b") + `) AS waiting FROM (SELECT h.namespace, h.partition_key, h.id, h.topic, h.last_error, h.created_at FROM ` + tbl + ` h` +
		` WHERE h.status = 'dead' AND h.partition_key IS NOT NULL` + scopeSQL(a, p.Scope, "h.", enc) +
		` AND ` + orderedHead(tbl, "h", keyCol, index, orderedLive(false)) +
		` AND EXISTS (SELECT 1 FROM ` + tbl + ` x` + index + ` WHERE ` + live("x", "h") + `)` +
		` ORDER BY h.created_at, h.id LIMIT ` + a.Add(p.Limit) + `) b ORDER BY b.created_at, b.id`
}

// queryBlockedKeys runs a query rendered by blockedKeysQuery.
func queryBlockedKeys(ctx context.Context, q dialect.DBTX, query string, vals []any) ([]BlockedKey, error) {
	return queryAll(ctx, q, query, vals, func(s rowScanner) (BlockedKey, error) {
		var (
			k       BlockedKey
			lastErr nullString
		)
		err := s.Scan(&k.Namespace, &k.PartitionKey, &k.HeadID, &k.Topic, &lastErr, &k.Waiting)
		k.LastError = string(lastErr)
		return k, err
	})
}

// nullString scans a nullable text or binary column as a string ("" for NULL).
type nullString string

func (n *nullString) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*n = ""
	case string:
		*n = nullString(v)
	case []byte:
		*n = nullString(v)
	default:
		return fmt.Errorf("outbox: cannot scan %T into a string", src)
	}
	return nil
}
