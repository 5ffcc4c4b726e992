package outboxpglog

import (
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
)

// Stats are a [Publisher]'s counters since it was made, and its slot's state as last read.
type Stats struct {
	// Delivered, Retried and Dead count the outcomes the Publisher settled; LeaseLost the
	// rows whose insert lease had run out, which polling owned by then.
	Delivered, Retried, Dead, LeaseLost int64
	// Reading is whether the Publisher holds its slot now: every transaction that commits
	// from then on is read from the log, while rows committed before the first session
	// created the slot are polling's. Standby is whether it waits because another reader
	// holds it.
	Reading, Standby bool
	// ConfirmedLSN is the last position confirmed to the server: every outcome before it
	// is committed.
	ConfirmedLSN uint64
	// SlotLagBytes is how far the slot's confirmed position is behind the server's WAL,
	// and RetainedWALBytes how much WAL the slot keeps from being recycled, as read at the
	// last heartbeat. Alert when they grow: a slot that falls max_slot_wal_keep_size
	// behind is invalidated.
	SlotLagBytes, RetainedWALBytes int64
	// WALStatus is pg_replication_slots.wal_status: reserved, extended, unreserved (about
	// to be lost) or lost.
	WALStatus string
	// SlotResets counts the times the slot was found dropped or invalidated and created
	// again, counted once it exists again: polling delivers the rows committed meanwhile,
	// and the log those committed after the count.
	SlotResets int64
	// CommitToPublish is, for the last batch, the time from its first transaction's commit
	// (the server's clock) to its hand-over to the transport (this host's clock).
	CommitToPublish time.Duration
}

type stats struct {
	delivered, retried, dead, leaseLost atomic.Int64
	reading, standby                    atomic.Bool
	confirmed                           atomic.Uint64
	lagBytes, retainedBytes             atomic.Int64
	walStatus                           atomic.Pointer[string]
	slotResets                          atomic.Int64
	commitToPublish                     atomic.Int64
}

func (s *stats) setWALStatus(v string) { s.walStatus.Store(&v) }

// count adds settled outcomes, those of the rows in lost excepted, which count as lost
// leases.
func (s *stats) count(outcomes []outbox.Outcome, lost []uuid.UUID) {
	gone := map[uuid.UUID]bool{}
	for _, id := range lost {
		gone[id] = true
	}
	for _, o := range outcomes {
		switch {
		case gone[o.ID]:
			s.leaseLost.Add(1)
		case o.Status == outbox.StatusDelivered:
			s.delivered.Add(1)
		case o.Status == outbox.StatusDead:
			s.dead.Add(1)
		default:
			s.retried.Add(1)
		}
	}
}

// Stats returns the Publisher's counters and its slot's state.
func (p *Publisher) Stats() Stats {
	st := Stats{
		Delivered: p.stats.delivered.Load(), Retried: p.stats.retried.Load(), Dead: p.stats.dead.Load(),
		LeaseLost: p.stats.leaseLost.Load(), Reading: p.stats.reading.Load(), Standby: p.stats.standby.Load(), ConfirmedLSN: p.stats.confirmed.Load(),
		SlotLagBytes: p.stats.lagBytes.Load(), RetainedWALBytes: p.stats.retainedBytes.Load(),
		SlotResets: p.stats.slotResets.Load(), CommitToPublish: time.Duration(p.stats.commitToPublish.Load()),
	}
	if w := p.stats.walStatus.Load(); w != nil {
		st.WALStatus = *w
	}
	return st
}
