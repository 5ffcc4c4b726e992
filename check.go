package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"

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
	// (CheckServer): the rest of the check would take it for the real thing (or, for one it
	// does not recognise at all, say only that the dialect is wrong).
	{
		var ce *CheckError
		if err := c.CheckServer(ctx, s.db, s.table, dialect.ServerParams{Notify: s.notifier != nil}); errors.As(err, &ce) {
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

// firstUse holds the verdict of the check a [Store] runs at its first enqueue: nil until a
// check reached one, then a pointer to it (a nil error when the store is fit to use).
type firstUse struct {
	verdict atomic.Pointer[firstUseVerdict]
}

type firstUseVerdict struct{ err error }

// checkFirstUse runs the dialect's [dialect.Checker.CheckFirstUse] at the first enqueue of the
// store, on the caller's own transaction q, and keeps its verdict: its [*CheckError] (a
// dialect that does not match the pool, SQLite without WAL or a busy timeout), which every
// later enqueue returns, or a pass. A dialect without the ability passes: its own Check,
// if any, is for its user to run.
//
// It costs one atomic load per call once a verdict is reached. An error of the check that
// may pass (a cancelled context, a lost connection, a transaction already aborted) is no
// verdict: the call goes on as if the check had passed, the statement that follows fails
// as it would have, and the next call checks again. Any other error means the dialect
// could not tell (a server it does not recognise): the store passes, and Check still
// reports what it is.
func (s *Store) checkFirstUse(ctx context.Context, q dialect.DBTX) error {
	if v := s.first.verdict.Load(); v != nil {
		return v.err
	}
	v := s.firstUseVerdict(ctx, q)
	if v == nil {
		return nil
	}
	s.first.verdict.CompareAndSwap(nil, v)
	return v.err
}

// passed is the verdict of a store fit to use.
var passed = &firstUseVerdict{}

// firstUseVerdict runs the check; nil when it reached no verdict.
func (s *Store) firstUseVerdict(ctx context.Context, q dialect.DBTX) *firstUseVerdict {
	c, ok := s.dialect.(dialect.Checker)
	if !ok {
		return passed
	}
	err := c.CheckFirstUse(ctx, s.db.Driver(), q)
	var ce *CheckError
	switch {
	case err == nil:
		return passed
	case errors.As(err, &ce):
		return &firstUseVerdict{err: err}
	case transient(ctx, err):
		return nil
	default:
		return passed // the dialect could not tell: Check says what the server is
	}
}

// transient reports whether err, met by a check query, may pass: the context ended, the
// connection or transaction is gone, or the transaction was aborted by an earlier
// statement (PostgreSQL's 25P02), as opposed to a server's answer to the query itself.
func transient(ctx context.Context, err error) bool {
	var state interface{ SQLState() string }
	return ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrTxDone) || errors.Is(err, sql.ErrConnDone) ||
		(errors.As(err, &state) && state.SQLState() == "25P02")
}

// A transaction wrapper that formats queries itself (bun.Tx) sends a dialect's statement
// without its arguments, so Enqueue refuses it before any SQL runs and says to pass the
// *sql.Tx it embeds; it does not look through the wrapper unasked, which would hide the
// insert from a wrapper that traces its queries (docs/design.md, "Transaction wrappers").

// formattingTx returns, for a transaction type known to format queries itself, the
// expression of the *sql.Tx it embeds; "" for any other type.
func formattingTx(tx Tx) string {
	if _, ok := tx.(*sql.Tx); ok {
		return "" // the common case, without reflection
	}
	t := reflect.TypeOf(tx)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.PkgPath() == "github.com/uptrace/bun" && t.Name() == "Tx" {
		return "tx.Tx"
	}
	return ""
}

// checkTx refuses, before any SQL runs, a transaction type known to rewrite the dialect's
// placeholders; the caller's transaction stays usable.
func checkTx(tx Tx) error {
	if fix := formattingTx(tx); fix != "" {
		return &CheckError{
			Problem: fmt.Sprintf("%T formats each query itself and rewrites the dialect's placeholders, so the outbox cannot write on it", tx),
			Fix:     fmt.Sprintf("pass %s, the *sql.Tx it embeds: the same transaction", fix),
		}
	}
	return nil
}

// placeholderError explains a PostgreSQL "there is no parameter $n" (SQLSTATE 42P02) met
// by an enqueue on q when q is not a *sql.Tx: a wrapper sent the statement without its
// arguments. It returns nil for any other error.
func placeholderError(q any, err error) error {
	if _, ok := q.(*sql.Tx); ok {
		return nil
	}
	var state interface{ SQLState() string }
	if !errors.As(err, &state) || state.SQLState() != "42P02" {
		return nil
	}
	return &CheckError{
		Problem: fmt.Sprintf("%T sent the statement without its arguments: it rewrites queries or their placeholders", q),
		Fix:     "pass the *sql.Tx it wraps (for a wrapper that embeds one, the embedded field), or a Tx that passes queries and arguments on unchanged",
		Err:     err,
	}
}
