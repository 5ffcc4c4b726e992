package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync/atomic"

	"github.com/outboxgo/outbox/internal/dbkind"

	"github.com/outboxgo/outbox/dialect"
)

// firstUse holds the verdict of the check a [Store] runs at its first enqueue: nil until a
// check reached one, then a pointer to it (a nil error when the store is fit to use).
type firstUse struct {
	verdict atomic.Pointer[firstUseVerdict]
}

type firstUseVerdict struct{ err error }

// checkFirstUse catches, at the first enqueue of a store with a built-in dialect, the two
// setup mistakes that would otherwise show up late or as something else: a dialect that
// does not match the pool (an SQL syntax error) and SQLite without WAL or a busy timeout
// (fine until a publisher runs beside the producers). Its error is the [*CheckError] that
// [Store.Check] returns for the same problem.
//
// It costs one atomic load per call once a verdict is reached. It reaches one on the caller's
// own transaction q, never on another connection of the pool (the caller holds one; on a pool
// of one connection a second would wait forever), and with statements that cannot fail on
// the server they are sent to, since a failed statement aborts a PostgreSQL transaction:
//
//   - the kind of server comes from the type of the pool's driver (pgx, lib/pq,
//     go-sql-driver/mysql, modernc.org/sqlite, mattn/go-sqlite3), without a query; only a
//     driver it does not know (one wrapped by a tracing package) is asked SELECT version()
//     (valid on PostgreSQL and MySQL) and, where that fails, as it does on SQLite without
//     harm to the transaction, SELECT sqlite_version();
//   - a mismatch is described as Check describes it, by the server's own version query;
//   - on SQLite, PRAGMA journal_mode and PRAGMA busy_timeout are read on the caller's
//     connection.
//
// An error on the way that may pass (a cancelled context, a lost connection, a transaction
// already aborted) is no verdict: the call goes on as if the check had passed, the
// statement that follows fails as it would have, and the next call checks again. A server it
// does not recognise, or that answers neither version query, passes; Check still reports it.
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
	var name string
	switch s.dialect.(type) {
	case *postgresDialect, mysqlDialect, sqliteDialect:
		name = s.dialect.Name()
	default:
		return passed // a dialect of the user's: its own Check, if any, is for them to run
	}
	kind := dbkind.FromDriver(s.db.Driver())
	if kind != name {
		found, desc, err := dbkind.Version(ctx, q, kind)
		switch {
		case err != nil && transient(ctx, err):
			return nil
		case err != nil:
			return passed // a server that knows neither version query: Check says what it is
		case found == "":
			return passed // a server not recognised: Check says so, enqueue lets it try
		case found != name:
			return &firstUseVerdict{err: wrongDialect(desc, found, name)}
		}
	}
	if name != "sqlite" {
		return passed
	}
	var mode string
	var timeout int
	err := q.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode)
	if err == nil {
		err = q.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&timeout)
	}
	switch {
	case err != nil && transient(ctx, err):
		return nil
	case err != nil:
		return passed // not SQLite as the dialect knows it after all: Check says what it is
	}
	if err := sqliteSettings(mode, timeout); err != nil {
		return &firstUseVerdict{err: err}
	}
	return passed
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
