// Package sqlite is the built-in dialect for SQLite, behind outbox.SQLite: its SQL, its
// optional abilities (package dialect), its statement cache and its write gate. It imports
// package dialect and the shared SQL helpers of package sqlkit, never the engine (package
// outbox), exactly as a dialect written outside the module does.
package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"math/bits"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// New returns the dialect for SQLite. outbox.SQLite is the same and documents it for users.
func New() Dialect { return Dialect{} }

// The abilities the dialect has, checked at compile time.
var (
	_ dialect.Dialect        = Dialect{}
	_ dialect.Checker        = Dialect{}
	_ dialect.Admin          = Dialect{}
	_ dialect.Notifier       = Dialect{}
	_ dialect.OrderedClaimer = Dialect{}
	_ dialect.SettleClaimer  = Dialect{}
	_ sqlkit.PoolBinder      = Dialect{}
	_ sqlkit.PollingListener = Dialect{}
)

// Dialect, once New has bound it to a Store's pool, keeps its hot statements prepared
// there (sqlkit.StmtCache): the claim and its probe, and the uniform ack; and it remembers which
// scopes have a backlog (sqliteBacklog).
//
// SQLite has one writer at a time, so there is no SKIP LOCKED. Every write of the library
// (claim, ack and nack, renewal, sweep) is one UPDATE ... RETURNING statement run in
// autocommit, and an autocommit write is its own transaction that takes the write lock at
// its first step, before it reads a row: what BEGIN IMMEDIATE gives, waiting for
// the lock under busy_timeout as BEGIN IMMEDIATE does, and never failing half way the way a
// deferred transaction that reads first and then writes can. The claim is UPDATE ... WHERE
// id IN (SELECT ... ORDER BY <due time>, id LIMIT n) through the due index (sqliteDueAt;
// an ordered claim walks the claim index in (created_at, id) order instead), and the
// UPDATE re-checks eligibility (the optimistic guard), so two claimers can never take the
// same row.
//
// Clock: the statements read it themselves (sqliteNow, SQLite's julianday('now')), so it is
// read once the write lock is held, and a wait for the lock can never shorten a lease,
// backdate a schedule or let a row be judged by a time from before the previous writer
// committed. It is the host's clock read in the process, at SQLite's resolution of a
// millisecond. Times are stored as Unix microseconds and are whole
// milliseconds (Insert cuts Go's clock down the same way), except that a transition stamps a
// row at least a microsecond past its last updated_at (sqliteStamp), so that updated_at
// always moves forward (a host clock stepped back makes a claim's lease longer by the step,
// as it makes every running lease look longer). One statement replaces BEGIN, a lock
// statement, the UPDATE and COMMIT on a connection taken from the pool: three statements
// fewer for modernc.org/sqlite to watch for cancellation, each with a goroutine, and no
// transaction for database/sql to watch (measured in BENCHMARKS.md).
//
// The claim, its probe and the uniform ack are prepared once per connection (sqlkit.StmtCache) by
// the copy of the dialect that New binds to the Store's pool (Store.Dialect). SQLite()
// itself prepares nothing, so a dialect that wraps it runs every statement unprepared; wrap
// a Store's Dialect() to keep them prepared. The library's own writes on one *sql.DB (a
// Publisher's claim loops, settles and renewals) take turns in the process before they ask
// for the write lock, so they never starve each other in SQLite's busy handler; use one
// pool per SQLite file per process.
type Dialect struct {
	stmts   *sqlkit.StmtCache
	backlog *sqliteBacklog
}

// BindPool implements [sqlkit.PoolBinder]: the copy it returns keeps the prepared
// statements and the backlog of db.
func (Dialect) BindPool(db *sql.DB) dialect.Dialect {
	return Dialect{stmts: sqlkit.NewStmtCache(db), backlog: &sqliteBacklog{db: db, m: map[string]*atomic.Bool{}}}
}

func (Dialect) Name() string { return "sqlite" }

// sqliteRowsPerInsert keeps a multi-row insert under SQLite's default limit of 32766
// bound parameters (12 per row).
const sqliteRowsPerInsert = 500

func (d Dialect) Insert(ctx context.Context, q dialect.DBTX, t dialect.Table, rows []dialect.Row) ([]bool, error) {
	if err := sqlkit.CheckInsertLeases(rows); err != nil {
		return nil, err // SQLite has no log to read: its rows are always polled
	}
	inserted := make([]bool, 0, len(rows))
	// Go's clock down to its millisecond: the resolution of SQLite's, which the claim
	// compares next_attempt_at with (sqliteNow truncates the same way), so that a row
	// without delay is due at once, not up to a millisecond after it was enqueued. Rows
	// enqueued within one millisecond keep their order by id (UUIDv7: time-ordered).
	now := time.Now().UnixMicro()
	now -= now % 1000
	for len(rows) > 0 {
		chunk := rows[:min(len(rows), sqliteRowsPerInsert)]
		rows = rows[len(chunk):]
		ok, err := d.insert(ctx, q, t, chunk, now)
		if err != nil {
			return nil, err
		}
		inserted = append(inserted, ok...)
	}
	return inserted, nil
}

// sqliteInsertHeads and sqliteInsertGroups are, per insert shape (sqlkit.InsertShape), the INSERT
// from the column list to VALUES and one row of placeholders. Times are bound, as Unix
// microseconds of whole milliseconds (Insert). Only a shape with dedupe keys needs the
// ON CONFLICT clause; without keys no row can meet the partial dedupe index.
var sqliteInsertHeads, sqliteInsertGroups = func() (heads, groups [sqlkit.ShapeCount]string) {
	for s := range sqlkit.InsertShape(sqlkit.ShapeCount) {
		heads[s] = ` ` + s.ColumnList() + ` VALUES `
		groups[s] = s.RowGroup(`?`, `?`)
	}
	return heads, groups
}()

func (Dialect) insert(ctx context.Context, q dialect.DBTX, t dialect.Table, rows []dialect.Row, now int64) ([]bool, error) {
	shape := sqlkit.ShapeOf(rows)
	vals := make([]any, 0, len(rows)*(sqlkit.InsertColumnCount+3))
	for i := range rows {
		r := &rows[i]
		headers, err := r.Headers.Value()
		if err != nil {
			return nil, err
		}
		vals = shape.RowValues(vals, r, headers, sqlkit.UUIDBytes, string(r.Payload))
		vals = append(vals, now+sqlkit.Micros(r.Delay), now, now)
	}
	conflict := ""
	if shape&sqlkit.WithDedupe != 0 {
		conflict = ` ON CONFLICT (namespace, topic, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING`
	}
	query := sqlkit.ValuesStatement(`INSERT INTO `+sqlkit.QuoteIdent(t.Name(), '"')+sqliteInsertHeads[shape], len(rows), sqliteInsertGroups[shape], conflict)
	return sqlkit.InsertOutcome(ctx, q, query, vals, rows, shape&sqlkit.WithDedupe != 0, " RETURNING id")
}

// sqliteNow is the clock of the library's SQLite statements, in Unix microseconds:
// SQLite's julianday('now'), which has a millisecond's resolution, is the same at every use
// within one statement, and is read by a write once it holds the write lock (SQLite). The
// julian day is a double whose rounding error is below 0.05 ms at today's dates, so it is
// rounded to whole milliseconds first.
const sqliteNow = `(CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)`

// sqliteEligible renders the claim predicate: (pending and due) or (processing and
// expired), below the attempt limit, in scope, at sqliteNow. The leading status IN (...)
// term lets SQLite use the partial claim index, whose WHERE clause it must imply.
func sqliteEligible(a *dialect.Args, p dialect.ClaimParams) string {
	return `status IN ('pending', 'processing') AND ((status = 'pending' AND next_attempt_at <= ` + sqliteNow +
		`) OR (status = 'processing' AND locked_until < ` + sqliteNow + `)) AND attempts < ` + a.Add(p.MaxAttempts) +
		sqlkit.ScopeSQL(a, p.Scope, "", sqlkit.UUIDBytes)
}

// sqliteDueAt is when a live row can next be claimed: a pending row when it falls due, a
// row in flight when its lease runs out; NULL for the others. The due index is on
// (sqliteDueAt, id), partial on sqliteDueAt IS NOT NULL; an unordered claim repeats the
// expression exactly, so that one range of the index, read in order, returns the rows that
// became claimable first and stops at the first that is not claimable yet: rows delayed
// for later or waiting for a retry are never read, however many there are.
const sqliteDueAt = `(CASE status WHEN 'pending' THEN next_attempt_at WHEN 'processing' THEN locked_until END)`

// sqliteDue renders the unordered claim's predicate over the due index: claimable now,
// below the attempt limit, in scope; the claim's guard is sqliteEligible, as for every claim.
func sqliteDue(a *dialect.Args, p dialect.ClaimParams) string {
	return sqliteDueAt + ` <= ` + sqliteNow + ` AND attempts < ` + a.Add(p.MaxAttempts) + sqlkit.ScopeSQL(a, p.Scope, "", sqlkit.UUIDBytes)
}

func (d Dialect) claimRows(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) (recs []dialect.Record, err error) {
	if p.Ordered && p.Namespace != "" {
		return d.claimOrdered(ctx, db, t, p)
	}
	// Probe first, without the write lock (in WAL mode readers never wait): idle publishers
	// polling an empty outbox must not queue for the one write lock that producers need.
	// While the previous claim of the same scope came back full there is a backlog, and the
	// probe would only cost time (sqliteBacklog). Both reads name their index: with
	// statistics gathered while most rows were pending, SQLite's planner chose a rowid scan
	// that passed every delivered row before the first pending one, which made a long drain
	// quadratic (BENCHMARKS.md, gap 2). Both statements are prepared once per connection
	// (sqlkit.StmtCache): their text depends only on the table and the scope's shape.
	a := &dialect.Args{}
	probe := `SELECT 1 FROM ` + sqlkit.QuoteIdent(t.Name(), '"') + ` INDEXED BY ` + sqlkit.QuoteIdent(t.Index("claim"), '"') +
		` WHERE ` + sqliteEligible(a, p) + sqliteOrdered(t, p) + ` LIMIT 1`
	if !p.Ordered {
		a = &dialect.Args{}
		probe = `SELECT 1 FROM ` + sqlkit.QuoteIdent(t.Name(), '"') + ` INDEXED BY ` + sqlkit.QuoteIdent(t.Index("due"), '"') +
			` WHERE ` + sqliteDue(a, p) + ` LIMIT 1`
	}
	backlog := d.backlog.of(db, probe, a.Values)
	if backlog == nil || !backlog.Load() {
		var one int
		switch err := d.stmts.On(db).QueryRowContext(ctx, probe, a.Values...).Scan(&one); {
		case err == sql.ErrNoRows:
			return nil, nil
		case err != nil:
			return nil, err
		}
	}
	if p.Ordered && p.Runs {
		recs, _, err = d.completeAndClaimRows(ctx, db, t, nil, p) // heads and runs in one transaction
	} else {
		err = d.write(ctx, db, func(_, prep dialect.DBTX) error {
			recs, err = sqliteClaim(ctx, prep, t, p)
			return err
		})
	}
	if backlog != nil {
		backlog.Store(err == nil && p.Limit > 0 && len(recs) == p.Limit)
	}
	return recs, err
}

// sqliteBacklog remembers, per table and scope, whether the last claim of a Store came back
// full, so that the next claim skips its probe. The probe keeps idle publishers away from
// the write lock; during a backlog it only adds a statement to every claim (4–13 % of an
// in-process SQLite drain, measured in BENCHMARKS.md). The first claim
// that comes back short, or fails, turns probing back on; a claim that skipped the probe and
// finds nothing has taken the write lock once for nothing, which is what every claim did
// before there was a probe. It is bound to a Store's pool with the statement cache
// (BindPool), serves claims on that pool only, and holds at most sqlkit.StmtCacheSize scopes;
// claims of further scopes, or on another pool, always probe.
type sqliteBacklog struct {
	db *sql.DB
	mu sync.Mutex
	m  map[string]*atomic.Bool
}

// of returns the flag of the scope that probe and its arguments select on db, or nil.
func (b *sqliteBacklog) of(db *sql.DB, probe string, vals []any) *atomic.Bool {
	if b == nil || db != b.db {
		return nil
	}
	key := probe + fmt.Sprintf("\x00%#v", vals) // Go syntax: no two argument lists print alike
	b.mu.Lock()
	defer b.mu.Unlock()
	f := b.m[key]
	if f == nil && len(b.m) < sqlkit.StmtCacheSize {
		f = new(atomic.Bool)
		b.m[key] = f
	}
	return f
}

// sqliteClaim leases rows in one statement (SQLite). locked_until is the claim's time plus
// the lease, and the claim's time is the row's updated_at, sqliteStamp, so that stampClaimed
// can give UpdatedAt as LockedUntil - Lease.
func sqliteClaim(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ClaimParams) ([]dialect.Record, error) {
	tbl := sqlkit.QuoteIdent(t.Name(), '"')
	if !p.Ordered {
		return sqliteLease(ctx, q, t, p, func(a *dialect.Args) string {
			return `SELECT id FROM ` + tbl + ` INDEXED BY ` + sqlkit.QuoteIdent(t.Index("due"), '"') + ` WHERE ` + sqliteDue(a, p) +
				` ORDER BY ` + sqliteDueAt + `, id LIMIT ` + a.Add(p.Limit)
		})
	}
	return sqliteLease(ctx, q, t, p, func(a *dialect.Args) string {
		return `SELECT id FROM ` + tbl + ` INDEXED BY ` + sqlkit.QuoteIdent(t.Index("claim"), '"') + ` WHERE ` + sqliteEligible(a, p) +
			sqliteOrdered(t, p) + ` ORDER BY created_at, id LIMIT ` + a.Add(p.Limit)
	})
}

// sqliteLease leases the rows that the query rendered by candidates selects (with the
// eligibility guard), in one UPDATE ... RETURNING.
func sqliteLease(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ClaimParams, candidates func(a *dialect.Args) string) ([]dialect.Record, error) {
	tbl := sqlkit.QuoteIdent(t.Name(), '"')
	a := &dialect.Args{}
	var b strings.Builder
	b.WriteString(`UPDATE ` + tbl + ` SET status = 'processing', attempts = attempts + 1, locked_by = ` + a.Add(p.WorkerID) +
		`, locked_until = ` + sqliteStamp + ` + ` + a.Add(sqlkit.Micros(p.Lease)) + `, lease_token = ` + a.Add(sqlkit.UUIDBytes(p.Token)) +
		`, updated_at = ` + sqliteStamp)
	b.WriteString(` WHERE id IN (` + candidates(a) + `)`)
	b.WriteString(` AND ` + sqliteEligible(a, p)) // the guard: eligibility holds at write time
	b.WriteString(` RETURNING ` + sqlkit.SelectList(sqlkit.ClaimColumns, "", nil))
	return sqlkit.QueryClaimed(ctx, q, p, b.String(), a.Values...)
}

func (d Dialect) Complete(ctx context.Context, q dialect.DBTX, t dialect.Table, outcomes []dialect.Outcome) (lost []uuid.UUID, err error) {
	if len(outcomes) == 0 {
		return nil, nil
	}
	err = d.write(ctx, q, func(q, prep dialect.DBTX) error {
		lost, err = sqliteComplete(ctx, q, prep, t, outcomes)
		return err
	})
	return lost, err
}

// sqliteStamp is the time of a transition as the row's new updated_at: sqliteNow, or a
// microsecond past the row's updated_at when that is not earlier. SQLite's clock has a
// millisecond's resolution, so two transitions of a row within one millisecond would
// otherwise leave updated_at where it was.
const sqliteStamp = `max(` + sqliteNow + `, updated_at + 1)`

// sqliteAckListLen is how many ids the uniform ack's IN list binds for n rows when it runs
// prepared: n rounded up to a power of two, the last id repeated (an IN list is a set: a
// repeated id matches its row once), so that the statement has at most 11 texts up to
// MaxBatch (1 to 1 024 ids) and can stay prepared (sqlkit.StmtCache; parsing was a seventh of the
// ack's CPU). Beyond MaxBatch, reachable only by calling the dialect directly, and where
// the ack cannot be prepared, the list is n long.
func sqliteAckListLen(n int, prepared bool) int {
	if !prepared {
		return n
	}
	return 1 << bits.Len(uint(n-1))
}

// sqliteComplete settles outcomes on q; prep is q with prepared statements (sqlkit.StmtCache).
func sqliteComplete(ctx context.Context, q, prep dialect.DBTX, t dialect.Table, outcomes []dialect.Outcome) ([]uuid.UUID, error) {
	a := &dialect.Args{}
	if token, ok := sqlkit.UniformAck(outcomes); ok {
		prepared := sqlkit.IsPrepared(prep) && len(outcomes) <= sqlkit.MaxBatch
		n := sqliteAckListLen(len(outcomes), prepared)
		query := `UPDATE ` + sqlkit.QuoteIdent(t.Name(), '"') + ` SET status = 'delivered', delivered_at = ` + sqliteStamp +
			`, locked_by = NULL, locked_until = NULL, updated_at = ` + sqliteStamp +
			` WHERE id IN ` + a.List(n, func(i int) any { return sqlkit.UUIDBytes(outcomes[min(i, len(outcomes)-1)].ID) }) +
			` AND lease_token = ` + a.Add(sqlkit.UUIDBytes(token)) + ` AND status = 'processing' RETURNING id`
		pq := q
		if prepared {
			pq = prep
		}
		ids, err := dialect.QueryIDs(ctx, pq, query, a.Values...)
		if err != nil {
			return nil, err
		}
		return dialect.Lost(dialect.Leases(outcomes), ids), nil
	}
	var b strings.Builder
	b.WriteString(`WITH u(o_id, o_token, o_status, o_delay, o_error, o_refund) AS (VALUES `)
	for i, o := range outcomes {
		if i > 0 {
			b.WriteString(", ")
		}
		refund := 0
		if o.RefundAttempt {
			refund = 1
		}
		b.WriteString("(" + a.Add(sqlkit.UUIDBytes(o.ID)) + ", " + a.Add(sqlkit.UUIDBytes(o.Token)) + ", " + a.Add(string(o.Status)) +
			", " + a.Add(sqlkit.Micros(o.Delay)) + ", " + a.Add(o.Error) + ", " + a.Add(refund) + ")")
	}
	b.WriteString(`) UPDATE ` + sqlkit.QuoteIdent(t.Name(), '"') + ` SET status = u.o_status,` +
		` next_attempt_at = CASE WHEN u.o_status = 'pending' THEN ` + sqliteNow + ` + u.o_delay ELSE next_attempt_at END,` +
		` last_error = CASE WHEN u.o_status = 'delivered' THEN last_error ELSE u.o_error END,` +
		` delivered_at = CASE WHEN u.o_status = 'delivered' THEN ` + sqliteStamp + ` ELSE delivered_at END,` +
		` attempts = max(attempts - u.o_refund, 0),` + // RefundAttempt: an outage gives the claim's attempt back
		` locked_by = NULL, locked_until = NULL, updated_at = ` + sqliteStamp +
		` FROM u WHERE id = u.o_id AND lease_token = u.o_token AND status = 'processing' RETURNING id`)
	ids, err := dialect.QueryIDs(ctx, q, b.String(), a.Values...)
	if err != nil {
		return nil, err
	}
	return dialect.Lost(dialect.Leases(outcomes), ids), nil
}

func (d Dialect) Extend(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ExtendParams) (lost []uuid.UUID, err error) {
	if len(p.Leases) == 0 {
		return nil, nil
	}
	err = d.write(ctx, q, func(q, _ dialect.DBTX) error {
		lost, err = sqliteExtend(ctx, q, t, p)
		return err
	})
	return lost, err
}

func sqliteExtend(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ExtendParams) ([]uuid.UUID, error) {
	a := &dialect.Args{}
	var b strings.Builder
	b.WriteString(`WITH u(o_id, o_token) AS (VALUES `)
	for i, l := range p.Leases {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(" + a.Add(sqlkit.UUIDBytes(l.ID)) + ", " + a.Add(sqlkit.UUIDBytes(l.Token)) + ")")
	}
	b.WriteString(`) UPDATE ` + sqlkit.QuoteIdent(t.Name(), '"') + ` SET locked_until = ` + sqliteNow + ` + ` + a.Add(sqlkit.Micros(p.Lease)) +
		`, updated_at = ` + sqliteStamp +
		` FROM u WHERE id = u.o_id AND lease_token = u.o_token AND status = 'processing' RETURNING id`)
	ids, err := dialect.QueryIDs(ctx, q, b.String(), a.Values...)
	if err != nil {
		return nil, err
	}
	return dialect.Lost(p.Leases, ids), nil
}

func (d Dialect) Bury(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.BuryParams) (ids []uuid.UUID, err error) {
	err = d.write(ctx, q, func(q, _ dialect.DBTX) error {
		ids, err = sqliteBury(ctx, q, t, p)
		return err
	})
	return ids, err
}

func sqliteBury(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.BuryParams) ([]uuid.UUID, error) {
	tbl := sqlkit.QuoteIdent(t.Name(), '"')
	a := &dialect.Args{}
	query := `UPDATE ` + tbl + ` SET status = 'dead', last_error = ` + a.Add(p.Reason) +
		`, locked_by = NULL, locked_until = NULL, lease_token = ` + a.Add(sqlkit.UUIDBytes(p.Token)) + `, updated_at = ` + sqliteStamp +
		` WHERE id IN (SELECT id FROM ` + tbl + ` WHERE ` + sqlkit.BuryCandidates(a, p, func() string { return sqliteNow }, sqlkit.UUIDBytes, "") +
		` ORDER BY created_at, id LIMIT ` + a.Add(p.Limit) + `) RETURNING id`
	return dialect.QueryIDs(ctx, q, query, a.Values...)
}

func (Dialect) Get(ctx context.Context, q dialect.DBTX, t dialect.Table, id uuid.UUID) (dialect.Record, error) {
	return sqlkit.GetRecord(q.QueryRowContext(ctx, `SELECT `+sqlkit.SelectList(sqlkit.RecordColumns, "", nil)+` FROM `+sqlkit.QuoteIdent(t.Name(), '"')+` WHERE id = ?`, sqlkit.UUIDBytes(id)))
}

// sqliteTurn waits for the pool's turn to write (sqliteGates) and returns its release.
func sqliteTurn(ctx context.Context, db *sql.DB) (release func(), err error) {
	gate := sqliteGateOf(db)
	select {
	case gate <- struct{}{}:
		return func() { <-gate }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// write runs fn, one of the library's writes: one autocommit statement that reads the
// clock itself (SQLite). On a *sql.DB it waits for the pool's turn first (sqliteGates), and
// fn gets prep, q with prepared statements (sqlkit.StmtCache, when the dialect is bound to this
// pool), for the statements with few texts. On a transaction or connection that the caller
// owns, fn runs as it is and the caller's transaction decides the locking.
//
// Cancellation: ctx ends the wait for the turn and, through the driver, the statement and
// its wait for the write lock. A claim that commits while ctx ends can be reported as
// cancelled; its rows then stay leased until the lease expires, as after a crash, which is
// why the Publisher claims on a context that ends only at its shutdown deadline.
func (d Dialect) write(ctx context.Context, q dialect.DBTX, fn func(q, prep dialect.DBTX) error) error {
	db, ok := q.(*sql.DB)
	if !ok {
		return fn(q, q)
	}
	release, err := sqliteTurn(ctx, db)
	if err != nil {
		return err
	}
	defer release()
	return fn(db, d.stmts.On(db))
}

// sqliteGates holds one gate per *sql.DB: the library's own writes on one pool
// (a Publisher's claim loops, its settles and renewals) queue for their turn in Go, first
// come first served, before they ask SQLite for its write lock.
//
// SQLite does not queue writers: a connection that finds the write lock taken sleeps in its
// busy handler and retries (1, 2, 5, 10, 15, 20, 25 ms and on), and another writer may take
// the lock between its retries. With eight claim loops on one pool a claim waited past a
// 10 s busy_timeout and failed with SQLITE_BUSY (conformance Concurrency/NoDoubleClaim under
// -race, on a loaded machine). Behind the gate, at most one of the pool's library writes
// waits on SQLite at a time, so it only meets writers from outside the library (business
// transactions, other processes), as before. Throughput is unchanged (BENCHMARKS.md, gap 1).
//
// The map holds its pools weakly: a *sql.DB that is closed and dropped takes its gate along.
var sqliteGates sync.Map // weak.Pointer[sql.DB] → chan struct{}

func sqliteGateOf(db *sql.DB) chan struct{} {
	key := weak.Make(db)
	if g, ok := sqliteGates.Load(key); ok {
		return g.(chan struct{})
	}
	g, loaded := sqliteGates.LoadOrStore(key, make(chan struct{}, 1))
	if !loaded {
		runtime.AddCleanup(db, func(k weak.Pointer[sql.DB]) { sqliteGates.Delete(k) }, key)
	}
	return g.(chan struct{})
}

// completeAndClaimRows is CompleteAndClaim before the sort: Complete's statement and the claim run in one
// transaction, in one turn of the pool's writes (sqliteTurn), so they take the write lock
// and commit once. The transaction's first statement writes, so it takes the write lock
// before it reads, as an autocommit write does. The claim sees the settled rows as they now
// are; a retry without delay can be claimed again at once, as by any claim.
//
// Statements that are not prepared yet run unprepared in the transaction, and are prepared
// on the pool after it, once its connection is back: preparing them inside would wait for a
// second connection while holding one, forever on a pool of one.
func (d Dialect) completeAndClaimRows(ctx context.Context, db *sql.DB, t dialect.Table, outcomes []dialect.Outcome, p dialect.ClaimParams) (recs []dialect.Record, lost []uuid.UUID, err error) {
	var missed []string
	lost, recs, err = d.completeAndClaim(ctx, db, t, outcomes, p, &missed)
	d.stmts.Warm(ctx, missed)
	return recs, lost, err
}

func (d Dialect) completeAndClaim(ctx context.Context, db *sql.DB, t dialect.Table, outcomes []dialect.Outcome, p dialect.ClaimParams, missed *[]string) (lost []uuid.UUID, recs []dialect.Record, err error) {
	release, err := sqliteTurn(ctx, db)
	if err != nil {
		return nil, nil, err
	}
	defer release()
	err = sqlkit.InTx(ctx, db, nil, func(tx *sql.Tx) error {
		prep := d.stmts.InTx(db, tx, missed)
		if len(outcomes) > 0 {
			if lost, err = sqliteComplete(ctx, tx, prep, t, outcomes); err != nil {
				return err
			}
		}
		if p.Ordered && p.Namespace != "" {
			recs, err = sqliteLeaseOrdered(ctx, prep, t, p, true)
		} else {
			recs, err = sqliteClaim(ctx, prep, t, p)
			recs, err = sqliteWithRuns(ctx, prep, t, p, recs, err)
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return lost, recs, nil
}

// Claim implements [dialect.Dialect]. RETURNING has no order of its own, and an ordered
// claim merges two reads, so the records are put in claim order here, once.
func (d Dialect) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]dialect.Record, error) {
	recs, err := d.claimRows(ctx, db, t, p)
	dialect.SortClaimed(recs)
	return recs, err
}

// CompleteAndClaim implements [dialect.SettleClaimer], with the claimed records in claim
// order (Claim).
func (d Dialect) CompleteAndClaim(ctx context.Context, db *sql.DB, t dialect.Table, outcomes []dialect.Outcome, p dialect.ClaimParams) ([]dialect.Record, []uuid.UUID, error) {
	recs, lost, err := d.completeAndClaimRows(ctx, db, t, outcomes, p)
	dialect.SortClaimed(recs)
	return recs, lost, err
}
