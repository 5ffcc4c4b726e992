package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/outboxgo/outbox/dialect"
)

// ErrMisconfigured marks a database that answers but is not set up for the outbox as the
// [Store] is configured: the table is missing or incomplete, the dialect does not match
// the server, or SQLite is opened without the settings concurrent writers need. Retrying
// does not help; the [*CheckError] that matches it says what to change.
var ErrMisconfigured = dialect.ErrMisconfigured

// CheckError is a setup problem found by [Store.Check], or met by an operation (a missing
// table): its Problem says what is wrong, its Fix what to do, and Err is the database
// error behind it, if any. It matches [ErrMisconfigured].
type CheckError = dialect.CheckError

// Check verifies that the store can work: the database answers, it is the kind the dialect
// is written for, the table exists with every column the library uses, and, on SQLite, the
// connection runs in WAL mode with a busy timeout. The built-in dialects also recognise the
// distributed SQL servers that imitate PostgreSQL or MySQL, and refuse those the claim is
// unsafe on or where the Store's settings are known to fail: TiDB (which ignores SKIP
// LOCKED), CockroachDB, YugabyteDB before 2025.2.3 unless [Options.DisableNotify] is set,
// and an outbox table that Citus distributes. A setup problem returns a [*CheckError]
// (matching [ErrMisconfigured]) that says what to do; a database that cannot be reached
// returns its error, which may pass. A [Publisher] runs Check when it starts; call it from a
// readiness probe or at startup to fail fast. A dialect that does not implement [dialect.Checker]
// returns an error matching [errors.ErrUnsupported].
func (s *Store) Check(ctx context.Context) error {
	c, ok := s.dialect.(dialect.Checker)
	if !ok {
		return fmt.Errorf("outbox: check: dialect %s cannot check its database: %w", s.dialect.Name(), errors.ErrUnsupported)
	}
	// A distributed SQL server that imitates the dialect's database is recognised first
	// (dialect.ServerChecker): the rest of the check would take it for the real thing (or,
	// for one it does not recognise at all, say only that the dialect is wrong).
	if sc, ok := s.dialect.(dialect.ServerChecker); ok {
		var ce *CheckError
		if err := sc.CheckServer(ctx, s.db, s.table, dialect.ServerParams{Notify: s.notifier != nil}); errors.As(err, &ce) {
			return err
		}
	}
	if err := c.Check(ctx, s.db, s.table); err != nil {
		var ce *CheckError
		if errors.As(err, &ce) {
			return err
		}
		return fmt.Errorf("outbox: check: %w", err)
	}
	return nil
}
