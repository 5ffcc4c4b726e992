// Package customdialect shows how an outside module writes its own outbox.Dialect and
// proves it with the conformance suite, using nothing but the public API.
//
// The dialect here wraps the built-in SQLite dialect and counts the statements each
// operation runs (a stand-in for real work such as metrics, or a new database's SQL).
// A dialect for another database implements the seven methods of outbox.Dialect itself;
// see the numbered checklist on that interface.
package customdialect

import (
	"context"
	"database/sql"
	"sync/atomic"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
)

// Counting wraps a dialect and counts its calls.
type Counting struct {
	outbox.Dialect
	Claims, Completes atomic.Int64
}

// New returns a counting wrapper around the SQLite dialect.
func New() *Counting { return &Counting{Dialect: outbox.SQLite()} }

// Claim counts, then delegates.
func (c *Counting) Claim(ctx context.Context, db *sql.DB, t outbox.Table, p outbox.ClaimParams) ([]outbox.Record, error) {
	c.Claims.Add(1)
	return c.Dialect.Claim(ctx, db, t, p)
}

// Complete counts, then delegates.
func (c *Counting) Complete(ctx context.Context, q outbox.DBTX, t outbox.Table, o []outbox.Outcome) ([]uuid.UUID, error) {
	c.Completes.Add(1)
	return c.Dialect.Complete(ctx, q, t, o)
}
