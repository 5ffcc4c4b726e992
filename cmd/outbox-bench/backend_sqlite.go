package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"modernc.org/sqlite"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

// sqliteDSN is the library's documented DSN (WAL, busy timeout, immediate transactions)
// with synchronous=FULL, so that every commit is durable as on the servers: in WAL mode
// FULL syncs the WAL at each commit, NORMAL only at checkpoints.
func sqliteDSN(path string) string {
	return "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=synchronous(FULL)&_txlock=immediate"
}

// sqliteCommits counts every committed write transaction of every SQLite connection of the
// process, by SQLite's own commit hook.
var (
	sqliteCommits  atomic.Int64
	sqliteHookOnce sync.Once
)

func registerSQLiteCommitHook() {
	sqliteHookOnce.Do(func() {
		sqlite.RegisterConnectionHook(func(conn sqlite.ExecQuerierContext, _ string) error {
			if hr, ok := conn.(sqlite.HookRegisterer); ok {
				hr.RegisterCommitHook(func() int32 { sqliteCommits.Add(1); return 0 })
			}
			return nil
		})
	})
}

type liteBackend struct {
	dir string
	dsn string
	db  *sql.DB
}

func (*liteBackend) name() string            { return "sqlite" }
func (*liteBackend) dialect() outbox.Dialect { return outbox.SQLite() }
func (b *liteBackend) admin() *sql.DB        { return b.db }

// childDSN implements backend.
func (b *liteBackend) childDSN() (string, string) { return "sqlite", b.dsn }

func (b *liteBackend) setup(ctx context.Context) error {
	registerSQLiteCommitHook()
	dir, err := os.MkdirTemp("", "outbox-bench-")
	if err != nil {
		return err
	}
	b.dir = dir
	b.dsn = sqliteDSN(filepath.Join(dir, "bench.db"))
	if b.db, err = sql.Open("sqlite", b.dsn); err != nil {
		return err
	}
	b.db.SetMaxOpenConns(2)
	if err := migrate(ctx, b.db, "sqlite", mainTable); err != nil {
		return err
	}
	_, err = b.db.ExecContext(ctx, `CREATE TABLE `+businessTable+` (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL,
		amount_cents INTEGER NOT NULL, status TEXT NOT NULL, created_at INTEGER NOT NULL)`)
	return err
}

func (b *liteBackend) teardown() {
	if b.db != nil {
		_ = b.db.Close()
	}
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
}

func (b *liteBackend) describe(ctx context.Context) serverInfo {
	info := serverInfo{Settings: map[string]string{}, Connection: "modernc.org/sqlite (pure Go), DSN " + sqliteDSN("<tmp>/bench.db")}
	var v string
	_ = b.db.QueryRowContext(ctx, `SELECT sqlite_version()`).Scan(&v)
	info.Version = "SQLite " + v
	conn, err := b.db.Conn(ctx)
	if err == nil {
		defer conn.Close()
		for _, p := range []string{"journal_mode", "synchronous", "busy_timeout", "page_size", "cache_size"} {
			var val string
			if conn.QueryRowContext(ctx, `PRAGMA `+p).Scan(&val) == nil {
				info.Settings[p] = val
			}
		}
	}
	sync := map[string]string{"0": "OFF", "1": "NORMAL", "2": "FULL", "3": "EXTRA"}[info.Settings["synchronous"]]
	info.Durability = fmt.Sprintf("journal_mode=%s, synchronous=%s: the WAL is fsynced at every commit; file in %s",
		info.Settings["journal_mode"], sync, os.TempDir())
	return info
}

func (b *liteBackend) pool(maxConns int) (*sql.DB, *txCounter, error) {
	return openCountingDB("sqlite", b.dsn, maxConns)
}

func (b *liteBackend) reset(ctx context.Context, table string) error {
	if table == retainedTable {
		_, err := b.db.ExecContext(ctx, `DELETE FROM "`+table+`" WHERE created_at > ?`, time.Now().Add(-time.Hour).UnixMicro())
		return err
	}
	for _, t := range []string{table, businessTable} {
		if _, err := b.db.ExecContext(ctx, `DELETE FROM "`+t+`"`); err != nil {
			return err
		}
	}
	_, err := b.db.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`)
	return err
}

func (b *liteBackend) maintain(ctx context.Context, table string) error {
	if _, err := b.db.ExecContext(ctx, `ANALYZE "`+table+`"`); err != nil {
		return err
	}
	_, err := b.db.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`)
	return err
}

// countStart reads SQLite's commit hook counter: exact for this process, which is the only
// one using the file.
func (b *liteBackend) countStart(context.Context) (func(context.Context, *sql.DB, *txCounter) (commitCount, error), error) {
	before := sqliteCommits.Load()
	return func(_ context.Context, db *sql.DB, c *txCounter) (commitCount, error) {
		cl := c.snapshot()
		n := sqliteCommits.Load() - before
		_ = db.Close()
		return commitCount{
			Server: n, Client: cl,
			Method: "SQLite commit hook (sqlite3_commit_hook) on every connection: committed write transactions",
			Check: fmt.Sprintf("engine %d; client %d autocommit statements + %d commits = %d (reads that commit nothing are not in the engine count)",
				n, cl.Autocommit, cl.Commits, cl.Transactions()),
		}, nil
	}, nil
}

func (b *liteBackend) loadRetained(ctx context.Context, table string, n int) error {
	baseMs := time.Now().Add(-24 * time.Hour).UnixMilli()
	baseUs := baseMs * 1000
	q := `WITH RECURSIVE s(g) AS (SELECT ? UNION ALL SELECT g + 1 FROM s WHERE g < ?)
	INSERT INTO "` + table + `" (id, namespace, topic, partition_key, payload, payload_hash, status, attempts,
		next_attempt_at, lease_token, created_at, updated_at, delivered_at)
	SELECT unhex(printf('%012x7000', ? + g / 100) || '8' || printf('%015x', g)), '` + benchNamespace + `', '` + benchTopic + `',
		'order-' || g, '{"order_id":' || g || ',"status":"paid","note":"' || printf('%.*c', 280 + g % 200, 'x') || '"}',
		randomblob(32), 'delivered', 1, ? + g, randomblob(16), ? + g, ? + g, ? + g
	FROM s`
	const chunk = 200_000
	for lo := 1; lo <= n; lo += chunk {
		hi := min(lo+chunk-1, n)
		if _, err := b.db.ExecContext(ctx, q, lo, hi, baseMs, baseUs, baseUs, baseUs, baseUs); err != nil {
			return err
		}
	}
	return nil
}

// loadPending inserts the rows with the raw loop's insert (SQLite has no SHA-256 to hash
// payloads with in SQL), then schedules them.
func (b *liteBackend) loadPending(ctx context.Context, table string, n int, due time.Time, spread time.Duration) error {
	if err := preloadRows(ctx, b.db, b.raw(table), n, payloads); err != nil {
		return err
	}
	// Due in the order they were inserted, as rows each scheduled a while after its enqueue.
	_, err := b.db.ExecContext(ctx, `UPDATE "`+table+`" SET next_attempt_at = ? + ((rowid - (SELECT min(rowid) FROM "`+table+`")) * ? / ?) / 1000 * 1000`,
		due.UnixMilli()*1000, spread.Microseconds(), n)
	return err
}

func (b *liteBackend) raw(table string) rawOps {
	t := `"` + table + `"`
	eligible := `status IN ('pending', 'processing') AND ((status = 'pending' AND next_attempt_at <= ?) OR (status = 'processing' AND locked_until < ?))` +
		` AND attempts < ? AND namespace = ?`
	return &liteRaw{
		business:  `INSERT INTO ` + businessTable + ` (customer_id, amount_cents, status, created_at) VALUES (?, ?, 'paid', ?)`,
		insertSQL: `INSERT INTO ` + t + liteCols + ` VALUES ` + liteRow,
		head:      `INSERT INTO ` + t + liteCols + ` VALUES `,
		libHead:   `INSERT INTO ` + t + liteLibCols + ` VALUES `,
		// The library's claim without its redundant re-check: one statement holds the write
		// lock from its read to its write.
		claimSQL: `UPDATE ` + t + ` SET status = 'processing', attempts = attempts + 1, locked_by = ?, locked_until = ?, lease_token = ?, updated_at = ?` +
			` WHERE id IN (SELECT id FROM ` + t + ` WHERE ` + eligible + ` ORDER BY created_at, id LIMIT ?)` +
			` RETURNING id, topic, partition_key, headers, payload, attempts`,
		claimFullSQL: `UPDATE ` + t + ` SET status = 'processing', attempts = attempts + 1, locked_by = ?, locked_until = ?, lease_token = ?, updated_at = ?` +
			` WHERE id IN (SELECT id FROM ` + t + ` WHERE ` + eligible + ` ORDER BY created_at, id LIMIT ?)` +
			` RETURNING ` + fullList(""),
		ackHead: `UPDATE ` + t + ` SET status = 'delivered', delivered_at = ?, updated_at = ?, locked_by = NULL, locked_until = NULL WHERE id IN (`,
	}
}

const (
	liteCols = ` (id, namespace, topic, partition_key, payload, payload_hash, status, attempts, next_attempt_at, created_at, updated_at)`
	liteRow  = `(?, ?, ?, ?, ?, ?, 'pending', 0, ?, ?, ?)`
)

// liteRaw is the hand-written SQL on SQLite: a single UPDATE ... WHERE id IN (SELECT ...
// LIMIT n) RETURNING claim, an UPDATE ... WHERE id IN (...) ack, times as Unix
// microseconds from the process clock. Statement texts are rendered once per row count.
type liteRaw struct {
	business, insertSQL, head, libHead, claimSQL, claimFullSQL, ackHead string
	rendered                                                            sync.Map
}

func (r *liteRaw) render(key string, n int, head, group, tail string) string {
	k := key + strconv.Itoa(n)
	if s, ok := r.rendered.Load(k); ok {
		return s.(string)
	}
	var b strings.Builder
	b.WriteString(head)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(group)
	}
	b.WriteString(tail)
	s, _ := r.rendered.LoadOrStore(k, b.String())
	return s.(string)
}

func (r *liteRaw) insertBusiness(ctx context.Context, tx *sql.Tx, i int) error {
	_, err := tx.ExecContext(ctx, r.business, i, 1000+i%5000, time.Now().UnixMicro())
	return err
}

func (r *liteRaw) insertOne(ctx context.Context, tx *sql.Tx, row *rawRow) error {
	now := time.Now().UnixMicro()
	_, err := tx.ExecContext(ctx, r.insertSQL, row.id[:], row.namespace, row.topic, row.pkey, string(row.payload), row.hash, now, now, now)
	return err
}

func (r *liteRaw) insertForms() []insertForm {
	return []insertForm{{"values", false}, {"library-shape", true}}
}

// liteLibRow is the library's row (dialect_sqlite.go): twelve placeholders and ON CONFLICT
// DO NOTHING on the partial dedupe index after the last row.
const (
	liteLibCols = ` (id, namespace, topic, tenant_id, dedupe_key, partition_key, headers, payload, payload_hash, status, attempts, next_attempt_at, created_at, updated_at)`
	liteLibRow  = `(?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', 0, ?, ?, ?)`
)

func (r *liteRaw) insertMany(ctx context.Context, q dialect.DBTX, form string, rows []rawRow) error {
	now := time.Now().UnixMicro()
	if form == "library-shape" {
		args := make([]any, 0, 12*len(rows))
		for i := range rows {
			row := &rows[i]
			args = append(args, row.id[:], row.namespace, row.topic, nil, nil, row.pkey, nil, string(row.payload), row.hash, now, now, now)
		}
		_, err := q.ExecContext(ctx, r.render("libshape", len(rows), r.libHead, liteLibRow,
			` ON CONFLICT (namespace, topic, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING`), args...)
		return err
	}
	args := make([]any, 0, 9*len(rows))
	for i := range rows {
		row := &rows[i]
		args = append(args, row.id[:], row.namespace, row.topic, row.pkey, string(row.payload), row.hash, now, now, now)
	}
	_, err := q.ExecContext(ctx, r.render("values", len(rows), r.head, liteRow, ""), args...)
	return err
}

func (r *liteRaw) claim(ctx context.Context, db *sql.DB, limit int, worker string) (rawClaim, error) {
	c := rawClaim{token: uuid.New(), msgs: make([]rawMsg, 0, limit), ids: make([]any, 0, limit)}
	now := time.Now().UnixMicro()
	rows, err := db.QueryContext(ctx, r.claimSQL, worker, now+30_000_000, c.token[:], now, now, now, maxAttempts, benchNamespace, limit)
	if err != nil {
		return c, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			m  rawMsg
			id []byte
		)
		if err := rows.Scan(&id, &m.topic, &m.pkey, &m.headers, &m.payload, &m.attempts); err != nil {
			return c, err
		}
		c.msgs, c.ids = append(c.msgs, m), append(c.ids, id)
	}
	return c, rows.Err()
}

func (r *liteRaw) claimFull(ctx context.Context, db *sql.DB, limit int, worker string) (rawClaim, error) {
	c := rawClaim{token: uuid.New(), ids: make([]any, 0, limit)}
	now := time.Now().UnixMicro()
	rows, err := db.QueryContext(ctx, r.claimFullSQL, worker, now+30_000_000, c.token[:], now, now, now, maxAttempts, benchNamespace, limit)
	if err != nil {
		return c, err
	}
	defer rows.Close()
	for rows.Next() {
		var id []byte
		if err := scanFull(rows, &id); err != nil {
			return c, err
		}
		c.ids = append(c.ids, id)
	}
	return c, rows.Err()
}

func (r *liteRaw) ack(ctx context.Context, db *sql.DB, ids []any) error {
	now := time.Now().UnixMicro()
	args := make([]any, 0, len(ids)+2)
	args = append(append(args, now, now), ids...)
	_, err := db.ExecContext(ctx, r.render("ack", len(ids), r.ackHead, "?", ")"), args...)
	return err
}

func (r *liteRaw) ackGuarded(ctx context.Context, db *sql.DB, ids []any, token uuid.UUID) (int, error) {
	now := time.Now().UnixMicro()
	args := make([]any, 0, len(ids)+3)
	args = append(append(append(args, now, now), ids...), token[:])
	rows, err := db.QueryContext(ctx, r.render("ack", len(ids), r.ackHead, "?", ")")+" AND lease_token = ? AND status = 'processing' RETURNING id", args...)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var id []byte
		if err := rows.Scan(&id); err != nil {
			return n, err
		}
		n++
	}
	return n, rows.Err()
}

func (r *liteRaw) idArg(id uuid.UUID) any { return id[:] }

func (r *liteRaw) leaseOf(id any, token uuid.UUID) outbox.Lease {
	return outbox.Lease{ID: uuid.UUID(id.([]byte)), Token: token}
}

func (b *liteBackend) dropIndex(ctx context.Context, table, index string) error {
	return dropPartialIndexes(ctx, b.db, table, index)
}

// createLean creates the lean table: nine columns and the claim index. available_at is both
// when a pending row may be sent and when a processing row's lease ends.
func (b *liteBackend) createLean(ctx context.Context, table string) (relay, error) {
	t := `"` + table + `"`
	for _, q := range []string{
		`CREATE TABLE ` + t + ` (
			id           BLOB    NOT NULL PRIMARY KEY,
			topic        TEXT    NOT NULL,
			payload      TEXT    NOT NULL,
			status       TEXT    NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'processing', 'delivered', 'dead')),
			attempts     INTEGER NOT NULL DEFAULT 0,
			available_at INTEGER NOT NULL,
			lease_token  BLOB,
			created_at   INTEGER NOT NULL,
			delivered_at INTEGER)`,
		`CREATE INDEX "` + table + `_claim_idx" ON ` + t + ` (created_at, id) WHERE status IN ('pending', 'processing')`,
	} {
		if _, err := b.db.ExecContext(ctx, q); err != nil {
			return nil, err
		}
	}
	return &liteLean{
		insertSQL: `INSERT INTO ` + t + liteLeanCols + ` VALUES ` + liteLeanRow,
		head:      `INSERT INTO ` + t + liteLeanCols + ` VALUES `,
		claimSQL: `UPDATE ` + t + ` SET status = 'processing', attempts = attempts + 1, available_at = ?, lease_token = ?` +
			` WHERE id IN (SELECT id FROM ` + t + ` WHERE status IN ('pending', 'processing') AND available_at <= ? AND attempts < ?` +
			` ORDER BY created_at, id LIMIT ?) RETURNING id, topic, payload, attempts`,
		ackHead: `UPDATE ` + t + ` SET status = 'delivered', delivered_at = ? WHERE id IN (`,
	}, nil
}

const (
	liteLeanCols = ` (id, topic, payload, status, attempts, available_at, created_at)`
	liteLeanRow  = `(?, ?, ?, 'pending', 0, ?, ?)`
)

// liteLean is the hand-written SQL of the lean table: the raw loop's statements without the
// columns the table lacks.
type liteLean struct {
	insertSQL, head, claimSQL, ackHead string
	r                                  liteRaw // its statement cache
}

func (l *liteLean) insertOne(ctx context.Context, tx *sql.Tx, row *rawRow) error {
	now := time.Now().UnixMicro()
	_, err := tx.ExecContext(ctx, l.insertSQL, row.id[:], row.topic, string(row.payload), now, now)
	return err
}

func (l *liteLean) insertForms() []insertForm { return []insertForm{{"values", false}} }

func (l *liteLean) insertMany(ctx context.Context, q dialect.DBTX, _ string, rows []rawRow) error {
	now := time.Now().UnixMicro()
	args := make([]any, 0, 5*len(rows))
	for i := range rows {
		args = append(args, rows[i].id[:], rows[i].topic, string(rows[i].payload), now, now)
	}
	_, err := q.ExecContext(ctx, l.r.render("values", len(rows), l.head, liteLeanRow, ""), args...)
	return err
}

func (l *liteLean) claim(ctx context.Context, db *sql.DB, limit int, _ string) (rawClaim, error) {
	c := rawClaim{token: uuid.New(), msgs: make([]rawMsg, 0, limit), ids: make([]any, 0, limit)}
	now := time.Now().UnixMicro()
	rows, err := db.QueryContext(ctx, l.claimSQL, now+30_000_000, c.token[:], now, maxAttempts, limit)
	if err != nil {
		return c, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			m  rawMsg
			id []byte
		)
		if err := rows.Scan(&id, &m.topic, &m.payload, &m.attempts); err != nil {
			return c, err
		}
		c.msgs, c.ids = append(c.msgs, m), append(c.ids, id)
	}
	return c, rows.Err()
}

func (l *liteLean) ack(ctx context.Context, db *sql.DB, ids []any) error {
	args := make([]any, 0, len(ids)+1)
	args = append(append(args, time.Now().UnixMicro()), ids...)
	_, err := db.ExecContext(ctx, l.r.render("ack", len(ids), l.ackHead, "?", ")"), args...)
	return err
}

// statementWork implements workMeter: it loads n pending rows into table, then runs
// repeats claims of batch rows, the ack of each, and repeats inserts of batch rows through
// r, each its own transaction, on one connection that never checkpoints, and counts the
// pages each commit appended to the WAL (from the WAL file's growth) and its time.
func (b *liteBackend) statementWork(ctx context.Context, table string, r relay, n, batch, repeats int) (*tableWork, error) {
	if err := b.reset(ctx, table); err != nil {
		return nil, err
	}
	if err := preloadRows(ctx, b.db, r, n, payloads200); err != nil {
		return nil, err
	}
	if err := b.maintain(ctx, table); err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite", b.dsn+"&_pragma=wal_autocheckpoint(0)")
	if err != nil {
		return nil, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	var pageSize int64
	if err := db.QueryRowContext(ctx, `PRAGMA page_size`).Scan(&pageSize); err != nil {
		return nil, err
	}
	walFile := filepath.Join(b.dir, "bench.db-wal")
	walSize := func() (int64, error) {
		st, err := os.Stat(walFile)
		if errors.Is(err, os.ErrNotExist) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		return st.Size(), nil
	}
	measure := func(into *stmtWork, rows int, run func() error) error {
		before, err := walSize()
		if err != nil {
			return err
		}
		start := time.Now()
		if err := run(); err != nil {
			return err
		}
		into.ExecMs += float64(time.Since(start).Microseconds()) / 1e3
		after, err := walSize()
		if err != nil {
			return err
		}
		frames := float64(after-before) / float64(pageSize+24) // a frame is a 24-byte header and a page
		into.Statements++
		into.Rows += rows
		into.WALRecords += frames
		into.WALBytes += float64(after - before)
		return nil
	}
	w := &tableWork{}
	for range repeats {
		var c rawClaim
		if err := measure(&w.Claim, batch, func() (err error) { c, err = r.claim(ctx, db, batch, "work"); return err }); err != nil {
			return nil, fmt.Errorf("claim: %w", err)
		}
		if len(c.ids) != batch {
			return nil, fmt.Errorf("claim leased %d rows, want %d", len(c.ids), batch)
		}
		if err := measure(&w.Ack, batch, func() error { return r.ack(ctx, db, c.ids) }); err != nil {
			return nil, fmt.Errorf("ack: %w", err)
		}
	}
	for i := range repeats {
		rows := rawRowsOf(n+i*batch, batch, payloads200)
		if err := measure(&w.Insert, batch, func() error { return r.insertMany(ctx, db, "values", rows) }); err != nil {
			return nil, fmt.Errorf("insert: %w", err)
		}
	}
	return w, nil
}
