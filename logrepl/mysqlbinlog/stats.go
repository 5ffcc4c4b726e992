package outboxbinlog

import (
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
)

// Stats are a [Publisher]'s counters since it was made, and its position as last read.
type Stats struct {
	// Delivered, Retried and Dead count the outcomes the Publisher settled; LeaseLost the
	// rows whose insert lease had run out, which polling owned by then.
	Delivered, Retried, Dead, LeaseLost int64
	// Reading is whether the Publisher holds the reader lock and follows the binlog now.
	// Standby is whether it waits because another reader holds the lock.
	Reading, Standby bool
	// Position is the last position written to the position table, where a restart
	// resumes: a GTID set, or file:offset on a MySQL server without GTIDs. It lags the
	// settled outcomes by up to Options.PositionInterval.
	Position string
	// LagBytes is how far the last position read is behind the end of the server's
	// binlog, summed over its files, as read every HeartbeatInterval.
	LagBytes int64
	// Resets counts the times the binlog at the stored position was found purged and the
	// Publisher stored the server's current position to start again from; polling
	// delivers the rows committed meanwhile, and the binlog those committed after the count.
	Resets int64
	// Skipped counts the rows read after a start, from a stored position that may lag the
	// outcomes, that were not published because they were no longer under their insert
	// lease: settled by an earlier session, or taken over by polling.
	Skipped int64
	// CommitToPublish is, for the last batch, the time from its first transaction's commit
	// (the binlog event's timestamp, whole seconds on the server's clock) to its hand-over
	// to the transport.
	CommitToPublish time.Duration
}

type stats struct {
	delivered, retried, dead, leaseLost atomic.Int64
	reading, standby                    atomic.Bool
	position                            atomic.Pointer[string]
	lagBytes, resets, skipped           atomic.Int64
	commitToPublish                     atomic.Int64
}

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

// Stats returns the Publisher's counters and its position.
func (p *Publisher) Stats() Stats {
	st := Stats{
		Delivered: p.stats.delivered.Load(), Retried: p.stats.retried.Load(), Dead: p.stats.dead.Load(),
		LeaseLost: p.stats.leaseLost.Load(), Reading: p.stats.reading.Load(), Standby: p.stats.standby.Load(),
		LagBytes: p.stats.lagBytes.Load(), Resets: p.stats.resets.Load(), Skipped: p.stats.skipped.Load(),
		CommitToPublish: time.Duration(p.stats.commitToPublish.Load()),
	}
	if s := p.stats.position.Load(); s != nil {
		st.Position = *s
	}
	return st
}
