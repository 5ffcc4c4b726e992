package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

// ClaimCounter wraps a dialect and records when each claim ran, through Claim or
// CompleteAndClaim, keeping the abilities the publisher uses (settle-and-claim, NOTIFY):
// tests of the circuit breaker count the claims made while it was open with Between.
type ClaimCounter struct {
	outbox.Dialect
	mu    sync.Mutex
	times []time.Time
}

func (d *ClaimCounter) note() {
	d.mu.Lock()
	d.times = append(d.times, time.Now())
	d.mu.Unlock()
}

func (d *ClaimCounter) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]outbox.Record, error) {
	d.note()
	return d.Dialect.Claim(ctx, db, t, p)
}

var _ dialect.SettleClaimer = (*ClaimCounter)(nil)

func (d *ClaimCounter) CompleteAndClaim(ctx context.Context, db *sql.DB, t dialect.Table, outs []outbox.Outcome, p dialect.ClaimParams) ([]outbox.Record, []uuid.UUID, error) {
	d.note()
	return d.Dialect.(dialect.SettleClaimer).CompleteAndClaim(ctx, db, t, outs, p)
}

// Signal and Listen pass NOTIFY through where the wrapped dialect has it; elsewhere a
// signal is nothing and listening is unsupported, as the publisher expects of a driver
// that cannot listen.
func (d *ClaimCounter) Signal(ctx context.Context, q dialect.DBTX, t dialect.Table, ns string) error {
	if n, ok := d.Dialect.(dialect.Notifier); ok {
		return n.Signal(ctx, q, t, ns)
	}
	return nil
}

func (d *ClaimCounter) Listen(ctx context.Context, db *sql.DB, t dialect.Table, ready func(), wake func(string)) error {
	if n, ok := d.Dialect.(dialect.Notifier); ok {
		return n.Listen(ctx, db, t, ready, wake)
	}
	return errors.ErrUnsupported
}

// Between counts the claims in (from, to).
func (d *ClaimCounter) Between(from, to time.Time) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, at := range d.times {
		if at.After(from) && at.Before(to) {
			n++
		}
	}
	return n
}
