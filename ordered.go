package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/outboxgo/outbox/dialect"
)

// BlockedKey is a partition key whose head row is dead, as [Store.BlockedKeys] reports it:
// its Namespace and PartitionKey, the dead head row (HeadID, Topic, LastError) and how many
// rows are Waiting behind it. Ordered publishers with the default head-of-line policy
// deliver nothing more of the key until an operator replays the head (it goes back to
// pending and is delivered first) or discards it (the next row becomes the head).
type BlockedKey = dialect.BlockedKey

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
