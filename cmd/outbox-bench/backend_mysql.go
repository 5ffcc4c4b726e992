package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

// myBackend runs on a database of its own on the MariaDB/MySQL server, created for the run
// and dropped after it.
type myBackend struct {
	dsn      string
	dbName   string
	benchDSN string
	server   *sql.DB
	db       *sql.DB
}

func (*myBackend) name() string            { return "mysql" }
func (*myBackend) dialect() outbox.Dialect { return outbox.MySQL() }
func (b *myBackend) admin() *sql.DB        { return b.db }

// childDSN implements backend.
func (b *myBackend) childDSN() (string, string) { return "mysql", b.benchDSN }

// lockWaiters implements lockWatcher: the InnoDB transactions of the bench database's
// sessions waiting for a lock.
func (b *myBackend) lockWaiters(ctx context.Context) (int, error) {
	var n int
	err := b.server.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.INNODB_TRX t`+
		` JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id WHERE t.trx_state = 'LOCK WAIT' AND p.DB = ?`, b.dbName).Scan(&n)
	return n, err
}

func (b *myBackend) setup(ctx context.Context) error {
	cfg, err := mysql.ParseDSN(b.dsn)
	if err != nil {
		return fmt.Errorf("MySQL DSN: %w", err)
	}
	server, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := server.PingContext(pctx); err != nil {
		_ = server.Close()
		return fmt.Errorf("server unreachable at %s: %w", cfg.Addr, err)
	}
	server.SetMaxOpenConns(2)
	b.server = server
	b.dbName = randomName()
	if _, err := server.ExecContext(ctx, `CREATE DATABASE `+b.dbName); err != nil {
		return fmt.Errorf("create database: %w", err)
	}
	c := cfg.Clone()
	c.DBName = b.dbName
	b.benchDSN = c.FormatDSN()
	if b.db, err = sql.Open("mysql", b.benchDSN); err != nil {
		return err
	}
	b.db.SetMaxOpenConns(4)
	if err := migrate(ctx, b.db, "mysql", mainTable); err != nil {
		return err
	}
	_, err = b.db.ExecContext(ctx, `CREATE TABLE `+businessTable+` (id BIGINT AUTO_INCREMENT PRIMARY KEY, customer_id BIGINT NOT NULL,
		amount_cents BIGINT NOT NULL, status VARCHAR(16) NOT NULL, created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE = InnoDB`)
	return err
}

func (b *myBackend) teardown() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if b.db != nil {
		_ = b.db.Close()
	}
	if b.server != nil {
		if b.dbName != "" {
			if _, err := b.server.ExecContext(ctx, `DROP DATABASE IF EXISTS `+b.dbName); err != nil {
				logf("mysql: drop database %s: %v", b.dbName, err)
			}
		}
		_ = b.server.Close()
	}
}

func (b *myBackend) describe(ctx context.Context) serverInfo {
	info := serverInfo{Settings: map[string]string{}}
	_ = b.server.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&info.Version)
	info.Settings["version"] = info.Version
	product := "MySQL "
	if strings.Contains(strings.ToLower(info.Version), "mariadb") {
		product = "MariaDB "
	}
	info.Version = product + strings.SplitN(info.Version, "-", 2)[0] // "MariaDB 10.11.19"
	for _, v := range []string{"innodb_flush_log_at_trx_commit", "sync_binlog", "log_bin", "innodb_doublewrite",
		"innodb_flush_method", "innodb_buffer_pool_size", "innodb_log_file_size"} {
		var val sql.NullString
		if b.server.QueryRowContext(ctx, `SELECT @@GLOBAL.`+v).Scan(&val) == nil {
			info.Settings[v] = val.String
		}
	}
	info.Durability = fmt.Sprintf("innodb_flush_log_at_trx_commit=%s (redo log flushed at every commit), innodb_doublewrite=%s, log_bin=%s, sync_binlog=%s",
		info.Settings["innodb_flush_log_at_trx_commit"], info.Settings["innodb_doublewrite"], info.Settings["log_bin"], info.Settings["sync_binlog"])
	cfg, _ := mysql.ParseDSN(b.dsn)
	mode := "server-side prepared statements (prepare + execute per statement with arguments)"
	if cfg != nil && cfg.InterpolateParams {
		mode = "interpolateParams=true (one round trip per statement)"
	}
	info.Connection = "go-sql-driver/mysql, " + mode
	return info
}

func (b *myBackend) pool(maxConns int) (*sql.DB, *txCounter, error) {
	return openCountingDB("mysql", b.benchDSN, maxConns)
}

func (b *myBackend) reset(ctx context.Context, table string) error {
	if table == retainedTable {
		_, err := b.db.ExecContext(ctx, "DELETE FROM `"+table+"` WHERE status IN ('pending', 'processing', 'delivered', 'dead') AND created_at > UTC_TIMESTAMP(6) - INTERVAL 1 HOUR")
		return err
	}
	for _, t := range []string{table, businessTable} {
		if _, err := b.db.ExecContext(ctx, "TRUNCATE TABLE `"+t+"`"); err != nil {
			return err
		}
	}
	return nil
}

func (b *myBackend) maintain(ctx context.Context, table string) error {
	_, err := b.db.ExecContext(ctx, "ANALYZE TABLE `"+table+"`")
	return err
}

// countStart: MariaDB has no per-database transaction counter, and its global ones count
// every client of the server (other work on a shared machine). Session status is exact but
// Handler_commit, its commit counter, counts one per statement that touched InnoDB plus one
// per COMMIT (validated in validateCounter). So the transactions are counted by the driver
// wrapper (autocommit statements + COMMITs) and confirmed server-side: the sum of
// Handler_commit over every connection of the pool must equal statements + COMMITs.
func (b *myBackend) countStart(context.Context) (func(context.Context, *sql.DB, *txCounter) (commitCount, error), error) {
	return func(ctx context.Context, db *sql.DB, c *txCounter) (commitCount, error) {
		defer db.Close()
		cl := c.snapshot()
		handler, err := sessionSum(ctx, db, "Handler_commit")
		if err != nil {
			return commitCount{}, err
		}
		predicted := cl.Autocommit + cl.InTx + cl.Commits
		verdict := "matches"
		if handler != predicted {
			verdict = fmt.Sprintf("DIFFERS by %d", handler-predicted)
		}
		return commitCount{
			Server: cl.Writes(), Client: cl,
			Method: "driver-counted write transactions (autocommit statements that are not a SELECT + COMMITs), confirmed by session Handler_commit summed over the pool's connections",
			Check: fmt.Sprintf("%d autocommit (%d of them SELECTs, the listener's probes among them) + %d commits = %d transactions, %d that could write; Handler_commit %d %s statements + commits = %d",
				cl.Autocommit, cl.AutocommitReads, cl.Commits, cl.Transactions(), cl.Writes(), handler, verdict, predicted),
		}, nil
	}, nil
}

// sessionSum adds a session status variable over every open connection of db. It holds all
// of them at once, so each is read exactly once; it fails if a connection was closed during
// the run (its count would be lost).
func sessionSum(ctx context.Context, db *sql.DB, variable string) (int64, error) {
	st := db.Stats()
	if lost := st.MaxIdleClosed + st.MaxIdleTimeClosed + st.MaxLifetimeClosed; lost > 0 {
		return 0, fmt.Errorf("%d connections closed during the run; their session counters are lost", lost)
	}
	n := st.OpenConnections
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	var sum int64
	for range n {
		c, err := db.Conn(ctx)
		if err != nil {
			return 0, err
		}
		conns = append(conns, c)
		var name string
		var v int64
		if err := c.QueryRowContext(ctx, `SHOW SESSION STATUS LIKE '`+variable+`'`).Scan(&name, &v); err != nil {
			return 0, err
		}
		sum += v
	}
	if after := db.Stats().OpenConnections; after != n {
		return 0, fmt.Errorf("pool had %d connections, reading them opened %d", n, after)
	}
	return sum, nil
}

// loadRetained generates the rows server-side from MariaDB's Sequence engine (seq_1_to_n),
// and falls back to client-side multi-row inserts where it is missing (MySQL).
func (b *myBackend) loadRetained(ctx context.Context, table string, n int) error {
	base := time.Now().Add(-24 * time.Hour).UnixMilli()
	const chunk = 100_000
	for lo := 1; lo <= n; lo += chunk {
		hi := min(lo+chunk-1, n)
		q := "INSERT INTO `" + table + "` (id, namespace, topic, partition_key, payload, payload_hash, status, attempts," +
			" next_attempt_at, lease_token, created_at, updated_at, delivered_at)" +
			" SELECT UNHEX(CONCAT(LPAD(HEX(? + seq DIV 100), 12, '0'), '7000', '8', LPAD(HEX(seq), 15, '0'))), '" + benchNamespace + "', '" + benchTopic + "'," +
			" CONCAT('order-', seq), p, UNHEX(SHA2(p, 256)), 'delivered', 1, ts, UNHEX(MD5(seq)), ts, ts, ts" +
			" FROM (SELECT seq, CONCAT('{\"order_id\":', seq, ',\"status\":\"paid\",\"note\":\"', REPEAT('x', 280 + seq % 200), '\"}') AS p," +
			" UTC_TIMESTAMP(6) - INTERVAL 1 DAY + INTERVAL seq MICROSECOND AS ts FROM seq_" + strconv.Itoa(lo) + "_to_" + strconv.Itoa(hi) + ") s"
		if _, err := b.db.ExecContext(ctx, q, base); err != nil {
			if lo == 1 && strings.Contains(err.Error(), "seq_") {
				logf("mysql: no Sequence engine (%v); loading retained rows from the client", err)
				return loadRetainedClient(ctx, b.db, b.raw(table), table, n)
			}
			return err
		}
	}
	return nil
}

// loadPending generates the rows server-side as loadRetained does, or from the client
// without the Sequence engine.
func (b *myBackend) loadPending(ctx context.Context, table string, n int, due time.Time, spread time.Duration) error {
	base := time.Now().UnixMilli()
	const chunk = 100_000
	for lo := 1; lo <= n; lo += chunk {
		hi := min(lo+chunk-1, n)
		q := "INSERT INTO `" + table + "` (id, namespace, topic, partition_key, payload, payload_hash, next_attempt_at, created_at, updated_at)" +
			" SELECT UNHEX(CONCAT(LPAD(HEX(? + seq DIV 100), 12, '0'), '7000', '8', LPAD(HEX(seq), 15, '0'))), '" + benchNamespace + "', '" + benchTopic + "'," +
			" CONCAT('order-', seq), p, UNHEX(SHA2(p, 256)), ? + INTERVAL (seq * ? DIV ?) MICROSECOND, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)" +
			" FROM (SELECT seq, CONCAT('{\"order_id\":', seq, ',\"status\":\"paid\",\"note\":\"', REPEAT('x', 280 + seq % 200), '\"}') AS p" +
			" FROM seq_" + strconv.Itoa(lo) + "_to_" + strconv.Itoa(hi) + ") s"
		if _, err := b.db.ExecContext(ctx, q, base, due.UTC().Format("2006-01-02 15:04:05.999999"), spread.Microseconds(), n); err != nil {
			if lo == 1 && strings.Contains(err.Error(), "seq_") {
				logf("mysql: no Sequence engine (%v); loading pending rows from the client", err)
				return loadPendingClient(ctx, b.db, b.raw(table), table, n, due, spread)
			}
			return err
		}
	}
	return nil
}

// loadPendingClient inserts n rows with raw multi-row inserts and schedules them.
func loadPendingClient(ctx context.Context, db *sql.DB, r rawOps, table string, n int, due time.Time, spread time.Duration) error {
	const chunk = 1000
	for lo := 0; lo < n; lo += chunk {
		if err := r.insertMany(ctx, db, "values", newRawRows(lo, min(chunk, n-lo))); err != nil {
			return err
		}
	}
	_, err := db.ExecContext(ctx, "UPDATE `"+table+"` SET next_attempt_at = ? + INTERVAL FLOOR(RAND() * ?) MICROSECOND",
		due.UTC().Format("2006-01-02 15:04:05.999999"), spread.Microseconds())
	return err
}

// loadRetainedClient inserts n rows with raw multi-row inserts and marks them delivered.
func loadRetainedClient(ctx context.Context, db *sql.DB, r rawOps, table string, n int) error {
	const chunk = 1000
	for lo := 0; lo < n; lo += chunk {
		if err := r.insertMany(ctx, db, "values", newRawRows(lo, min(chunk, n-lo))); err != nil {
			return err
		}
	}
	_, err := db.ExecContext(ctx, "UPDATE `"+table+"` SET status = 'delivered', attempts = 1, delivered_at = updated_at")
	return err
}

func (b *myBackend) raw(table string) rawOps {
	t := "`" + table + "`"
	return &myRaw{
		business:  "INSERT INTO " + businessTable + " (customer_id, amount_cents, status) VALUES (?, ?, 'paid')",
		insertSQL: "INSERT INTO " + t + myCols + " VALUES " + myRow,
		head:      "INSERT INTO " + t + myCols + " VALUES ",
		libHead:   "INSERT INTO " + t + myLibCols + " VALUES ",
		claimSQL: "SELECT id, topic, partition_key, headers, payload, attempts FROM " + t +
			" WHERE status = 'pending' AND next_attempt_at <= UTC_TIMESTAMP(6) AND attempts < ? AND namespace = ?" +
			" ORDER BY created_at, id LIMIT ? FOR UPDATE SKIP LOCKED",
		claimFullSQL: "SELECT " + fullList("") + " FROM " + t +
			" WHERE status = 'pending' AND next_attempt_at <= UTC_TIMESTAMP(6) AND attempts < ? AND namespace = ?" +
			" ORDER BY created_at, id LIMIT ? FOR UPDATE SKIP LOCKED",
		leaseHead: "UPDATE " + t + " SET status = 'processing', attempts = attempts + 1, locked_by = ?," +
			" locked_until = UTC_TIMESTAMP(6) + INTERVAL 30 SECOND, lease_token = ?, updated_at = UTC_TIMESTAMP(6) WHERE id IN ",
		ackHead: "UPDATE " + t + " SET status = 'delivered', delivered_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6)," +
			" locked_by = NULL, locked_until = NULL WHERE id IN ",
	}
}

const (
	myCols = " (id, namespace, topic, partition_key, payload, payload_hash, status, attempts, next_attempt_at, created_at, updated_at)"
	myRow  = "(?, ?, ?, ?, ?, ?, 'pending', 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
)

// myRaw is the hand-written SQL on MariaDB/MySQL: without UPDATE ... RETURNING, a claim is a
// READ COMMITTED transaction of one locking read (pending rows in claim index order, SKIP
// LOCKED) and one UPDATE by primary key; the ack is one UPDATE ... WHERE id IN (...).
// Statement texts are rendered once per row count.
type myRaw struct {
	business, insertSQL, head, libHead, claimSQL, claimFullSQL, leaseHead, ackHead string
	rendered                                                                       sync.Map // key -> statement
}

func (r *myRaw) render(key string, n int, head, group string) string {
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
	s, _ := r.rendered.LoadOrStore(k, b.String())
	return s.(string)
}

func (r *myRaw) inList(n int, head string, key string) string {
	return r.render(key, n, head+"(", "?") + ")"
}

func (r *myRaw) insertBusiness(ctx context.Context, tx *sql.Tx, i int) error {
	_, err := tx.ExecContext(ctx, r.business, i, 1000+i%5000)
	return err
}

func (r *myRaw) insertOne(ctx context.Context, tx *sql.Tx, row *rawRow) error {
	_, err := tx.ExecContext(ctx, r.insertSQL, row.id[:], row.namespace, row.topic, row.pkey, row.payload, row.hash)
	return err
}

func (r *myRaw) insertForms() []insertForm {
	return []insertForm{{"values", false}, {"library-shape", true}}
}

// myLibRow is the library's row for messages without a dedupe key (dialect_mysql.go): ten
// placeholders, next_attempt_at from a bound delay.
const (
	myLibCols = " (id, namespace, topic, tenant_id, dedupe_key, partition_key, headers, payload, payload_hash, status, attempts, next_attempt_at, created_at, updated_at)"
	myLibRow  = "(?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', 0, DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
)

func (r *myRaw) insertMany(ctx context.Context, q dialect.DBTX, form string, rows []rawRow) error {
	if form == "library-shape" {
		args := make([]any, 0, 10*len(rows))
		for i := range rows {
			row := &rows[i]
			args = append(args, row.id[:], row.namespace, row.topic, nil, nil, row.pkey, nil, row.payload, row.hash, int64(0))
		}
		_, err := q.ExecContext(ctx, r.render("libshape", len(rows), r.libHead, myLibRow), args...)
		return err
	}
	args := make([]any, 0, 6*len(rows))
	for i := range rows {
		row := &rows[i]
		args = append(args, row.id[:], row.namespace, row.topic, row.pkey, row.payload, row.hash)
	}
	_, err := q.ExecContext(ctx, r.render("values", len(rows), r.head, myRow), args...)
	return err
}

func (r *myRaw) claim(ctx context.Context, db *sql.DB, limit int, worker string) (rawClaim, error) {
	c := rawClaim{token: uuid.New(), msgs: make([]rawMsg, 0, limit), ids: make([]any, 0, limit)}
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return c, err
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, r.claimSQL, maxAttempts, benchNamespace, limit)
	if err != nil {
		return c, err
	}
	args := make([]any, 2, limit+2)
	args[0], args[1] = worker, c.token[:]
	for rows.Next() {
		var (
			m  rawMsg
			id []byte
		)
		if err := rows.Scan(&id, &m.topic, &m.pkey, &m.headers, &m.payload, &m.attempts); err != nil {
			rows.Close()
			return c, err
		}
		c.msgs, c.ids, args = append(c.msgs, m), append(c.ids, id), append(args, id)
	}
	if err := rows.Err(); err != nil {
		return c, err
	}
	if len(c.ids) > 0 {
		if _, err := tx.ExecContext(ctx, r.inList(len(c.ids), r.leaseHead, "lease"), args...); err != nil {
			return c, err
		}
	}
	return c, tx.Commit()
}

// claimFull is claim reading every column a publisher needs; like the library's claim, it
// reads them before its UPDATE takes the lease.
func (r *myRaw) claimFull(ctx context.Context, db *sql.DB, limit int, worker string) (rawClaim, error) {
	c := rawClaim{token: uuid.New(), ids: make([]any, 0, limit)}
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return c, err
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, r.claimFullSQL, maxAttempts, benchNamespace, limit)
	if err != nil {
		return c, err
	}
	args := make([]any, 2, limit+2)
	args[0], args[1] = worker, c.token[:]
	for rows.Next() {
		var id []byte
		if err := scanFull(rows, &id); err != nil {
			rows.Close()
			return c, err
		}
		c.ids, args = append(c.ids, id), append(args, id)
	}
	if err := rows.Err(); err != nil {
		return c, err
	}
	if len(c.ids) > 0 {
		if _, err := tx.ExecContext(ctx, r.inList(len(c.ids), r.leaseHead, "lease"), args...); err != nil {
			return c, err
		}
	}
	return c, tx.Commit()
}

func (r *myRaw) ack(ctx context.Context, db *sql.DB, ids []any) error {
	_, err := db.ExecContext(ctx, r.inList(len(ids), r.ackHead, "ack"), ids...)
	return err
}

func (r *myRaw) ackGuarded(ctx context.Context, db *sql.DB, ids []any, token uuid.UUID) (int, error) {
	args := append(make([]any, 0, len(ids)+1), ids...)
	args = append(args, token[:])
	res, err := db.ExecContext(ctx, r.inList(len(ids), r.ackHead, "ack")+" AND lease_token = ? AND status = 'processing'", args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}

func (r *myRaw) idArg(id uuid.UUID) any { return id[:] }

func (r *myRaw) leaseOf(id any, token uuid.UUID) outbox.Lease {
	return outbox.Lease{ID: uuid.UUID(id.([]byte)), Token: token}
}

// dropIndex: MySQL's dedupe keys live in a table of their own (the outbox table has no
// dedupe index), written only for rows that carry a key.
func (b *myBackend) dropIndex(ctx context.Context, table, index string) error {
	var q string
	switch index {
	case "dedupe":
		return errors.ErrUnsupported
	case "retention":
		q = "ALTER TABLE `" + table + "` DROP KEY `" + table + "_retention_idx`"
	default:
		return fmt.Errorf("unknown index %q", index)
	}
	_, err := b.db.ExecContext(ctx, q)
	return err
}

// createLean creates the lean table: nine columns and the claim index (MySQL has no partial
// index; the claim index leads with status, as the library's does). available_at is both
// when a pending row may be sent and when a processing row's lease ends.
func (b *myBackend) createLean(ctx context.Context, table string) (relay, error) {
	t := "`" + table + "`"
	_, err := b.db.ExecContext(ctx, "CREATE TABLE "+t+` (
		id           BINARY(16)     NOT NULL,
		topic        VARBINARY(255) NOT NULL,
		payload      LONGBLOB       NOT NULL,
		status       ENUM('pending', 'processing', 'delivered', 'dead') NOT NULL DEFAULT 'pending',
		attempts     INT            NOT NULL DEFAULT 0,
		available_at DATETIME(6)    NOT NULL,
		lease_token  BINARY(16)     NULL,
		created_at   DATETIME(6)    NOT NULL,
		delivered_at DATETIME(6)    NULL,
		PRIMARY KEY (id),
		KEY `+"`"+table+"_claim_idx`"+` (status, created_at, id)
	) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin`)
	if err != nil {
		return nil, err
	}
	return &myLean{
		insertSQL: "INSERT INTO " + t + myLeanCols + " VALUES " + myLeanRow,
		head:      "INSERT INTO " + t + myLeanCols + " VALUES ",
		claimSQL: "SELECT id, topic, payload, attempts FROM " + t +
			" WHERE status = 'pending' AND available_at <= UTC_TIMESTAMP(6) AND attempts < ?" +
			" ORDER BY created_at, id LIMIT ? FOR UPDATE SKIP LOCKED",
		leaseHead: "UPDATE " + t + " SET status = 'processing', attempts = attempts + 1," +
			" available_at = UTC_TIMESTAMP(6) + INTERVAL 30 SECOND, lease_token = ? WHERE id IN ",
		ackHead: "UPDATE " + t + " SET status = 'delivered', delivered_at = UTC_TIMESTAMP(6) WHERE id IN ",
	}, nil
}

const (
	myLeanCols = " (id, topic, payload, status, attempts, available_at, created_at)"
	myLeanRow  = "(?, ?, ?, 'pending', 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
)

// myLean is the hand-written SQL of the lean table: the raw loop's statements without the
// columns the table lacks.
type myLean struct {
	insertSQL, head, claimSQL, leaseHead, ackHead string
	r                                             myRaw // its statement cache
}

func (l *myLean) insertOne(ctx context.Context, tx *sql.Tx, row *rawRow) error {
	_, err := tx.ExecContext(ctx, l.insertSQL, row.id[:], row.topic, row.payload)
	return err
}

func (l *myLean) insertForms() []insertForm { return []insertForm{{"values", false}} }

func (l *myLean) insertMany(ctx context.Context, q dialect.DBTX, _ string, rows []rawRow) error {
	args := make([]any, 0, 3*len(rows))
	for i := range rows {
		args = append(args, rows[i].id[:], rows[i].topic, rows[i].payload)
	}
	_, err := q.ExecContext(ctx, l.r.render("values", len(rows), l.head, myLeanRow), args...)
	return err
}

func (l *myLean) claim(ctx context.Context, db *sql.DB, limit int, _ string) (rawClaim, error) {
	c := rawClaim{token: uuid.New(), msgs: make([]rawMsg, 0, limit), ids: make([]any, 0, limit)}
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return c, err
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, l.claimSQL, maxAttempts, limit)
	if err != nil {
		return c, err
	}
	args := make([]any, 1, limit+1)
	args[0] = c.token[:]
	for rows.Next() {
		var (
			m  rawMsg
			id []byte
		)
		if err := rows.Scan(&id, &m.topic, &m.payload, &m.attempts); err != nil {
			rows.Close()
			return c, err
		}
		c.msgs, c.ids, args = append(c.msgs, m), append(c.ids, id), append(args, id)
	}
	if err := rows.Err(); err != nil {
		return c, err
	}
	if len(c.ids) > 0 {
		if _, err := tx.ExecContext(ctx, l.r.inList(len(c.ids), l.leaseHead, "lease"), args...); err != nil {
			return c, err
		}
	}
	return c, tx.Commit()
}

func (l *myLean) ack(ctx context.Context, db *sql.DB, ids []any) error {
	_, err := db.ExecContext(ctx, l.r.inList(len(ids), l.ackHead, "ack"), ids...)
	return err
}
