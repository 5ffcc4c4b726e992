package outbox

import "github.com/google/uuid"

// settler settles the outcomes of one claim loop's published batches. It carries the last
// batch's outcomes into the loop's next claim, to settle them in the same transaction
// (Store.CompleteAndClaim) where the dialect can (withClaim), so that a backlog drains at
// one commit per batch; it settles them alone when there is no claim to settle them with.
// Whenever a batch it carries stops holding its admission (settled alone, or joined with
// the next batch's outcomes), it tells the loop's admission.
type settler struct {
	r   *run
	adm admission
	// withClaim: the dialect settles and claims in one transaction (a dialect.SettleClaimer).
	withClaim bool
	// carried are outcomes published and not yet settled.
	carried *outcomes
}

// carrying reports whether there are outcomes to settle.
func (s *settler) carrying() bool { return s.carried != nil }

// add takes the outcomes of a batch just published, joined after those carried already
// (see keep).
func (s *settler) add(b *outcomes) {
	if s.carried != nil {
		var reclaimed []uuid.UUID
		b, reclaimed = s.carried.join(b)
		s.r.reclaimed(reclaimed)
	}
	s.carried = b
}

// settle settles the carried outcomes alone; their batch's admission ends.
func (s *settler) settle() {
	if s.carried == nil {
		return
	}
	b := s.carried
	s.carried = nil
	s.r.settle(b)
	s.adm.released()
}

// keep decides what becomes of the carried outcomes while the loop publishes a batch of n
// rows without claiming ahead: they are settled with that batch's outcomes after its
// publish, with the claim that follows, when the dialect settles with claims and both fit
// in one settle; alone now otherwise. Either way their admission ends: the batch being
// published holds its own.
func (s *settler) keep(n int) {
	switch {
	case s.carried == nil:
	case s.withClaim && len(s.carried.items)+n <= MaxBatch:
		s.adm.released()
	default:
		s.settle()
	}
}

// claim settles the carried outcomes and claims the next batch: in one transaction where
// the dialect can, one after the other otherwise. The carried batch's admission passes to
// the claim.
func (s *settler) claim(o ClaimOptions) ([]Record, error) {
	r := s.r
	defer r.watch("a claim")()
	b := s.carried
	s.carried = nil
	if b != nil && !s.withClaim {
		r.settle(b)
		b = nil
	}
	octx := r.startClaim()
	var recs []Record
	var err error
	if b == nil {
		recs, err = r.p.store.Claim(r.work, o)
	} else {
		recs, err = s.settleAndClaim(b, o)
	}
	r.endClaim(octx, len(recs), err)
	return recs, err
}

// settleAndClaim settles b and claims the next batch in one transaction
// (Store.CompleteAndClaim). When that fails, it settles b alone, and returns the error for
// the claim loop to back off.
func (s *settler) settleAndClaim(b *outcomes, o ClaimOptions) ([]Record, error) {
	r := s.r
	outs := b.pending()
	if len(outs) == 0 {
		return r.p.store.Claim(r.work, o)
	}
	recs, lost, err := r.p.store.CompleteAndClaim(r.work, outs, o)
	if err != nil {
		if r.work.Err() == nil {
			b.sent = true // the transaction may have committed with its reply lost: settle knows
			r.settle(b)
		}
		return nil, err
	}
	r.lostLeases(lost, b.lost, "settling")
	r.report(b)
	return recs, nil
}
