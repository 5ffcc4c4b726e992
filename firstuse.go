package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync/atomic"

	"github.com/outboxgo/outbox/dialect"
)

// firstUse holds the verdict of the check a [Store] runs at its first enqueue: nil until a
// check reached one, then a pointer to it (a nil error when the store is fit to use).
type firstUse struct {
	verdict atomic.Pointer[firstUseVerdict]
}

type firstUseVerdict struct{ err error }

// checkFirstUse runs the dialect's [dialect.FirstUseChecker] at the first enqueue of the
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
	c, ok := s.dialect.(dialect.FirstUseChecker)
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
