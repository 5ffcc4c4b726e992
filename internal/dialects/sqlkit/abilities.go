package sqlkit

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
)

// This file holds the abilities that only the built-in dialects have: the engine finds
// each by a type assertion, as it finds the public ones of package dialect, but they are
// no part of the contract a dialect of one's own meets, so they may change in any release.

// Schemer is the ability to place the table in a named schema (dialect.NewTableIn). The
// engine refuses a table with a schema, before any statement runs, for a dialect that lacks
// it; a dialect that has it qualifies the table by its schema wherever it renders it, and
// so the names of indexes and of notification channels derived from it. The PostgreSQL
// dialect implements it.
type Schemer interface {
	// SupportsSchema reports whether the dialect honours dialect.Table.Schema.
	SupportsSchema() bool
}

// LeasedInserter is the ability to insert a row already leased (dialect.Row.Lease), which a
// reader of the database's log needs so that no claim takes the rows it delivers. The
// engine refuses outbox.Options.LogLease, before any statement runs, for a dialect that
// lacks it. The PostgreSQL and MySQL dialects implement it; SQLite refuses a leased row with
// [CheckInsertLeases].
type LeasedInserter interface {
	// InsertsLeased reports whether Insert honours dialect.Row.Lease.
	InsertsLeased() bool
}

// CheckInsertLeases returns an error matching errors.ErrUnsupported when a row carries a
// lease (dialect.Row.Lease), for a dialect that cannot insert one; nil otherwise.
func CheckInsertLeases(rows []dialect.Row) error {
	for i := range rows {
		if rows[i].Lease.Duration != 0 {
			return fmt.Errorf("dialect: Row.Lease is set and this dialect cannot insert a leased row: %w", errors.ErrUnsupported)
		}
	}
	return nil
}

// PoolBinder lets a dialect keep state per pool, such as prepared statements. outbox.New
// calls BindPool with the Store's pool and uses the Dialect it returns in place of the one
// it was given, so that the state lives and dies with the Store (a prepared *sql.Stmt
// belongs to one pool and is closed with it). The returned Dialect must have every ability
// the original has, and it must run its statements only on the pool it was bound to. A
// dialect value that was not bound (wrapped by a test's dialect, say) must still work: it
// keeps no such state. The SQLite dialect implements it.
type PoolBinder interface {
	// BindPool returns the dialect bound to db.
	BindPool(db *sql.DB) dialect.Dialect
}

// PollingListener is implemented by a dialect.Notifier whose Listen asks the database at
// an interval rather than waiting for a signal the server pushes: every listener then costs
// the database queries while idle. The MySQL and SQLite dialects implement it. A Publisher
// listens all the same, for wake-ups within milliseconds; a Relay, which bounds the idle
// queries of its many stores with its probe pace, does not listen to such stores.
type PollingListener interface {
	dialect.Notifier
	// IdlePollInterval is the longest pause between two queries of an idle listener.
	IdlePollInterval() time.Duration
}

// Renderer renders the statements of an enqueue instead of running them, so that the
// engine can run them on a connection that database/sql does not manage: package pgxv5
// enqueues on a pgx transaction with it, through the engine's Store.EnqueueOn and a
// dialect.Runner. The PostgreSQL dialect implements it and builds its own Insert and Signal
// from the same renderings, run with [RunInsert] and [DBTXRunner], so that an insert is
// built one way whatever runs it. A dialect whose insert needs the answer of one statement
// to render the next (MySQL's, which reserves dedupe keys first) cannot.
//
//  1. RenderInsert returns the statements that write rows, in order, as Insert would run
//     them: the same SQL, with arguments that the database's native driver binds as
//     database/sql binds them (strings, []byte, int64, slices of them). Each statement
//     writes the next [InsertStatement.Rows] of rows; together they write all.
//  2. Each statement says, in [InsertStatement.Result], how its caller learns which rows
//     went in, and a duplicate dedupe key never raises an error (it would abort the
//     caller's transaction on PostgreSQL): see [InsertResult].
//  3. RenderSignal returns the statement that Signal runs for namespace, to be run with
//     dialect.Runner.Exec on the caller's transaction, and false when the dialect sends
//     no signal.
//
// The renderings depend only on their arguments: they read no connection state.
type Renderer interface {
	RenderInsert(t dialect.Table, rows []dialect.Row) ([]InsertStatement, error)
	RenderSignal(t dialect.Table, namespace string) (Statement, bool)
}

// Statement is one SQL statement and its arguments, with the placeholders of the database.
type Statement struct {
	Query string
	Args  []any
}

// InsertStatement is one statement of a [Renderer]'s insert.
type InsertStatement struct {
	Statement
	// Rows is how many rows it writes: the next Rows of those rendered, in order.
	Rows int
	// Result says how its caller learns which of its rows were inserted.
	Result InsertResult
}

// InsertResult is how a caller learns which rows of an [InsertStatement] were inserted;
// [RunInsert] reads each kind.
type InsertResult uint8

const (
	// InsertedAll: the statement inserts all its rows or fails (none has a dedupe key).
	// Run it with dialect.Runner.Exec.
	InsertedAll InsertResult = iota
	// InsertedIfAffected: the statement writes one row and skips it, without an error,
	// when its dedupe key exists. Run it with dialect.Runner.Exec; one affected row means
	// it went in.
	InsertedIfAffected
	// InsertedReturned: the statement skips rows whose dedupe key exists, without an
	// error, and returns the id of each row it inserted, one column. Run it with
	// dialect.Runner.QueryIDs; a row whose id is not returned was a duplicate.
	InsertedReturned
)

// RunInsert runs the statements of a [Renderer]'s insert of rows on r, in order, and
// returns which rows went in, as dialect.Dialect.Insert returns them. A statement that does
// not account for its rows, or statements that do not add up to rows, are errors of the
// dialect's.
func RunInsert(ctx context.Context, r dialect.Runner, stmts []InsertStatement, rows []dialect.Row) ([]bool, error) {
	inserted := make([]bool, len(rows))
	done := 0
	for _, st := range stmts {
		if st.Rows < 1 || st.Rows > len(rows)-done {
			return nil, fmt.Errorf("insert statement of %d rows after %d of %d", st.Rows, done, len(rows))
		}
		part := inserted[done : done+st.Rows]
		switch st.Result {
		case InsertedAll, InsertedIfAffected:
			n, err := r.Exec(ctx, st.Query, st.Args...)
			if err != nil {
				return nil, err
			}
			if st.Result == InsertedIfAffected && st.Rows != 1 {
				return nil, fmt.Errorf("insert statement of %d rows reports by affected rows", st.Rows)
			}
			for i := range part {
				part[i] = st.Result == InsertedAll || n == 1
			}
		case InsertedReturned:
			ids, err := r.QueryIDs(ctx, st.Query, st.Args...)
			if err != nil {
				return nil, err
			}
			got := make(map[uuid.UUID]bool, len(ids))
			for _, id := range ids {
				got[id] = true
			}
			for i := range part {
				part[i] = got[rows[done+i].ID]
			}
		default:
			return nil, fmt.Errorf("insert statement with unknown result kind %d", st.Result)
		}
		done += st.Rows
	}
	if done != len(rows) {
		return nil, fmt.Errorf("insert statements write %d of %d rows", done, len(rows))
	}
	return inserted, nil
}

// DBTXRunner returns a dialect.Runner that runs statements on q: what a [Renderer]
// dialect's own Insert and Signal run their renderings with.
func DBTXRunner(q dialect.DBTX) dialect.Runner { return dbtxRunner{q} }

type dbtxRunner struct{ q dialect.DBTX }

func (r dbtxRunner) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := r.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (r dbtxRunner) QueryIDs(ctx context.Context, query string, args ...any) ([]uuid.UUID, error) {
	return dialect.QueryIDs(ctx, r.q, query, args...)
}
