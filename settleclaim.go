package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
)

// CompleteAndClaim records outcomes, as [Store.Complete] does, and claims the next batch, as
// [Store.Claim] does, in one transaction, so that a relay of one's own pays one commit per
// batch instead of two. A [Publisher] does this by itself after every full batch.
//
// It returns the claimed records, in (created_at, id) order, and the ids of outcomes whose
// lease was lost (left unchanged, as Complete reports with a [*LeaseLostError]). On an error
// nothing was claimed for the caller and the outcomes may or may not have been recorded
// (the transaction's end can race a lost connection, as for any write): settle them again
// with Complete, and count a lost lease on a row that already carries the outcome as
// settled. At most [MaxBatch] outcomes. A dialect without the ability ([dialect.SettleClaimer])
// returns an error matching [errors.ErrUnsupported]; call Complete, then Claim.
func (s *Store) CompleteAndClaim(ctx context.Context, outcomes []Outcome, o ClaimOptions) (claimed []Record, lost []uuid.UUID, err error) {
	sc, ok := s.dialect.(dialect.SettleClaimer)
	if !ok {
		return nil, nil, fmt.Errorf("outbox: dialect %s cannot settle and claim in one transaction: %w", s.dialect.Name(), errors.ErrUnsupported)
	}
	if len(outcomes) > MaxBatch {
		return nil, nil, invalid("outcomes", "are %d, more than the limit of %d", len(outcomes), MaxBatch)
	}
	outcomes, err = checkOutcomes(outcomes)
	if err != nil {
		return nil, nil, err
	}
	p, err := s.claimParams(ctx, o)
	if err != nil {
		return nil, nil, err
	}
	if len(outcomes) == 0 {
		claimed, err = s.dialect.Claim(ctx, s.db, s.table, p)
	} else {
		claimed, lost, err = sc.CompleteAndClaim(ctx, s.db, s.table, outcomes, p)
	}
	if err != nil {
		return nil, nil, s.sqlError("complete and claim", err)
	}
	return claimed, lost, nil
}
