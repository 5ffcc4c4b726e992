package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

// maxAttempts is the attempt limit of library and raw claims (the library's default).
var maxAttempts = outbox.DefaultRetryPolicy().MaxAttempts

// pgBackend runs on a database of its own, created for the run and dropped after it, so that
// pg_stat_database counts the bench's transactions and nobody else's.
type pgBackend struct {
	dsn      string
	dbName   string
	benchDSN string
	server   *sql.DB // on the DSN's database: CREATE/DROP DATABASE, pg_stat_* reads
	db       *sql.DB
}

func (*pgBackend) name() string            { return "postgres" }
func (*pgBackend) dialect() outbox.Dialect { return outbox.Postgres() }
func (b *pgBackend) admin() *sql.DB        { return b.db }

// childDSN implements backend.
func (b *pgBackend) childDSN() (string, string) { return "pgx", b.benchDSN }

// lockWaiters implements lockWatcher: the sessions of the bench database waiting for a
// lock (pg_locks, not granted).
func (b *pgBackend) lockWaiters(ctx context.Context) (int, error) {
	var n int
	err := b.server.QueryRowContext(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database`+
		` WHERE NOT l.granted AND d.datname = $1`, b.dbName).Scan(&n)
	return n, err
}

func (b *pgBackend) setup(ctx context.Context) error {
	u, err := url.Parse(b.dsn)
	if err != nil {
		return fmt.Errorf("PostgreSQL DSN must be a URL: %w", err)
	}
	server, err := sql.Open("pgx", b.dsn)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := server.PingContext(pctx); err != nil {
		_ = server.Close()
		return fmt.Errorf("server unreachable at %s: %w", u.Redacted(), err)
	}
	server.SetMaxOpenConns(2)
	b.server = server
	b.dbName = randomName()
	if _, err := server.ExecContext(ctx, `CREATE DATABASE `+b.dbName); err != nil {
		return fmt.Errorf("create database: %w", err)
	}
	u.Path = "/" + b.dbName
	b.benchDSN = u.String()
	if b.db, err = sql.Open("pgx", b.benchDSN); err != nil {
		return err
	}
	b.db.SetMaxOpenConns(4)
	if err := migrate(ctx, b.db, "postgres", mainTable); err != nil {
		return err
	}
	_, err = b.db.ExecContext(ctx, `CREATE TABLE `+businessTable+` (id bigserial PRIMARY KEY, customer_id bigint NOT NULL,
		amount_cents bigint NOT NULL, status text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`)
	return err
}

func (b *pgBackend) teardown() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if b.db != nil {
		_ = b.db.Close()
	}
	if b.server != nil {
		if b.dbName != "" {
			if _, err := b.server.ExecContext(ctx, `DROP DATABASE IF EXISTS `+b.dbName+` WITH (FORCE)`); err != nil {
				logf("postgres: drop database %s: %v", b.dbName, err)
			}
		}
		_ = b.server.Close()
	}
}

func (b *pgBackend) describe(ctx context.Context) serverInfo {
	info := serverInfo{Settings: map[string]string{}, Connection: "pgx/v5 stdlib, default query exec mode (statements prepared and cached per connection)"}
	_ = b.server.QueryRowContext(ctx, `SELECT version()`).Scan(&info.Version)
	info.Settings["version"] = info.Version
	if f := strings.Fields(info.Version); len(f) >= 2 {
		info.Version = f[0] + " " + f[1] // "PostgreSQL 15.20"
	}
	rows, err := b.server.QueryContext(ctx, `SELECT name, setting || COALESCE(unit, '') FROM pg_settings WHERE name IN
		('fsync', 'synchronous_commit', 'wal_sync_method', 'full_page_writes', 'commit_delay', 'shared_buffers',
		 'autovacuum', 'max_wal_size', 'checkpoint_timeout', 'wal_level')`)
	if err == nil {
		defer rows.Close()
		for rows.Next() {
			var k, v string
			if rows.Scan(&k, &v) == nil {
				info.Settings[k] = v
			}
		}
	}
	info.Durability = fmt.Sprintf("fsync=%s, synchronous_commit=%s, wal_sync_method=%s, full_page_writes=%s: every commit waits for its WAL flush",
		info.Settings["fsync"], info.Settings["synchronous_commit"], info.Settings["wal_sync_method"], info.Settings["full_page_writes"])
	return info
}

func (b *pgBackend) pool(maxConns int) (*sql.DB, *txCounter, error) {
	return openCountingDB("pgx", b.benchDSN, maxConns)
}

// reset empties table, or on the retained table removes only what burn-downs added (the
// retained rows are a day old).
func (b *pgBackend) reset(ctx context.Context, table string) error {
	if table == retainedTable {
		_, err := b.db.ExecContext(ctx, `DELETE FROM `+table+` WHERE created_at > now() - interval '1 hour'`)
		return err
	}
	_, err := b.db.ExecContext(ctx, `TRUNCATE `+table+`, `+businessTable)
	return err
}

func (b *pgBackend) maintain(ctx context.Context, table string) error {
	_, err := b.db.ExecContext(ctx, `VACUUM ANALYZE `+table)
	return err
}

// countStart reads pg_stat_database.xact_commit, which counts every transaction that
// committed in the database, read-only ones included. A backend reports its counts lazily
// (PostgreSQL 15: at most once a second while busy) and always when it exits, so the window
// is closed by closing every connection to the bench database and waiting for the counter
// to settle.
func (b *pgBackend) countStart(ctx context.Context) (func(context.Context, *sql.DB, *txCounter) (commitCount, error), error) {
	before, err := b.settledCommits(ctx)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, db *sql.DB, c *txCounter) (commitCount, error) {
		cl := c.snapshot()
		_ = db.Close()
		after, err := b.settledCommits(ctx)
		if err != nil {
			return commitCount{}, err
		}
		n := after - before
		return commitCount{
			Server: n, Client: cl,
			Method: "pg_stat_database.xact_commit delta of the bench's own database, read after every connection closed",
			Check: fmt.Sprintf("server %d; client %d autocommit statements + %d commits = %d over %d connections (server - client = %d)",
				n, cl.Autocommit, cl.Commits, cl.Transactions(), cl.Conns, n-cl.Transactions()),
		}, nil
	}, nil
}

// settledCommits closes the admin pool's idle connections, waits until no client backend
// is connected to the bench database, then reads xact_commit until it stops moving.
func (b *pgBackend) settledCommits(ctx context.Context) (int64, error) {
	b.db.SetMaxIdleConns(0) // closes the idle connections: their backends exit and flush their counts
	b.db.SetMaxIdleConns(4)
	deadline := time.Now().Add(15 * time.Second)
	for {
		var n int
		if err := b.server.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend'`, b.dbName).Scan(&n); err != nil {
			return 0, err
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%d connections still open on %s", n, b.dbName)
		}
		time.Sleep(10 * time.Millisecond)
	}
	last, same := int64(-1), 0
	for same < 3 {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("xact_commit of %s does not settle", b.dbName)
		}
		time.Sleep(15 * time.Millisecond)
		n, err := b.xactCommit(ctx)
		if err != nil {
			return 0, err
		}
		if n == last {
			same++
		} else {
			last, same = n, 0
		}
	}
	return last, nil
}

// xactCommit reads the counter on one connection after dropping that session's statistics
// snapshot (stats_fetch_consistency may cache it).
func (b *pgBackend) xactCommit(ctx context.Context) (int64, error) {
	conn, err := b.server.Conn(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		return 0, err
	}
	var n int64
	err = conn.QueryRowContext(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = $1`, b.dbName).Scan(&n)
	return n, err
}

func (b *pgBackend) loadRetained(ctx context.Context, table string, n int) error {
	// Time-ordered ids a day old (UUIDv7 layout: 48-bit milliseconds, version 7, variant 8),
	// 280..479-byte payloads with their real SHA-256, delivered a day ago.
	base := time.Now().Add(-24 * time.Hour).UnixMilli()
	q := `INSERT INTO ` + table + ` (id, namespace, topic, partition_key, payload, payload_hash, status, attempts,
		next_attempt_at, lease_token, created_at, updated_at, delivered_at)
	SELECT (lpad(to_hex($1::bigint + g / 100), 12, '0') || '7000' || '8' || lpad(to_hex(g), 15, '0'))::uuid,
		'` + benchNamespace + `', '` + benchTopic + `', 'order-' || g, p.payload::json, sha256(convert_to(p.payload, 'UTF8')),
		'delivered', 1, p.ts, gen_random_uuid(), p.ts, p.ts, p.ts
	FROM generate_series($2::bigint, $3::bigint) AS g,
	LATERAL (SELECT '{"order_id":' || g || ',"status":"paid","note":"' || repeat('x', 280 + (g % 200)::int) || '"}' AS payload,
		now() - interval '1 day' + g * interval '1 microsecond' AS ts) AS p`
	const chunk = 200_000
	for lo := 1; lo <= n; lo += chunk {
		hi := min(lo+chunk-1, n)
		if _, err := b.db.ExecContext(ctx, q, base, lo, hi); err != nil {
			return err
		}
	}
	return nil
}

func (b *pgBackend) loadPending(ctx context.Context, table string, n int, due time.Time, spread time.Duration) error {
	base := time.Now().UnixMilli()
	q := `INSERT INTO ` + table + ` (id, namespace, topic, partition_key, payload, payload_hash, next_attempt_at)
	SELECT (lpad(to_hex($1::bigint + g / 100), 12, '0') || '7000' || '8' || lpad(to_hex(g), 15, '0'))::uuid,
		'` + benchNamespace + `', '` + benchTopic + `', 'order-' || g, p.payload::json, sha256(convert_to(p.payload, 'UTF8')),
		$4::timestamptz + (g * $5::bigint / $6::bigint) * interval '1 microsecond'
	FROM generate_series($2::bigint, $3::bigint) AS g,
	LATERAL (SELECT '{"order_id":' || g || ',"status":"paid","note":"' || repeat('x', 280 + (g % 200)::int) || '"}' AS payload) AS p`
	const chunk = 200_000
	for lo := 1; lo <= n; lo += chunk {
		hi := min(lo+chunk-1, n)
		if _, err := b.db.ExecContext(ctx, q, base, lo, hi, due, spread.Microseconds(), n); err != nil {
			return err
		}
	}
	return nil
}

// noAutoAnalyze keeps autovacuum away from table, so that it stays never analyzed.
func (b *pgBackend) noAutoAnalyze(ctx context.Context, table string) error {
	_, err := b.db.ExecContext(ctx, `ALTER TABLE `+table+` SET (autovacuum_enabled = false)`)
	return err
}

func (b *pgBackend) raw(table string) rawOps {
	t := `"` + table + `"`
	cols := `(id, namespace, topic, partition_key, payload, payload_hash, status, attempts, next_attempt_at, created_at, updated_at)`
	return &pgRaw{
		business:   `INSERT INTO ` + businessTable + ` (customer_id, amount_cents, status) VALUES ($1, $2, 'paid')`,
		insertSQL:  `INSERT INTO ` + t + ` ` + cols + ` VALUES ($1, $2, $3, $4, $5, $6, 'pending', 0, now(), now(), now())`,
		valuesHead: `INSERT INTO ` + t + ` ` + cols + ` VALUES `,
		unnestSQL: `INSERT INTO ` + t + ` ` + cols + ` SELECT u.id, u.namespace, u.topic, u.pkey, u.payload, u.hash, 'pending', 0, now(), now(), now()` +
			` FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::json[], $6::bytea[]) AS u(id, namespace, topic, pkey, payload, hash)`,
		// The library's batch statement (dialect_postgres.go), written by hand.
		libShapeSQL: `INSERT INTO ` + t + ` (id, namespace, topic, tenant_id, dedupe_key, partition_key, headers, payload, payload_hash, status, attempts, next_attempt_at, created_at, updated_at)` +
			` SELECT u.id, u.namespace, u.topic, u.tenant_id, u.dedupe_key, u.partition_key, u.headers, u.payload, u.payload_hash,` +
			` 'pending', 0, now() + u.delay_us * interval '1 microsecond', now(), now()` +
			` FROM unnest($1::uuid[], $2::text[], $3::text[], $4::uuid[], $5::text[], $6::text[], $7::json[], $8::json[], $9::bytea[], $10::bigint[])` +
			` AS u(id, namespace, topic, tenant_id, dedupe_key, partition_key, headers, payload, payload_hash, delay_us)` +
			` ON CONFLICT (namespace, topic, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING`,
		// The library's claim, returning what a transport needs.
		claimSQL: `WITH c AS MATERIALIZED (SELECT id FROM ` + t + ` WHERE status IN ('pending', 'processing')` +
			` AND ((status = 'pending' AND next_attempt_at <= now()) OR (status = 'processing' AND locked_until < now()))` +
			` AND attempts < $1 AND namespace = $2 ORDER BY created_at, id LIMIT $3 FOR UPDATE SKIP LOCKED)` +
			` UPDATE ` + t + ` AS t SET status = 'processing', attempts = t.attempts + 1, locked_by = $4,` +
			` locked_until = now() + interval '30 seconds', lease_token = $5, updated_at = now()` +
			` FROM c WHERE t.id = c.id RETURNING t.id, t.topic, t.partition_key, t.headers, t.payload, t.attempts`,
		claimFullSQL: `WITH c AS MATERIALIZED (SELECT id FROM ` + t + ` WHERE status IN ('pending', 'processing')` +
			` AND ((status = 'pending' AND next_attempt_at <= now()) OR (status = 'processing' AND locked_until < now()))` +
			` AND attempts < $1 AND namespace = $2 ORDER BY created_at, id LIMIT $3 FOR UPDATE SKIP LOCKED)` +
			` UPDATE ` + t + ` AS t SET status = 'processing', attempts = t.attempts + 1, locked_by = $4,` +
			` locked_until = now() + interval '30 seconds', lease_token = $5, updated_at = now()` +
			` FROM c WHERE t.id = c.id RETURNING ` + fullList("t."),
		ackSQL: `UPDATE ` + t + ` SET status = 'delivered', delivered_at = now(), updated_at = now(), locked_by = NULL, locked_until = NULL` +
			` WHERE id = ANY($1::uuid[])`,
		guardedSQL: `UPDATE ` + t + ` SET status = 'delivered', delivered_at = now(), updated_at = now(), locked_by = NULL, locked_until = NULL` +
			` WHERE id = ANY($1::uuid[]) AND lease_token = $2 AND status = 'processing' RETURNING id`,
	}
}

// pgRaw is the hand-written SQL on PostgreSQL. Statements are rendered once (the values
// form once per row count) and, like the library's, prepared and cached per connection by
// pgx.
type pgRaw struct {
	business, insertSQL, valuesHead, unnestSQL, libShapeSQL, claimSQL, claimFullSQL, ackSQL, guardedSQL string
	values                                                                                              sync.Map // rows -> statement
}

func (r *pgRaw) insertBusiness(ctx context.Context, tx *sql.Tx, i int) error {
	_, err := tx.ExecContext(ctx, r.business, i, 1000+i%5000)
	return err
}

func (r *pgRaw) insertOne(ctx context.Context, tx *sql.Tx, row *rawRow) error {
	_, err := tx.ExecContext(ctx, r.insertSQL, row.id.String(), row.namespace, row.topic, row.pkey, string(row.payload), row.hash)
	return err
}

func (r *pgRaw) insertForms() []insertForm {
	return []insertForm{{"values", false}, {"unnest", false}, {"library-shape", true}}
}

func (r *pgRaw) insertMany(ctx context.Context, q dialect.DBTX, form string, rows []rawRow) error {
	if form == "library-shape" {
		n := len(rows)
		ids, ns, topics, payloads := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		tenants, dedupes, pkeys, headers := make([]*string, n), make([]*string, n), make([]*string, n), make([]*string, n)
		hashes, delays := make([][]byte, n), make([]int64, n)
		for i := range rows {
			pk := rows[i].pkey
			ids[i], ns[i], topics[i], pkeys[i], payloads[i], hashes[i] = rows[i].id.String(), rows[i].namespace, rows[i].topic, &pk, string(rows[i].payload), rows[i].hash
		}
		_, err := q.ExecContext(ctx, r.libShapeSQL, ids, ns, topics, tenants, dedupes, pkeys, headers, payloads, hashes, delays)
		return err
	}
	if form == "unnest" {
		n := len(rows)
		ids, ns, topics, pkeys, payloads, hashes := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([][]byte, n)
		for i := range rows {
			ids[i], ns[i], topics[i], pkeys[i], payloads[i], hashes[i] = rows[i].id.String(), rows[i].namespace, rows[i].topic, rows[i].pkey, string(rows[i].payload), rows[i].hash
		}
		_, err := q.ExecContext(ctx, r.unnestSQL, ids, ns, topics, pkeys, payloads, hashes)
		return err
	}
	query, args := r.insertStmt(rows)
	_, err := q.ExecContext(ctx, query, args...)
	return err
}

// insertStmt is the multi-row VALUES insert of rows with its arguments.
func (r *pgRaw) insertStmt(rows []rawRow) (string, []any) {
	query, ok := r.values.Load(len(rows))
	if !ok {
		var b strings.Builder
		b.WriteString(r.valuesHead)
		for i := range rows {
			if i > 0 {
				b.WriteString(", ")
			}
			p := 6 * i
			b.WriteString("($" + strconv.Itoa(p+1) + ", $" + strconv.Itoa(p+2) + ", $" + strconv.Itoa(p+3) + ", $" + strconv.Itoa(p+4) +
				", $" + strconv.Itoa(p+5) + ", $" + strconv.Itoa(p+6) + ", 'pending', 0, now(), now(), now())")
		}
		query, _ = r.values.LoadOrStore(len(rows), b.String())
	}
	args := make([]any, 0, 6*len(rows))
	for i := range rows {
		row := &rows[i]
		args = append(args, row.id.String(), row.namespace, row.topic, row.pkey, string(row.payload), row.hash)
	}
	return query.(string), args
}

// claimStmt and ackStmt are claim's and ack's statements with their arguments.
func (r *pgRaw) claimStmt(limit int, worker string, token uuid.UUID) (string, []any) {
	return r.claimSQL, []any{maxAttempts, benchNamespace, limit, worker, token.String()}
}

func (r *pgRaw) ackStmt(ids []any) (string, []any) { return r.ackSQL, []any{uuidArray(ids)} }

func (r *pgRaw) claim(ctx context.Context, db *sql.DB, limit int, worker string) (rawClaim, error) {
	c := rawClaim{token: uuid.New(), msgs: make([]rawMsg, 0, limit), ids: make([]any, 0, limit)}
	query, args := r.claimStmt(limit, worker, c.token)
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return c, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			m  rawMsg
			id string
		)
		if err := rows.Scan(&id, &m.topic, &m.pkey, &m.headers, &m.payload, &m.attempts); err != nil {
			return c, err
		}
		c.msgs, c.ids = append(c.msgs, m), append(c.ids, id)
	}
	return c, rows.Err()
}

func (r *pgRaw) claimFull(ctx context.Context, db *sql.DB, limit int, worker string) (rawClaim, error) {
	c := rawClaim{token: uuid.New(), ids: make([]any, 0, limit)}
	rows, err := db.QueryContext(ctx, r.claimFullSQL, maxAttempts, benchNamespace, limit, worker, c.token.String())
	if err != nil {
		return c, err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := scanFull(rows, &id); err != nil {
			return c, err
		}
		c.ids = append(c.ids, id)
	}
	return c, rows.Err()
}

// uuidArray binds the claimed ids (their text form) as one array literal, which pgx sends
// as text at once; for a []string it first tries the binary encoding, fails and formats an
// error (the library binds the same way, pgUUIDArray in dialect_postgres.go).
func uuidArray(ids []any) string {
	var b strings.Builder
	b.Grow(len(ids)*37 + 2)
	b.WriteByte('{')
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(id.(string))
	}
	b.WriteByte('}')
	return b.String()
}

func (r *pgRaw) ack(ctx context.Context, db *sql.DB, ids []any) error {
	query, args := r.ackStmt(ids)
	_, err := db.ExecContext(ctx, query, args...)
	return err
}

func (r *pgRaw) ackGuarded(ctx context.Context, db *sql.DB, ids []any, token uuid.UUID) (int, error) {
	rows, err := db.QueryContext(ctx, r.guardedSQL, uuidArray(ids), token.String())
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return n, err
		}
		n++
	}
	return n, rows.Err()
}

func (r *pgRaw) idArg(id uuid.UUID) any { return id.String() }

func (r *pgRaw) leaseOf(id any, token uuid.UUID) outbox.Lease {
	return outbox.Lease{ID: uuid.MustParse(id.(string)), Token: token}
}

func (b *pgBackend) dropIndex(ctx context.Context, table, index string) error {
	return dropPartialIndexes(ctx, b.db, table, index)
}

// createLean creates the lean table: nine columns and the claim index. available_at is both
// when a pending row may be sent and when a processing row's lease ends.
func (b *pgBackend) createLean(ctx context.Context, table string) (relay, error) {
	t := `"` + table + `"`
	for _, q := range []string{
		`CREATE TABLE ` + t + ` (
			id           uuid        PRIMARY KEY,
			topic        text        NOT NULL,
			payload      json        NOT NULL,
			status       text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'processing', 'delivered', 'dead')),
			attempts     integer     NOT NULL DEFAULT 0,
			available_at timestamptz NOT NULL DEFAULT now(),
			lease_token  uuid,
			created_at   timestamptz NOT NULL DEFAULT now(),
			delivered_at timestamptz)`,
		`CREATE INDEX "` + table + `_claim_idx" ON ` + t + ` (created_at, id) WHERE status IN ('pending', 'processing')`,
	} {
		if _, err := b.db.ExecContext(ctx, q); err != nil {
			return nil, err
		}
	}
	return &pgLean{
		insertSQL:  `INSERT INTO ` + t + ` (id, topic, payload) VALUES ($1, $2, $3)`,
		valuesHead: `INSERT INTO ` + t + ` (id, topic, payload) VALUES `,
		claimSQL: `WITH c AS MATERIALIZED (SELECT id FROM ` + t + ` WHERE status IN ('pending', 'processing')` +
			` AND available_at <= now() AND attempts < $1 ORDER BY created_at, id LIMIT $2 FOR UPDATE SKIP LOCKED)` +
			` UPDATE ` + t + ` AS t SET status = 'processing', attempts = t.attempts + 1,` +
			` available_at = now() + interval '30 seconds', lease_token = $3` +
			` FROM c WHERE t.id = c.id RETURNING t.id, t.topic, t.payload, t.attempts`,
		ackSQL: `UPDATE ` + t + ` SET status = 'delivered', delivered_at = now() WHERE id = ANY($1::uuid[])`,
	}, nil
}

// pgLean is the hand-written SQL of the lean table: the raw loop's statements without the
// columns the table lacks.
type pgLean struct {
	insertSQL, valuesHead, claimSQL, ackSQL string
	values                                  sync.Map // rows -> statement
}

func (r *pgLean) insertOne(ctx context.Context, tx *sql.Tx, row *rawRow) error {
	_, err := tx.ExecContext(ctx, r.insertSQL, row.id.String(), row.topic, string(row.payload))
	return err
}

func (r *pgLean) insertForms() []insertForm { return []insertForm{{"values", false}} }

func (r *pgLean) insertMany(ctx context.Context, q dialect.DBTX, _ string, rows []rawRow) error {
	query, args := r.insertStmt(rows)
	_, err := q.ExecContext(ctx, query, args...)
	return err
}

// insertStmt is the multi-row VALUES insert of rows with its arguments.
func (r *pgLean) insertStmt(rows []rawRow) (string, []any) {
	query, ok := r.values.Load(len(rows))
	if !ok {
		var b strings.Builder
		b.WriteString(r.valuesHead)
		for i := range rows {
			if i > 0 {
				b.WriteString(", ")
			}
			p := 3 * i
			b.WriteString("($" + strconv.Itoa(p+1) + ", $" + strconv.Itoa(p+2) + ", $" + strconv.Itoa(p+3) + ")")
		}
		query, _ = r.values.LoadOrStore(len(rows), b.String())
	}
	args := make([]any, 0, 3*len(rows))
	for i := range rows {
		args = append(args, rows[i].id.String(), rows[i].topic, string(rows[i].payload))
	}
	return query.(string), args
}

// claimStmt and ackStmt are claim's and ack's statements with their arguments.
func (r *pgLean) claimStmt(limit int, _ string, token uuid.UUID) (string, []any) {
	return r.claimSQL, []any{maxAttempts, limit, token.String()}
}

func (r *pgLean) ackStmt(ids []any) (string, []any) { return r.ackSQL, []any{uuidArray(ids)} }

func (r *pgLean) claim(ctx context.Context, db *sql.DB, limit int, worker string) (rawClaim, error) {
	c := rawClaim{token: uuid.New(), msgs: make([]rawMsg, 0, limit), ids: make([]any, 0, limit)}
	query, args := r.claimStmt(limit, worker, c.token)
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return c, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			m  rawMsg
			id string
		)
		if err := rows.Scan(&id, &m.topic, &m.payload, &m.attempts); err != nil {
			return c, err
		}
		c.msgs, c.ids = append(c.msgs, m), append(c.ids, id)
	}
	return c, rows.Err()
}

func (r *pgLean) ack(ctx context.Context, db *sql.DB, ids []any) error {
	query, args := r.ackStmt(ids)
	_, err := db.ExecContext(ctx, query, args...)
	return err
}

// pgStatements is a PostgreSQL relay's statements with their arguments.
type pgStatements interface {
	insertStmt(rows []rawRow) (string, []any)
	claimStmt(limit int, worker string, token uuid.UUID) (string, []any)
	ackStmt(ids []any) (string, []any)
}

// statementWork implements workMeter: it loads n pending rows into table, then runs
// repeats claims of batch rows, the ack of each, and repeats inserts of batch rows, each
// under EXPLAIN (ANALYZE, BUFFERS, WAL), on one connection, and sums what the server
// reports. It counts the work of the statements themselves, not of their commits.
func (b *pgBackend) statementWork(ctx context.Context, table string, r relay, n, batch, repeats int) (*tableWork, error) {
	st, ok := r.(pgStatements)
	if !ok {
		return nil, fmt.Errorf("%T cannot show its statements", r)
	}
	if err := b.reset(ctx, table); err != nil {
		return nil, err
	}
	if err := preloadRows(ctx, b.db, r, n, payloads200); err != nil {
		return nil, err
	}
	if err := b.maintain(ctx, table); err != nil {
		return nil, err
	}
	conn, err := b.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	explain := func(into *stmtWork, rows int, query string, args ...any) error {
		var out string
		if err := conn.QueryRowContext(ctx, `EXPLAIN (ANALYZE, BUFFERS, WAL, TIMING OFF, FORMAT JSON) `+query, args...).Scan(&out); err != nil {
			return err
		}
		var plans []struct {
			Plan struct {
				WALRecords    float64 `json:"WAL Records"`
				WALBytes      float64 `json:"WAL Bytes"`
				WALFPI        float64 `json:"WAL FPI"`
				SharedHit     float64 `json:"Shared Hit Blocks"`
				SharedRead    float64 `json:"Shared Read Blocks"`
				SharedDirtied float64 `json:"Shared Dirtied Blocks"`
			} `json:"Plan"`
			ExecutionTime float64 `json:"Execution Time"`
		}
		if err := json.Unmarshal([]byte(out), &plans); err != nil || len(plans) != 1 {
			return fmt.Errorf("EXPLAIN output: %v", err)
		}
		p := plans[0].Plan
		into.Statements++
		into.Rows += rows
		into.WALRecords += p.WALRecords
		into.WALBytes += p.WALBytes
		into.WALFPI += p.WALFPI
		into.Buffers += p.SharedHit + p.SharedRead
		into.Dirtied += p.SharedDirtied
		into.ExecMs += plans[0].ExecutionTime
		return nil
	}
	w := &tableWork{}
	for range repeats {
		token := uuid.New()
		query, args := st.claimStmt(batch, "work", token)
		if err := explain(&w.Claim, batch, query, args...); err != nil {
			return nil, fmt.Errorf("claim: %w", err)
		}
		ids, err := queryStrings(ctx, conn, `SELECT id::text FROM "`+table+`" WHERE lease_token = $1`, token.String())
		if err != nil {
			return nil, err
		}
		if len(ids) != batch {
			return nil, fmt.Errorf("claim leased %d rows, want %d", len(ids), batch)
		}
		query, args = st.ackStmt(ids)
		if err := explain(&w.Ack, batch, query, args...); err != nil {
			return nil, fmt.Errorf("ack: %w", err)
		}
	}
	for i := range repeats {
		query, args := st.insertStmt(rawRowsOf(n+i*batch, batch, payloads200))
		if err := explain(&w.Insert, batch, query, args...); err != nil {
			return nil, fmt.Errorf("insert: %w", err)
		}
	}
	return w, nil
}

// queryStrings returns the one text column of query's rows, as ids in claim's form.
func queryStrings(ctx context.Context, conn *sql.Conn, query string, args ...any) ([]any, error) {
	rows, err := conn.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []any
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}
