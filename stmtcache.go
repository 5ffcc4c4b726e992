package outbox

import (
	"context"
	"database/sql"
	"sync"
)

// stmtCacheSize bounds a stmtCache. A dialect caches only statements whose text depends on
// the table and the scope's shape, not on batch sizes, so a Publisher needs a handful; the
// bound only matters for a dialect value shared by many pools or scopes.
const stmtCacheSize = 64

// stmtCache keeps one dialect value's prepared statements, per pool and query text, so that
// a hot statement is parsed once per connection instead of at every call. database/sql
// prepares a pool-level *sql.Stmt on each connection the first time it runs there and
// closes it with the connection; a transaction reuses the connection's copy
// (Tx.StmtContext).
//
// Why it exists: modernc.org/sqlite parses a statement at every call unless it is
// prepared, and the SQLite claim spent a sixth of its CPU there (BENCHMARKS.md). pgx caches
// statements by itself.
//
// The cache belongs to the dialect value, not to a global, because a *sql.Stmt holds its
// *sql.DB: a global map would keep every pool alive. Its entries live as long as the dialect
// value; once stmtCacheSize entries exist, further statements run unprepared, so a value
// shared by many pools (tests opening databases by the hundred) stays bounded and correct.
// The statements of a closed pool fail like the pool itself, and are never handed out again
// unless that closed pool is used again.
type stmtCache struct {
	mu sync.Mutex
	m  map[stmtKey]*sql.Stmt
}

type stmtKey struct {
	db    *sql.DB
	query string
}

// stmt returns the prepared statement for query on db, preparing it on first use, or nil
// when the cache is full or c is nil (the caller then runs query unprepared).
func (c *stmtCache) stmt(ctx context.Context, db *sql.DB, query string) (*sql.Stmt, error) {
	if c == nil {
		return nil, nil
	}
	key := stmtKey{db, query}
	c.mu.Lock()
	s, ok := c.m[key]
	full := len(c.m) >= stmtCacheSize
	c.mu.Unlock()
	if ok || full {
		return s, nil
	}
	s, err := db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[stmtKey]*sql.Stmt)
	}
	if prev, ok := c.m[key]; ok || len(c.m) >= stmtCacheSize {
		// Another call prepared it first, or the cache filled meanwhile: nobody else has s.
		_ = s.Close()
		return prev, nil
	}
	c.m[key] = s
	return s, nil
}

// on returns a DBTX that runs each query as c's prepared statement of db, on q: q is db
// itself or a transaction of db. Any other q is returned as it is (its queries run
// unprepared), since a statement can only be prepared on a pool the cache knows.
// Use it only for statements whose text does not vary with batch sizes (stmtCacheSize).
func (c *stmtCache) on(db *sql.DB, q DBTX) DBTX {
	switch q := q.(type) {
	case *sql.DB:
		if q == db {
			return preparedDBTX{c, db, nil}
		}
	case *sql.Tx:
		return preparedDBTX{c, db, q}
	}
	return q
}

type preparedDBTX struct {
	c  *stmtCache
	db *sql.DB
	tx *sql.Tx
}

// get returns the statement to run query with, or nil to run it unprepared on q.
func (p preparedDBTX) get(ctx context.Context, query string) (*sql.Stmt, DBTX, error) {
	var q DBTX = p.db
	if p.tx != nil {
		q = p.tx
	}
	s, err := p.c.stmt(ctx, p.db, query)
	if s == nil || err != nil {
		return nil, q, err
	}
	if p.tx != nil {
		s = p.tx.StmtContext(ctx, s) // closed when the transaction ends
	}
	return s, q, nil
}

func (p preparedDBTX) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	s, q, err := p.get(ctx, query)
	if err != nil {
		return nil, err
	}
	if s == nil {
		return q.ExecContext(ctx, query, args...)
	}
	return s.ExecContext(ctx, args...)
}

func (p preparedDBTX) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	s, q, err := p.get(ctx, query)
	if err != nil {
		return nil, err
	}
	if s == nil {
		return q.QueryContext(ctx, query, args...)
	}
	return s.QueryContext(ctx, args...)
}

// QueryRowContext runs query unprepared when preparing it failed: the error comes back
// from Scan, as it would for the unprepared query.
func (p preparedDBTX) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	s, q, err := p.get(ctx, query)
	if s == nil || err != nil {
		return q.QueryRowContext(ctx, query, args...)
	}
	return s.QueryRowContext(ctx, args...)
}
