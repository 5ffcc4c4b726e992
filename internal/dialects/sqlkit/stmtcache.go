package sqlkit

import (
	"context"
	"database/sql"
	"runtime"
	"slices"
	"sync"

	"github.com/outboxgo/outbox/dialect"
)

// StmtCacheSize bounds a StmtCache. A dialect caches only statements with few texts (they
// depend on the table and the scope's shape, or on a batch size rounded to a power of two),
// so a Publisher needs a handful; the bound only matters for a Store claimed from with
// scopes of ever new shapes. Once it is reached, further statements run unprepared.
const StmtCacheSize = 64

// StmtCache keeps the prepared statements of one pool, by query text, so that a hot
// statement is parsed once per connection instead of at every call. database/sql prepares
// a pool-level *sql.Stmt on each connection the first time it runs there and closes it with
// the connection.
//
// Why it exists: modernc.org/sqlite parses a statement at every call unless it is prepared;
// parsing was a sixth of the SQLite claim's CPU and a seventh of its ack's (BENCHMARKS.md).
// pgx caches statements by itself.
//
// It is bound to one pool by New ([PoolBinder]) and lives as long as the Store: database/sql
// keeps a pool's statements until they are closed or the pool is, so a cleanup closes them
// once the cache is unreachable, and a program that makes Stores over and over on one pool
// does not pile them up. No global map holds it, which would keep every *sql.DB alive.
type StmtCache struct {
	db  *sql.DB
	set *stmtSet
}

// stmtSet is the cache's statements, apart from the cache so that its cleanup can reach
// them without keeping the cache alive.
type stmtSet struct {
	mu sync.Mutex
	m  map[string]*sql.Stmt
}

func NewStmtCache(db *sql.DB) *StmtCache {
	c := &StmtCache{db: db, set: &stmtSet{m: make(map[string]*sql.Stmt)}}
	runtime.AddCleanup(c, (*stmtSet).close, c.set)
	return c
}

// close closes every statement; nothing uses them any more (the cache is unreachable).
func (s *stmtSet) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.m {
		_ = st.Close()
	}
	clear(s.m)
}

// Len reports how many statements c keeps prepared.
func (c *StmtCache) Len() int {
	c.set.mu.Lock()
	defer c.set.mu.Unlock()
	return len(c.set.m)
}

// lookup returns the cached statement for query, or nil, and whether there is room to add it.
func (c *StmtCache) lookup(query string) (s *sql.Stmt, room bool) {
	c.set.mu.Lock()
	defer c.set.mu.Unlock()
	return c.set.m[query], len(c.set.m) < StmtCacheSize
}

// prepare returns the statement for query, preparing it on the pool on first use, or nil
// when the cache is full.
func (c *StmtCache) prepare(ctx context.Context, query string) (*sql.Stmt, error) {
	if s, room := c.lookup(query); s != nil || !room {
		return s, nil
	}
	s, err := c.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	c.set.mu.Lock()
	defer c.set.mu.Unlock()
	if prev, ok := c.set.m[query]; ok || len(c.set.m) >= StmtCacheSize {
		// Another call prepared it first, or the cache filled meanwhile: nobody else has s.
		_ = s.Close()
		return prev, nil
	}
	c.set.m[query] = s
	return s, nil
}

// on returns a dialect.DBTX that runs each query on db as c's prepared statement. When db is not
// c's pool, or c is nil, db comes back as it is. Use it only for statements with few texts
// (StmtCacheSize).
func (c *StmtCache) On(db *sql.DB) dialect.DBTX {
	if c == nil || db != c.db {
		return db
	}
	return preparedDBTX{c}
}

type preparedDBTX struct{ c *StmtCache }

func (p preparedDBTX) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	s, err := p.c.prepare(ctx, query)
	if err != nil {
		return nil, err
	}
	if s == nil {
		return p.c.db.ExecContext(ctx, query, args...)
	}
	return s.ExecContext(ctx, args...)
}

func (p preparedDBTX) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	s, err := p.c.prepare(ctx, query)
	if err != nil {
		return nil, err
	}
	if s == nil {
		return p.c.db.QueryContext(ctx, query, args...)
	}
	return s.QueryContext(ctx, args...)
}

// QueryRowContext runs query unprepared when preparing it failed: the error comes back
// from Scan, as it would for the unprepared query.
func (p preparedDBTX) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	s, err := p.c.prepare(ctx, query)
	if s == nil || err != nil {
		return p.c.db.QueryRowContext(ctx, query, args...)
	}
	return s.QueryRowContext(ctx, args...)
}

// InTx returns a dialect.DBTX that runs each query in tx, as c's prepared statement when db is c's
// pool and the statement is prepared already (database/sql reuses its preparation on the
// transaction's connection, or prepares it there), and as it is otherwise.
//
// It never prepares a statement on the pool: that takes a connection of the pool while tx
// holds one, and on a pool of one connection (or one whose other connections are all held
// by callers waiting for the same turn) it would wait forever. A statement it finds
// unprepared runs unprepared and is recorded in missed; prepare them with [StmtCache.warm]
// once the transaction has ended and its connection is back in the pool.
func (c *StmtCache) InTx(db *sql.DB, tx *sql.Tx, missed *[]string) dialect.DBTX {
	if c == nil || db != c.db {
		return tx
	}
	return txPrepared{c, tx, missed}
}

// warm prepares the statements that InTx ran unprepared, on the pool; errors are dropped
// (the statement runs unprepared next time, and is tried again). Call it holding no
// connection of the pool.
func (c *StmtCache) Warm(ctx context.Context, missed []string) {
	if c == nil {
		return
	}
	for _, q := range missed {
		_, _ = c.prepare(ctx, q)
	}
}

type txPrepared struct {
	c      *StmtCache
	tx     *sql.Tx
	missed *[]string
}

// stmt returns query's statement bound to the transaction, or nil to run it unprepared.
func (p txPrepared) stmt(ctx context.Context, query string) *sql.Stmt {
	s, room := p.c.lookup(query)
	if s == nil {
		if room && p.missed != nil && !slices.Contains(*p.missed, query) {
			*p.missed = append(*p.missed, query)
		}
		return nil
	}
	return p.tx.StmtContext(ctx, s)
}

func (p txPrepared) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if s := p.stmt(ctx, query); s != nil {
		return s.ExecContext(ctx, args...)
	}
	return p.tx.ExecContext(ctx, query, args...)
}

func (p txPrepared) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if s := p.stmt(ctx, query); s != nil {
		return s.QueryContext(ctx, args...)
	}
	return p.tx.QueryContext(ctx, query, args...)
}

func (p txPrepared) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if s := p.stmt(ctx, query); s != nil {
		return s.QueryRowContext(ctx, args...)
	}
	return p.tx.QueryRowContext(ctx, query, args...)
}

// IsPrepared reports whether q runs its queries as prepared statements (StmtCache).
func IsPrepared(q dialect.DBTX) bool {
	switch q.(type) {
	case preparedDBTX, txPrepared:
		return true
	}
	return false
}
