package main

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"sync/atomic"
)

// txCounter counts, at the database/sql driver level, what the connections of one pool sent:
// statements outside a transaction (each is its own autocommit transaction), statements
// inside one, commits and rollbacks, and connections opened. It is the client-side half of the
// commit count; each backend confirms it with a server-side counter (see backend.countStart).
type txCounter struct {
	autocommit, autocommitReads, inTx, commits, rollbacks, conns atomic.Int64
}

// counts is a snapshot of a txCounter.
type counts struct {
	Autocommit int64 `json:"autocommit_statements"`
	// AutocommitReads are the autocommit statements among them that begin with SELECT:
	// a read, such as the MySQL listener's probe for other processes' commits.
	AutocommitReads int64 `json:"autocommit_reads"`
	InTx            int64 `json:"statements_in_tx"`
	Commits         int64 `json:"tx_commits"`
	Rollbacks       int64 `json:"tx_rollbacks"`
	Conns           int64 `json:"connections_opened"`
}

func (c *txCounter) snapshot() counts {
	return counts{
		Autocommit: c.autocommit.Load(), AutocommitReads: c.autocommitReads.Load(), InTx: c.inTx.Load(), Commits: c.commits.Load(),
		Rollbacks: c.rollbacks.Load(), Conns: c.conns.Load(),
	}
}

// Transactions is the number of committed transactions the client asked for: autocommit
// statements plus explicit commits.
func (c counts) Transactions() int64 { return c.Autocommit + c.Commits }

// Writes is the number of transactions that could write: Transactions less the autocommit
// reads.
func (c counts) Writes() int64 { return c.Transactions() - c.AutocommitReads }

// openCountingDB opens a pool on dsn through driverName's connector, with every connection
// wrapped to count into a new txCounter. The wrapper forwards every optional interface the
// drivers implement (named-value checking, session reset, validity), so the drivers behave
// exactly as unwrapped; it costs an interface call per statement, the same for library and
// raw runs.
func openCountingDB(driverName, dsn string, maxConns int) (*sql.DB, *txCounter, error) {
	probe, err := sql.Open(driverName, "")
	if err != nil {
		return nil, nil, err
	}
	drv := probe.Driver()
	_ = probe.Close()
	var conn driver.Connector
	if dc, ok := drv.(driver.DriverContext); ok {
		if conn, err = dc.OpenConnector(dsn); err != nil {
			return nil, nil, err
		}
	} else {
		conn = dsnConnector{drv: drv, dsn: dsn}
	}
	c := &txCounter{}
	db := sql.OpenDB(countingConnector{Connector: conn, c: c})
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns) // never close a connection mid-run: server-side session counters live on them
	return db, c, nil
}

type dsnConnector struct {
	drv driver.Driver
	dsn string
}

func (d dsnConnector) Connect(context.Context) (driver.Conn, error) { return d.drv.Open(d.dsn) }
func (d dsnConnector) Driver() driver.Driver                        { return d.drv }

type countingConnector struct {
	driver.Connector
	c *txCounter
}

func (cc countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := cc.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	cc.c.conns.Add(1)
	return &countingConn{Conn: conn, c: cc.c}, nil
}

// countingConn is used by one goroutine at a time (database/sql guarantees it), so inTx
// needs no lock.
type countingConn struct {
	driver.Conn
	c    *txCounter
	inTx bool
}

// Unwrap returns the driver's own connection, through which the library's PostgreSQL
// listener reaches pgx.
func (x *countingConn) Unwrap() driver.Conn { return x.Conn }

func (x *countingConn) count(query string) {
	if x.inTx {
		x.c.inTx.Add(1)
		return
	}
	x.c.autocommit.Add(1)
	if isRead(query) {
		x.c.autocommitReads.Add(1)
	}
}

// isRead reports whether query begins with SELECT (after blanks), a statement that
// changes nothing.
func isRead(query string) bool {
	q := strings.TrimLeft(query, " \t\r\n")
	return len(q) >= 6 && strings.EqualFold(q[:6], "select")
}

func (x *countingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	ec, ok := x.Conn.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	r, err := ec.ExecContext(ctx, query, args)
	if !errors.Is(err, driver.ErrSkip) {
		x.count(query)
	}
	return r, err
}

func (x *countingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	qc, ok := x.Conn.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	r, err := qc.QueryContext(ctx, query, args)
	if !errors.Is(err, driver.ErrSkip) {
		x.count(query)
	}
	return r, err
}

func (x *countingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	var (
		st  driver.Stmt
		err error
	)
	if pc, ok := x.Conn.(driver.ConnPrepareContext); ok {
		st, err = pc.PrepareContext(ctx, query)
	} else {
		st, err = x.Conn.Prepare(query)
	}
	if err != nil {
		return nil, err
	}
	return &countingStmt{Stmt: st, conn: x, query: query}, nil
}

func (x *countingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	cb, ok := x.Conn.(driver.ConnBeginTx)
	if !ok {
		return nil, errNoContext
	}
	tx, err := cb.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	x.inTx = true
	return &countingTx{Tx: tx, conn: x}, nil
}

func (x *countingConn) CheckNamedValue(nv *driver.NamedValue) error {
	if nvc, ok := x.Conn.(driver.NamedValueChecker); ok {
		return nvc.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

func (x *countingConn) ResetSession(ctx context.Context) error {
	if sr, ok := x.Conn.(driver.SessionResetter); ok {
		return sr.ResetSession(ctx)
	}
	return nil
}

func (x *countingConn) IsValid() bool {
	if v, ok := x.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (x *countingConn) Ping(ctx context.Context) error {
	if p, ok := x.Conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

type countingTx struct {
	driver.Tx
	conn *countingConn
}

func (t *countingTx) Commit() error {
	err := t.Tx.Commit()
	t.conn.inTx = false
	if err == nil {
		t.conn.c.commits.Add(1)
	}
	return err
}

func (t *countingTx) Rollback() error {
	err := t.Tx.Rollback()
	t.conn.inTx = false
	t.conn.c.rollbacks.Add(1)
	return err
}

type countingStmt struct {
	driver.Stmt
	conn  *countingConn
	query string
}

func (s *countingStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.conn.count(s.query)
	if se, ok := s.Stmt.(driver.StmtExecContext); ok {
		return se.ExecContext(ctx, args)
	}
	return nil, errNoContext
}

func (s *countingStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	s.conn.count(s.query)
	if sq, ok := s.Stmt.(driver.StmtQueryContext); ok {
		return sq.QueryContext(ctx, args)
	}
	return nil, errNoContext
}

func (s *countingStmt) CheckNamedValue(nv *driver.NamedValue) error {
	if nvc, ok := s.Stmt.(driver.NamedValueChecker); ok {
		return nvc.CheckNamedValue(nv)
	}
	return s.conn.CheckNamedValue(nv)
}

// errNoContext: the wrapper supports drivers with the context interfaces of Go 1.8+, as
// pgx, go-sql-driver/mysql and modernc.org/sqlite all are.
var errNoContext = errors.New("outbox-bench: the driver lacks the context-aware interfaces")

// commitCount is the commits of one measured window.
type commitCount struct {
	// Server is the number of committed transactions by the server-side measure named in
	// Method.
	Server int64  `json:"server"`
	Method string `json:"method"`
	// Client is what the driver wrapper saw.
	Client counts `json:"client"`
	// Check compares the two, in words.
	Check string `json:"check"`
}
