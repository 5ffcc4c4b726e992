// Package mysql is the built-in dialect for MySQL and MariaDB, behind outbox.MySQL: its
// SQL, its optional abilities (package dialect) and what it knows of the server and its
// driver. It imports package dialect and the shared SQL helpers of package sqlkit, never
// the engine (package outbox), exactly as a dialect written outside the module does.
package mysql

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// New returns the dialect for MySQL and MariaDB. outbox.MySQL is the same and documents it for users.
func New() Dialect { return Dialect{visits: &mysqlVisits{}} }

// The abilities the dialect has, checked at compile time.
var (
	_ dialect.Dialect        = Dialect{}
	_ dialect.Checker        = Dialect{}
	_ dialect.Admin          = Dialect{}
	_ dialect.Notifier       = Dialect{}
	_ dialect.OrderedClaimer = Dialect{}
	_ dialect.SettleClaimer  = Dialect{}
	_ sqlkit.PollingListener = Dialect{}
)

// Dialect renders its statements per call (they depend on the batch size), and the
// parts that never change are package constants. Its one state is where the ordered
// claims' key visits stopped (mysqlVisits), a hint shared by the stores that use the value
// MySQL returned.
//
// # Claim
//
// Neither server has UPDATE ... RETURNING, so a claim is a short transaction on the
// *sql.DB at READ COMMITTED. At the default REPEATABLE READ a locking read also takes gap
// locks, which block concurrent enqueues and deadlock with them; READ COMMITTED locks only
// the rows it returns. Rendered for the default table:
//
//	SELECT id FROM `outbox_events` FORCE INDEX (`outbox_events_claim_idx`)
//	WHERE status = 'processing' AND locked_until < UTC_TIMESTAMP(6)
//	  AND attempts < ? [AND namespace = ?] [AND topic IN (...)] [AND tenant_id = ?]
//	ORDER BY created_at, id LIMIT ?
//
//	-- only when that found expired leases:
//	SELECT <columns>, TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', UTC_TIMESTAMP(6))
//	FROM `outbox_events` FORCE INDEX (PRIMARY)
//	WHERE id IN (?, ...) AND status = 'processing' AND locked_until < UTC_TIMESTAMP(6)
//	  AND attempts < ? FOR UPDATE SKIP LOCKED
//
//	-- only when the limit is not reached yet:
//	SELECT <columns>, TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', UTC_TIMESTAMP(6))
//	FROM `outbox_events` FORCE INDEX (`outbox_events_due_idx`)
//	WHERE status = 'pending' AND next_attempt_at <= UTC_TIMESTAMP(6)
//	  AND attempts < ? [AND namespace = ?] [AND topic IN (...)] [AND tenant_id = ?]
//	ORDER BY next_attempt_at, id LIMIT ? FOR UPDATE SKIP LOCKED
//
//	UPDATE `outbox_events` FORCE INDEX (PRIMARY)
//	SET status = 'processing', attempts = attempts + 1, locked_by = ?,
//	    locked_until = TIMESTAMP'1970-01-01 00:00:00' + INTERVAL ? MICROSECOND,
//	    lease_token = ?, updated_at = TIMESTAMP'1970-01-01 00:00:00' + INTERVAL ? MICROSECOND
//	WHERE id IN (?, ...)
//
//	COMMIT
//
// Expired leases are reclaimed before pending rows are taken, these in the order they fell
// due: an equality on the first column of the due index (status, next_attempt_at, id), in
// exactly its order, so the locking read walks a range that ends at the first row not due
// yet and never reads the rows delayed for later or waiting for a retry, however many; in
// any other order it would sort, and lock, the whole pending set. Expired leases come from
// the processing part of the claim index (status, created_at, id, locked_until); the search for
// expired leases tests locked_until on the index entries (index condition pushdown) and
// reads from the table only the rows whose lease ran out, none in the usual case, where
// testing it on each row in flight read every one of them at every claim (1,803 pages for
// 600 rows in flight, against 3, on MariaDB 10.11): a predicate spanning both status
// values could not, and the server would sort, and lock, the whole pending set, and two
// claimers would deadlock over it. FORCE INDEX keeps the walk whatever the optimizer
// thinks of a small or skewed table. SKIP LOCKED lets concurrent claimers pass over each
// other's rows. Expired leases are first looked for without locking, because every row in
// flight sits in the processing part of the index: a locking walk there would lock, index
// entry first, the very rows that acks are settling, primary key first, and deadlock with
// them. The locking reads return the claim's columns (claimColumns) plus the database
// clock as Unix microseconds; the UPDATE stamps the rows with that same reading, so the
// records returned are exactly the rows stored, without reading them again, and one claim
// has one instant (as now() has in a PostgreSQL transaction). A deadlock (error 1213) or lock wait timeout
// (1205) runs the whole claim again after a short jittered pause, up to 4 tries in all (3 retries). A claim is six
// statements (SET TRANSACTION, START TRANSACTION, the two index reads, UPDATE, COMMIT),
// five when there is nothing to claim and seven when it reclaims. With go-sql-driver's
// default server-side prepared statements, each statement with arguments costs two round
// trips (prepare, execute); interpolateParams=true in the DSN makes it one.
//
// # Complete and Extend
//
// Ack and nack are one statement for the whole batch, a join against the outcomes:
//
//	UPDATE (
//	    SELECT CAST(? AS BINARY(16)) AS o_id, CAST(? AS BINARY(16)) AS o_token,
//	        CAST(? AS CHAR(10)) AS o_status, CAST(? AS SIGNED) AS o_delay,
//	        CAST(? AS CHAR(1024)) AS o_error, CAST(? AS SIGNED) AS o_refund
//	    UNION ALL SELECT CAST(? AS BINARY(16)), ... ) u
//	  STRAIGHT_JOIN `outbox_events` t FORCE INDEX (PRIMARY)
//	  ON t.id = u.o_id AND t.lease_token = u.o_token
//	SET t.status = u.o_status,
//	    t.next_attempt_at = CASE WHEN u.o_status = 'pending'
//	        THEN DATE_ADD(UTC_TIMESTAMP(6), INTERVAL u.o_delay MICROSECOND) ELSE t.next_attempt_at END,
//	    t.last_error = CASE WHEN u.o_status = 'delivered' THEN t.last_error ELSE u.o_error END,
//	    t.delivered_at = CASE WHEN u.o_status = 'delivered' THEN UTC_TIMESTAMP(6) ELSE t.delivered_at END,
//	    t.attempts = GREATEST(t.attempts - u.o_refund, 0),
//	    t.locked_by = NULL, t.locked_until = NULL, t.updated_at = UTC_TIMESTAMP(6)
//	WHERE t.status = 'processing'
//
// The outcomes drive the join and each finds its row by primary key, whatever the
// optimizer would guess for a small table: an UPDATE that scanned the table would lock
// every row it read. When the statement changes fewer rows than it was given, one more
// read by primary key finds which leases were lost. Extend has the same shape. On a
// *sql.DB (autocommit), as the Store runs them, these writes and Bury's are retried after
// a deadlock or a lock wait timeout like a claim; on a caller's transaction they are not.
//
// # Enqueue
//
// Uniqueness of (namespace, topic, dedupe_key) is the primary key of a second table,
// <table>_dedupe, not a unique index on the outbox table. InnoDB checks a unique secondary
// index for duplicates with a next-key lock, at every isolation level: when producers race
// for one key, a loser waits with a lock that also covers the gap below the key, and when
// the winner then inserts into that gap (another event of the same topic, say) the server
// rolls one of them back with error 1213. A duplicate primary key is locked as a record
// only, so racing producers queue on the key, the loser learns "already enqueued", and its
// transaction goes on. Waiting on the key itself fails when the winner rolls back: InnoDB
// turns the waiters' locks on the removed key into gap locks, which every waiter then holds
// at once, and their inserts deadlock each other. So producers first lock the key's stripe,
// a row of <table>_dedupe_lock that always exists (mysqlReserve), and reach the key one
// at a time. Then Insert reserves keys, with INSERT INTO <table>_dedupe ...
// ON DUPLICATE KEY UPDATE id = id (0 affected rows for a skipped key, and never INSERT
// IGNORE, which turns unrelated errors into warnings), then writes the outbox rows with a
// plain multi-row INSERT (one per 1000 rows or 4 MiB). Rows without a key skip the first
// step, and the outbox table carries one index fewer. Retention that deletes outbox rows
// must delete their keys from <table>_dedupe as well.
//
// # Time
//
// The database clock is the only clock: every time is UTC_TIMESTAMP(6) (never NOW(), which
// follows the session time zone), durations are bound as integer microseconds, and no
// client clock reading is ever bound (a claim binds its own reading of the database clock
// back, to stamp its rows). Times are read back as integer Unix microseconds (TIMESTAMPDIFF
// from the epoch, pure DATETIME arithmetic), so the DSN's parseTime and loc and the
// session's time_zone never matter. Columns are DATETIME(6), which no server converts
// between time zones.
//
// # Server and driver settings
//
// Keep binlog_format ROW or MIXED (the defaults): READ COMMITTED writes cannot be logged as
// statements. Do not set clientFoundRows=true in the DSN: it makes a skipped dedupe key
// count as one affected row, like a reserved one, so Insert would report a duplicate as
// enqueued.
type Dialect struct {
	visits *mysqlVisits // nil: every key visit starts at the first key
}

func (Dialect) Name() string { return "mysql" }

// Bounds and retry settings.
const (
	// mysqlRowsPerInsert keeps one INSERT at 10,000 placeholders, well below the 65,535
	// the protocol can number.
	mysqlRowsPerInsert = 1000
	// mysqlBytesPerInsert bounds the data of one INSERT (a single larger row still goes
	// alone), well below max_allowed_packet (16 MiB on MariaDB, 64 MiB on MySQL 8).
	mysqlBytesPerInsert = 4 << 20
)

// MySQL error numbers a claim retries.
const (
	mysqlErrLockWaitTimeout = 1205
	mysqlErrDeadlock        = 1213
)

// mysqlEpoch is the Unix epoch as a DATETIME literal. Arithmetic between it and DATETIME
// values involves no time zone.
const mysqlEpoch = `TIMESTAMP'1970-01-01 00:00:00'`

// mysqlMicros renders a DATETIME expression as integer Unix microseconds (NULL stays
// NULL), the form [dialect.ScanTime] scans.
func mysqlMicros(expr string) string {
	return `TIMESTAMPDIFF(MICROSECOND, ` + mysqlEpoch + `, ` + expr + `)`
}

// mysqlFromMicros renders a bound count of Unix microseconds as a DATETIME(6).
func mysqlFromMicros(ph string) string { return mysqlEpoch + ` + INTERVAL ` + ph + ` MICROSECOND` }

// mysqlLater renders now + a bound number of microseconds on the database clock.
func mysqlLater(ph string) string {
	return `DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ` + ph + ` MICROSECOND)`
}

// mysqlColumns is the select list of every record read: sqlkit.RecordColumns with the times as
// Unix microseconds.
var mysqlColumns = sqlkit.SelectList(sqlkit.RecordColumns, "", mysqlMicros)

// mysqlClaimColumns is the select list of the claim's locking reads: claimColumns as they
// are before the claim's UPDATE, followed by the database clock.
var mysqlClaimColumns = sqlkit.SelectList(sqlkit.ClaimColumns, "", mysqlMicros) + `, ` + mysqlMicros(`UTC_TIMESTAMP(6)`)

func mysqlTable(t dialect.Table) string { return sqlkit.QuoteIdent(t.Name(), '`') }

// mysqlDedupeTable is the table whose primary key holds the dedupe keys: <table>_dedupe.
func mysqlDedupeTable(t dialect.Table) string { return sqlkit.QuoteIdent(t.Name()+"_dedupe", '`') }

// mysqlInsertHeads and mysqlInsertGroups are, per insert shape (sqlkit.InsertShape), the INSERT
// from the column list to VALUES and one row of placeholders.
var mysqlInsertHeads, mysqlInsertGroups = func() (heads, groups [sqlkit.ShapeCount]string) {
	for s := range sqlkit.InsertShape(sqlkit.ShapeCount) {
		next := `UTC_TIMESTAMP(6)`
		if s&sqlkit.WithDelay != 0 {
			next = mysqlLater(`?`)
		}
		heads[s] = ` ` + s.ColumnList() + ` VALUES `
		groups[s] = s.RowGroup(next, `UTC_TIMESTAMP(6)`)
	}
	return heads, groups
}()

// Insert writes the rows in two steps when any carries a dedupe key. First it reserves the
// keys, in (namespace, topic, dedupe_key) order, in the <table>_dedupe table whose primary
// key they are; a key that is already there is skipped (ON DUPLICATE KEY UPDATE id = id,
// 0 affected rows). Then it inserts the outbox rows of the keys it reserved and of the rows
// without a key. See [MySQL] for why uniqueness lives in a primary key of its own table.
// The engine always passes a transaction (the caller's, or its own for EnqueueStandalone), so
// the two steps commit together. If the second step fails, the reservations of the first
// are removed before the error is returned, so a caller that commits anyway does not leave
// a key reserved for an event that was never written.
func (d Dialect) Insert(ctx context.Context, q dialect.DBTX, t dialect.Table, rows []dialect.Row) ([]bool, error) {
	inserted, err := d.insert(ctx, q, t, rows)
	return inserted, mysqlConflict(err)
}

func (d Dialect) insert(ctx context.Context, q dialect.DBTX, t dialect.Table, rows []dialect.Row) ([]bool, error) {
	inserted := make([]bool, len(rows))
	var keyed []int
	for i := range rows {
		if rows[i].DedupeKey == "" {
			inserted[i] = true
		} else {
			keyed = append(keyed, i)
		}
	}
	if len(keyed) > 0 {
		// Reserve in (stripe, key) order, the order in which the reservation locks stripes
		// and keys: producers enqueueing overlapping sets of keys then lock them in one
		// global order and cannot deadlock with each other.
		stripes := make(map[int]int, len(keyed))
		for _, i := range keyed {
			stripes[i] = mysqlStripe(&rows[i])
		}
		slices.SortStableFunc(keyed, func(i, j int) int {
			a, b := &rows[i], &rows[j]
			return cmp.Or(cmp.Compare(stripes[i], stripes[j]), strings.Compare(a.Namespace, b.Namespace),
				strings.Compare(a.Topic, b.Topic), strings.Compare(a.DedupeKey, b.DedupeKey))
		})
		for chunk := range slices.Chunk(keyed, mysqlRowsPerInsert) {
			if err := mysqlReserve(ctx, q, t, rows, chunk, stripes, inserted); err != nil {
				mysqlUndo(ctx, q, t, rows, keyed, inserted, nil)
				return nil, err
			}
		}
	}
	write := rows
	if len(keyed) > 0 {
		write = make([]dialect.Row, 0, len(rows))
		for i := range rows {
			if inserted[i] {
				write = append(write, rows[i])
			}
		}
	}
	for done := 0; done < len(write); {
		n := mysqlInsertChunk(write[done:])
		if err := mysqlWriteRows(ctx, q, t, write[done:done+n]); err != nil {
			mysqlUndo(ctx, q, t, rows, keyed, inserted, write[:done])
			return nil, err
		}
		done += n
	}
	return inserted, nil
}

// mysqlStripes is how many rows <table>_dedupe_lock holds (migration 3).
const mysqlStripes = 4096

// mysqlStripe is the lock stripe of a dedupe key: FNV-1a of its namespace, topic and key.
func mysqlStripe(r *dialect.Row) int {
	h := fnv.New32a()
	for _, s := range [...]string{r.Namespace, r.Topic, r.DedupeKey} {
		_, _ = h.Write([]byte(s))
		_, _ = h.Write([]byte{0})
	}
	return int(h.Sum32() % mysqlStripes)
}

// mysqlReserveStatement renders mysqlReserve's statement for rows[chunk]. One key, the
// common case, selects from the stripe row itself; several come from a derived table of
// binary-cast values joined to their stripes (the casts keep keys byte for byte, never
// compared through the connection's collation or a type guessed from the first row). The
// derived table's materialisation cost a sixth of a keyed enqueue, hence the short form.
func mysqlReserveStatement(t dialect.Table, rows []dialect.Row, chunk []int, stripes map[int]int) (string, []any) {
	dedupe := mysqlDedupeTable(t)
	lock := sqlkit.QuoteIdent(t.Name()+"_dedupe_lock", '`')
	odku := ` FOR UPDATE ON DUPLICATE KEY UPDATE id = ` + dedupe + `.id`
	head := `INSERT INTO ` + dedupe + ` (namespace, topic, dedupe_key, id) `
	vals := make([]any, 0, 5*len(chunk))
	if len(chunk) == 1 {
		r := &rows[chunk[0]]
		vals = append(vals, r.Namespace, r.Topic, r.DedupeKey, sqlkit.UUIDBytes(r.ID), stripes[chunk[0]])
		return head + `SELECT ?, ?, ?, ? FROM ` + lock + ` WHERE stripe = ?` + odku, vals
	}
	var b strings.Builder
	b.WriteString(head + `SELECT v.ns, v.topic, v.dk, v.id FROM (`)
	for j, i := range chunk {
		if j == 0 {
			b.WriteString(`SELECT CAST(? AS BINARY) AS ns, CAST(? AS BINARY) AS topic, CAST(? AS BINARY) AS dk,` +
				` CAST(? AS BINARY) AS id, CAST(? AS UNSIGNED) AS stripe`)
		} else {
			b.WriteString(` UNION ALL SELECT CAST(? AS BINARY), CAST(? AS BINARY), CAST(? AS BINARY), CAST(? AS BINARY), CAST(? AS UNSIGNED)`)
		}
		r := &rows[i]
		vals = append(vals, r.Namespace, r.Topic, r.DedupeKey, sqlkit.UUIDBytes(r.ID), stripes[i])
	}
	b.WriteString(`) AS v STRAIGHT_JOIN ` + lock + ` AS l ON l.stripe = v.stripe` + odku)
	return b.String(), vals
}

// mysqlReserve reserves the dedupe keys of rows[chunk] (in stripe order) and sets
// inserted[i] for those that were free, in one statement that locks each key's stripe in
// <table>_dedupe_lock and then inserts the key:
//
//	INSERT INTO <t>_dedupe (namespace, topic, dedupe_key, id)
//	SELECT ?, ?, ?, ? FROM <t>_dedupe_lock WHERE stripe = ?
//	FOR UPDATE ON DUPLICATE KEY UPDATE id = <t>_dedupe.id
//
// (several keys: a derived table of them joined to their stripes; mysqlReserveStatement).
// The join reads the keys first (STRAIGHT_JOIN) and finds each stripe by primary key, so it locks
// the stripe rows of these keys alone, record locks in v's order, each before its key is
// inserted: producers of one key queue on its stripe, a row that always exists, and reach
// the key one at a time. (Waiting on the key itself deadlocks when its winner rolls back;
// see [MySQL].) One statement, not a locking read and then the insert: that extra round
// trip cost a quarter of a keyed enqueue's throughput; this form costs about a tenth
// (BENCHMARKS.md).
//
// An inserted key counts one affected row and a skipped one zero, so a full count settles
// the common case; otherwise the keys are read back by primary key: a key is ours when it
// carries our id, another enqueue's when it carries another, and a key with no row at all
// means its stripe is missing from <table>_dedupe_lock (the join dropped it), which is
// reported, never taken for a duplicate.
func mysqlReserve(ctx context.Context, q dialect.DBTX, t dialect.Table, rows []dialect.Row, chunk []int, stripes map[int]int, inserted []bool) error {
	dedupe := mysqlDedupeTable(t)
	query, vals := mysqlReserveStatement(t, rows, chunk, stripes)
	res, err := q.ExecContext(ctx, query, vals...)
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == int64(len(chunk)) {
		for _, i := range chunk {
			inserted[i] = true
		}
		return nil
	}
	type key struct{ ns, topic, dk string }
	a := &dialect.Args{}
	var s strings.Builder
	s.WriteString(`SELECT namespace, topic, dedupe_key, id FROM ` + dedupe + ` WHERE `)
	for j, i := range chunk {
		if j > 0 {
			s.WriteString(` OR `)
		}
		r := &rows[i]
		s.WriteString(`(namespace = ` + a.Add(r.Namespace) + ` AND topic = ` + a.Add(r.Topic) + ` AND dedupe_key = ` + a.Add(r.DedupeKey) + `)`)
	}
	held := make(map[key]uuid.UUID, len(chunk))
	rs, err := q.QueryContext(ctx, s.String(), a.Values...)
	if err != nil {
		return err
	}
	for rs.Next() {
		var k key
		var id []byte
		if err := rs.Scan(&k.ns, &k.topic, &k.dk, &id); err != nil {
			_ = rs.Close()
			return err
		}
		held[k], _ = uuid.FromBytes(id)
	}
	if err := errors.Join(rs.Err(), rs.Close()); err != nil {
		return err
	}
	for _, i := range chunk {
		r := &rows[i]
		id, ok := held[key{r.Namespace, r.Topic, r.DedupeKey}]
		if !ok {
			return &dialect.CheckError{
				Problem: fmt.Sprintf("%s_dedupe_lock lacks the lock stripe %d of dedupe key %q", t.Name(), stripes[i], r.DedupeKey),
				Fix:     "run the MySQL migrations up to date (outbox migrate up, or migrations.Up)",
			}
		}
		inserted[i] = id == r.ID
	}
	return nil
}

// mysqlUndo removes what a failed Insert wrote before it failed: the outbox rows of the
// chunks that went in (written) and every dedupe key it reserved. A batch spans several
// statements past 1000 rows, and each failed statement undoes only itself; without this, a
// caller that commits after the error would keep part of the batch, or (worse) keys reserved
// for events that were never written, which would turn later enqueues of those keys into
// duplicates. It is best effort, like mysqlRelease.
func mysqlUndo(ctx context.Context, q dialect.DBTX, t dialect.Table, rows []dialect.Row, keyed []int, inserted []bool, written []dialect.Row) {
	for chunk := range slices.Chunk(written, mysqlRowsPerInsert) {
		a := &dialect.Args{}
		in := a.List(len(chunk), func(i int) any { return sqlkit.UUIDBytes(chunk[i].ID) })
		_, _ = q.ExecContext(context.WithoutCancel(ctx), `DELETE FROM `+mysqlTable(t)+` WHERE id IN `+in, a.Values...)
	}
	if len(keyed) > 0 {
		mysqlRelease(ctx, q, t, rows, keyed, inserted)
	}
}

// mysqlRelease removes the reservations this call made, after its outbox insert failed.
// It is best effort: the error that matters is the insert's, and a transaction whose
// connection broke is rolled back by the server anyway.
func mysqlRelease(ctx context.Context, q dialect.DBTX, t dialect.Table, rows []dialect.Row, keyed []int, inserted []bool) {
	// By primary key: the table has no index on id, and a scan would lock every key it
	// passed until the caller's transaction ends. The id check keeps other callers' keys.
	a := &dialect.Args{}
	var b strings.Builder
	b.WriteString(`DELETE FROM ` + mysqlDedupeTable(t) + ` WHERE `)
	first := true
	for _, i := range keyed {
		if !inserted[i] {
			continue
		}
		if !first {
			b.WriteString(` OR `)
		}
		first = false
		r := &rows[i]
		b.WriteString(`(namespace = ` + a.Add(r.Namespace) + ` AND topic = ` + a.Add(r.Topic) +
			` AND dedupe_key = ` + a.Add(r.DedupeKey) + ` AND id = ` + a.Add(sqlkit.UUIDBytes(r.ID)) + `)`)
	}
	if first {
		return
	}
	_, _ = q.ExecContext(context.WithoutCancel(ctx), b.String(), a.Values...)
}

// mysqlInsertChunk returns how many leading rows one INSERT takes: at most
// mysqlRowsPerInsert, and no more than mysqlBytesPerInsert of data unless it is one row.
func mysqlInsertChunk(rows []dialect.Row) int {
	size := 0
	for i := range rows {
		if i == mysqlRowsPerInsert {
			return i
		}
		r := &rows[i]
		size += 128 + len(r.Namespace) + len(r.Topic) + len(r.DedupeKey) + len(r.PartitionKey) + len(r.Payload)
		for k, v := range r.Headers {
			size += len(k) + len(v) + 6
		}
		if i > 0 && size > mysqlBytesPerInsert {
			return i
		}
	}
	return len(rows)
}

// mysqlInsertRows writes outbox rows whose keys, if any, are reserved: a plain INSERT, so
// every error surfaces.
func mysqlInsertRows(ctx context.Context, q dialect.DBTX, t dialect.Table, rows []dialect.Row) error {
	shape := sqlkit.ShapeOf(rows)
	vals := make([]any, 0, len(rows)*sqlkit.InsertColumnCount)
	for i := range rows {
		r := &rows[i]
		headers, err := r.Headers.Value()
		if err != nil {
			return err
		}
		vals = shape.RowValues(vals, r, headers, sqlkit.UUIDBytes, r.Payload)
		if shape&sqlkit.WithDelay != 0 {
			vals = append(vals, sqlkit.Micros(r.Delay))
		}
	}
	query := sqlkit.ValuesStatement(`INSERT INTO `+mysqlTable(t)+mysqlInsertHeads[shape], len(rows), mysqlInsertGroups[shape], "")
	_, err := q.ExecContext(ctx, query, vals...)
	return err
}

// The two eligibility predicates of a claim, one per status, each an equality on the
// first column of the index it reads: the claim index's (created_at, id) for expired leases
// and ordered claims, the due index's (next_attempt_at, id) for an unordered claim's
// pending rows, which then reads a range that ends at the first row not due yet.
const (
	mysqlExpired = `status = 'processing' AND locked_until < UTC_TIMESTAMP(6)`
	mysqlDue     = `status = 'pending' AND next_attempt_at <= UTC_TIMESTAMP(6)`
)

func (d Dialect) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]dialect.Record, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	recs, _, err := d.CompleteAndClaim(ctx, db, t, nil, p)
	return recs, err
}

// CompleteAndClaim implements [dialect.SettleClaimer]: Complete's statement runs first in the
// claim's transaction, so the claim sees the settled rows as they now are (an ordered
// claim sees the keys they released) and both commit at once. The settle locks only rows
// this worker holds, by primary key; the claim's locking reads skip locked rows and never
// wait, so the longer hold adds no lock wait to anyone's claim. A deadlock or lock wait
// timeout retries the whole transaction, settle included, as it does a claim.
func (d Dialect) CompleteAndClaim(ctx context.Context, db *sql.DB, t dialect.Table, outcomes []dialect.Outcome, p dialect.ClaimParams) ([]dialect.Record, []uuid.UUID, error) {
	type result struct {
		recs []dialect.Record
		lost []uuid.UUID
	}
	r, err := sqlkit.RetryLocked(ctx, mysqlRetryable, func() (result, error) {
		lost, recs, err := d.claim(ctx, db, t, outcomes, p)
		return result{recs, lost}, err
	})
	if err != nil {
		return nil, nil, mysqlConflict(err)
	}
	return r.recs, r.lost, nil
}

// claim runs one claim transaction, which settles outcomes first.
func (d Dialect) claim(ctx context.Context, db *sql.DB, t dialect.Table, outcomes []dialect.Outcome, p dialect.ClaimParams) (lost []uuid.UUID, _ []dialect.Record, _ error) {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, nil, err
	}
	// Whatever happens below, the transaction ends here. sql.Tx.Rollback takes no context,
	// so a cancelled caller cannot stop it; database/sql also rolls back by itself when
	// ctx ends before Commit, and a statement interrupted by ctx closes its connection,
	// which the server rolls back. No transaction outlives this call.
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	if len(outcomes) > 0 {
		if lost, err = d.Complete(ctx, tx, t, outcomes); err != nil {
			return nil, nil, err
		}
	}
	// With Continue, the runs after the keys the settle delivered come first, and the
	// search for heads (the window's walk, a head check per key, the key visit) runs only
	// when they leave the batch short.
	var (
		cont    []dialect.Record
		contNow int64
	)
	if len(outcomes) > 0 && p.Ordered && p.Runs && p.Continue && p.Namespace != "" {
		from, err := mysqlContinuable(ctx, tx, t, outcomes, lost)
		if err != nil {
			return nil, nil, err
		}
		if len(from)*mysqlContinueShare > p.Limit {
			// Each key's range read would bring a row or so, and the window's walk finds
			// as many heads among consecutive rows for less: continued, a backlog of many
			// keys with few rows each burned down markedly slower.
			from = nil
		}
		if cont, contNow, err = mysqlRunsAfter(ctx, tx, t, p, from, p.Limit); err != nil {
			return nil, nil, err
		}
	}
	recs, now, err := d.claimRest(ctx, tx, t, p, cont)
	if err != nil {
		return nil, nil, err
	}
	recs, now = append(cont, recs...), max(now, contNow)
	if len(recs) == 0 {
		if len(outcomes) == 0 {
			return nil, nil, nil // the deferred rollback ends the empty transaction
		}
		if err := tx.Commit(); err != nil {
			return nil, nil, err
		}
		committed = true
		return lost, nil, nil
	}

	until := now + sqlkit.Micros(p.Lease)
	a := &dialect.Args{}
	var b strings.Builder
	b.WriteString(`UPDATE ` + mysqlTable(t) + ` FORCE INDEX (PRIMARY) SET status = 'processing', attempts = attempts + 1, locked_by = ` + a.Add(p.WorkerID) +
		`, locked_until = ` + mysqlFromMicros(a.Add(until)) + `, lease_token = ` + a.Add(sqlkit.UUIDBytes(p.Token)) +
		`, updated_at = ` + mysqlFromMicros(a.Add(now)) +
		` WHERE id IN ` + a.List(len(recs), func(i int) any { return sqlkit.UUIDBytes(recs[i].ID) }))
	res, err := tx.ExecContext(ctx, b.String(), a.Values...)
	if err != nil {
		return nil, nil, err
	}
	// Every locked row changes (status or attempts), so the count is exact with or
	// without clientFoundRows.
	if n, err := res.RowsAffected(); err != nil {
		return nil, nil, err
	} else if n != int64(len(recs)) {
		return nil, nil, fmt.Errorf("claim updated %d of the %d rows it locked", n, len(recs))
	}
	if err := tx.Commit(); err != nil {
		return nil, nil, err
	}
	committed = true

	lockedUntil := time.UnixMicro(until).UTC()
	for i := range recs {
		recs[i].Attempts++
		recs[i].LockedUntil = lockedUntil
	}
	sqlkit.StampClaimed(recs, p)
	dialect.SortClaimed(recs)
	return lost, recs, nil
}

// claimRest is the claim of up to p.Limit rows after cont, the runs a continued claim took
// (none otherwise), on tx: expired leases, then due pending rows (heads, in an ordered
// claim) and their runs. It returns the records and the clock.
func (d Dialect) claimRest(ctx context.Context, tx *sql.Tx, t dialect.Table, p dialect.ClaimParams, cont []dialect.Record) ([]dialect.Record, int64, error) {
	p.Limit -= len(cont)
	if p.Limit <= 0 {
		return nil, 0, nil
	}
	recs, now, err := mysqlReclaim(ctx, tx, t, p)
	if err != nil {
		return nil, 0, err
	}
	if len(recs) < p.Limit {
		var (
			more []dialect.Record
			now2 int64
		)
		if p.Ordered {
			more, now2, err = mysqlClaimHeads(ctx, tx, t, p, p.Limit-len(recs), cont, d.visits)
		} else {
			a := &dialect.Args{}
			more, now2, err = mysqlLockRecords(ctx, tx, `SELECT `+mysqlClaimColumns+
				` FROM `+mysqlTable(t)+` FORCE INDEX (`+sqlkit.QuoteIdent(t.Index("due"), '`')+`)`+
				` WHERE `+mysqlDue+` AND attempts < `+a.Add(p.MaxAttempts)+sqlkit.ScopeSQL(a, p.Scope, "", sqlkit.UUIDBytes)+
				` ORDER BY next_attempt_at, id LIMIT `+a.Add(p.Limit-len(recs))+` FOR UPDATE SKIP LOCKED`, a.Values)
		}
		if err != nil {
			return nil, 0, err
		}
		recs, now = append(recs, more...), max(now, now2)
	}
	if p.Ordered && p.Runs && len(recs) < p.Limit {
		// The runs of the heads whose run was not taken yet (mysqlClaimHeads takes those of
		// the window's): a key with one row here.
		runs, now3, err := mysqlClaimRuns(ctx, tx, t, p, mysqlLoneKeys(recs), p.Limit-len(recs))
		if err != nil {
			return nil, 0, err
		}
		recs, now = append(recs, runs...), max(now, now3)
	}
	return recs, now, nil
}

// mysqlReclaim locks the rows of expired leases, oldest first, that the claim may take
// over. It finds them with a plain read of the claim index, which takes no lock, and only
// then locks them by primary key. A locking read through the claim index would lock the
// index entry of every row in flight (all processing rows, expired or not) before their
// primary key, the opposite order of the acks that settle them (primary key, then index
// entry), and deadlock with them; usually there is nothing expired and no lock at all.
func mysqlReclaim(ctx context.Context, tx *sql.Tx, t dialect.Table, p dialect.ClaimParams) ([]dialect.Record, int64, error) {
	return mysqlFindThenLock(ctx, tx, t, p, mysqlExpired, p.Limit)
}

// mysqlFindThenLock finds up to limit rows in scope matching pred (one of mysqlExpired and
// mysqlDue) with a plain read of the claim index in claim order (mysqlFind), then locks
// those that still match by primary key, FOR UPDATE SKIP LOCKED, and returns them with the
// clock.
func mysqlFindThenLock(ctx context.Context, tx *sql.Tx, t dialect.Table, p dialect.ClaimParams, pred string, limit int) ([]dialect.Record, int64, error) {
	ids, err := mysqlFind(ctx, tx, t, p, pred, limit, nil)
	if err != nil {
		return nil, 0, err
	}
	return mysqlLock(ctx, tx, t, p, pred, ids, 0)
}

// mysqlFind returns the ids of up to limit rows in scope matching pred, in claim order,
// read from the claim index without locking. bound, when not nil, renders one more term of
// the read.
func mysqlFind(ctx context.Context, tx *sql.Tx, t dialect.Table, p dialect.ClaimParams, pred string, limit int, bound func(a *dialect.Args) string) ([]uuid.UUID, error) {
	a := &dialect.Args{}
	where := pred + ` AND attempts < ` + a.Add(p.MaxAttempts) + sqlkit.ScopeSQL(a, p.Scope, "", sqlkit.UUIDBytes) + mysqlOrdered(t, p)
	if bound != nil {
		where += bound(a)
	}
	return dialect.QueryIDs(ctx, tx, `SELECT id FROM `+mysqlTable(t)+` FORCE INDEX (`+sqlkit.QuoteIdent(t.Index("claim"), '`')+`)`+
		` WHERE `+where+` ORDER BY created_at, id LIMIT `+a.Add(limit), a.Values...)
}

// mysqlLock locks the rows of ids that still match pred by primary key, FOR UPDATE SKIP
// LOCKED, and returns them with the clock. With limit > 0 it locks at most limit of them,
// the first by id: the read goes through the primary key in id order and stops there, so
// it locks no more.
func mysqlLock(ctx context.Context, tx *sql.Tx, t dialect.Table, p dialect.ClaimParams, pred string, ids []uuid.UUID, limit int) ([]dialect.Record, int64, error) {
	if len(ids) == 0 {
		return nil, 0, nil
	}
	tbl := mysqlTable(t)
	a := &dialect.Args{}
	var b strings.Builder
	b.WriteString(`SELECT ` + mysqlClaimColumns + ` FROM ` + tbl +
		` FORCE INDEX (PRIMARY) WHERE id IN ` + a.List(len(ids), func(i int) any { return sqlkit.UUIDBytes(ids[i]) }))
	// The predicate again: the plain read saw the last committed state, the locking read
	// sees the current one.
	b.WriteString(` AND ` + pred + ` AND attempts < ` + a.Add(p.MaxAttempts))
	if limit > 0 && limit < len(ids) {
		b.WriteString(` ORDER BY id LIMIT ` + a.Add(limit))
	}
	b.WriteString(` FOR UPDATE SKIP LOCKED`)
	return mysqlLockRecords(ctx, tx, b.String(), a.Values)
}

// mysqlLockRecords runs a locking read whose select list is mysqlClaimColumns, and returns
// the records and the clock in Unix microseconds (0 when no row matched).
func mysqlLockRecords(ctx context.Context, tx *sql.Tx, query string, vals []any) ([]dialect.Record, int64, error) {
	rows, err := tx.QueryContext(ctx, query, vals...)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var (
		recs []dialect.Record
		now  int64
	)
	for rows.Next() {
		r, err := sqlkit.ScanClaimed(mysqlNowScanner{rows, &now})
		if err != nil {
			return nil, 0, err
		}
		recs = append(recs, r)
	}
	return recs, now, rows.Err()
}

// mysqlNowScanner scans a record followed by one more column, the clock reading.
type mysqlNowScanner struct {
	rows *sql.Rows
	now  *int64
}

func (s mysqlNowScanner) Scan(dest ...any) error { return s.rows.Scan(append(dest, s.now)...) }

// mysqlRetryable reports whether err is a deadlock or a lock wait timeout, after which the
// claim transaction is gone (deadlock) or useless (timeout) and the claim can run again.
//
// The root package imports no driver, so it cannot use errors.As with *mysql.MySQLError.
// It looks instead, through the whole Unwrap chain, for an error struct with a field
// Number of type uint16, which is how go-sql-driver (and its forks) carry the server's
// error number; failing that, it matches "Error 1213" or "Error 1205" in the text, which is
// how go-sql-driver prints them, so an error flattened with %v is recognised too.
func mysqlRetryable(err error) bool {
	if n, ok := mysqlErrorNumber(err); ok {
		return n == mysqlErrDeadlock || n == mysqlErrLockWaitTimeout
	}
	msg := err.Error()
	return strings.Contains(msg, fmt.Sprintf("Error %d", mysqlErrDeadlock)) ||
		strings.Contains(msg, fmt.Sprintf("Error %d", mysqlErrLockWaitTimeout))
}

// mysqlErrorNumber finds a server error number in err or in an error it wraps.
func mysqlErrorNumber(err error) (uint16, bool) {
	if err == nil {
		return 0, false
	}
	v := reflect.ValueOf(err)
	for v.Kind() == reflect.Pointer && !v.IsNil() {
		v = v.Elem()
	}
	if v.Kind() == reflect.Struct {
		if f, ok := v.Type().FieldByName("Number"); ok && len(f.Index) == 1 && f.Type.Kind() == reflect.Uint16 {
			return uint16(v.Field(f.Index[0]).Uint()), true
		}
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return mysqlErrorNumber(u.Unwrap())
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if n, ok := mysqlErrorNumber(e); ok {
				return n, true
			}
		}
	}
	return 0, false
}

// mysqlExec runs a write, and runs it again after a deadlock or a lock wait timeout when q
// is a *sql.DB: in autocommit mode the server rolled back exactly that statement. On a
// caller's transaction (or a *sql.Conn, which may be in one) the error is returned, since
// a deadlock rolls back the whole transaction.
func mysqlExec(ctx context.Context, q dialect.DBTX, query string, args ...any) (sql.Result, error) {
	_, pool := q.(*sql.DB)
	res, err := sqlkit.RetryLocked(ctx, func(err error) bool { return pool && mysqlRetryable(err) }, func() (sql.Result, error) {
		return q.ExecContext(ctx, query, args...)
	})
	return res, mysqlConflict(err)
}

// mysqlConflict marks error 1213 with [dialect.ErrRetryTransaction]: the server rolled the
// whole transaction back (a deadlock, or a Galera certification conflict), so the caller
// tells it apart without knowing the driver. The message stays the driver's.
func mysqlConflict(err error) error {
	if err == nil {
		return nil
	}
	if n, ok := mysqlErrorNumber(err); ok && n != mysqlErrDeadlock {
		return err
	} else if !ok && !strings.Contains(err.Error(), fmt.Sprintf("Error %d", mysqlErrDeadlock)) {
		return err
	}
	return &conflictError{err}
}

// conflictError is a database error that matches [dialect.ErrRetryTransaction].
type conflictError struct{ err error }

func (e *conflictError) Error() string   { return e.err.Error() }
func (e *conflictError) Unwrap() []error { return []error{e.err, dialect.ErrRetryTransaction} }

// mysqlLeaseJoin writes the table references of Complete and Extend: a derived table u of
// (o_id, o_token, ...) rows, one per lease, joined to the outbox table t by primary key.
// The join order and the index are forced: on a small or freshly loaded table the
// optimizer may otherwise scan t and probe u, and an UPDATE that scans locks every row it
// reads (with gap locks at REPEATABLE READ), which deadlocks with claims and enqueues.
// Explicit casts give every column of u a type that does not depend on how a server types
// bare placeholders: ids stay 16 raw bytes whatever the connection's character set.
func mysqlLeaseJoin(b *strings.Builder, tbl string, n int, row func(i int, first bool) string) {
	b.WriteString(`(`)
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteString(` UNION ALL `)
		}
		b.WriteString(`SELECT ` + row(i, i == 0))
	}
	b.WriteString(`) u STRAIGHT_JOIN ` + tbl + ` t FORCE INDEX (PRIMARY) ON t.id = u.o_id AND t.lease_token = u.o_token`)
}

// mysqlAlias returns " AS name" for the first row of a derived table, "" for the others.
func mysqlAlias(first bool, name string) string {
	if first {
		return ` AS ` + name
	}
	return ``
}

func (Dialect) Complete(ctx context.Context, q dialect.DBTX, t dialect.Table, outcomes []dialect.Outcome) ([]uuid.UUID, error) {
	if len(outcomes) == 0 {
		return nil, nil
	}
	tbl := mysqlTable(t)
	a := &dialect.Args{}
	var b strings.Builder
	if token, ok := sqlkit.UniformAck(outcomes); ok {
		b.WriteString(`UPDATE ` + tbl + ` FORCE INDEX (PRIMARY) SET status = 'delivered', delivered_at = UTC_TIMESTAMP(6),` +
			` locked_by = NULL, locked_until = NULL, updated_at = UTC_TIMESTAMP(6)` +
			` WHERE id IN ` + a.List(len(outcomes), func(i int) any { return sqlkit.UUIDBytes(outcomes[i].ID) }) + ` AND lease_token = ` + a.Add(sqlkit.UUIDBytes(token)) +
			` AND status = 'processing'`)
		return mysqlSettled(ctx, q, t, outcomes, b.String(), a.Values)
	}
	if mysqlAllDelivered(outcomes) {
		// Deliveries under leases of their own (a log reader's, one per row): the ids
		// bound the primary key's range, the pairs check each row's token. The join on a
		// derived table of the outcomes costs MariaDB several times more per row.
		b.WriteString(`UPDATE ` + tbl + ` FORCE INDEX (PRIMARY) SET status = 'delivered', delivered_at = UTC_TIMESTAMP(6),` +
			` locked_by = NULL, locked_until = NULL, updated_at = UTC_TIMESTAMP(6)` +
			` WHERE id IN ` + a.List(len(outcomes), func(i int) any { return sqlkit.UUIDBytes(outcomes[i].ID) }) +
			` AND (id, lease_token) IN (`)
		for i, o := range outcomes {
			if i > 0 {
				b.WriteString(`, `)
			}
			b.WriteString(`(` + a.Add(sqlkit.UUIDBytes(o.ID)) + `, ` + a.Add(sqlkit.UUIDBytes(o.Token)) + `)`)
		}
		b.WriteString(`) AND status = 'processing'`)
		return mysqlSettled(ctx, q, t, outcomes, b.String(), a.Values)
	}
	b.WriteString(`UPDATE `)
	mysqlLeaseJoin(&b, tbl, len(outcomes), func(i int, first bool) string {
		o := &outcomes[i]
		refund := 0 // RefundAttempt: an outage gives the claim's attempt back
		if o.RefundAttempt {
			refund = 1
		}
		return `CAST(` + a.Add(sqlkit.UUIDBytes(o.ID)) + ` AS BINARY(16))` + mysqlAlias(first, "o_id") +
			`, CAST(` + a.Add(sqlkit.UUIDBytes(o.Token)) + ` AS BINARY(16))` + mysqlAlias(first, "o_token") +
			`, CAST(` + a.Add(string(o.Status)) + ` AS CHAR(10))` + mysqlAlias(first, "o_status") +
			`, CAST(` + a.Add(sqlkit.Micros(o.Delay)) + ` AS SIGNED)` + mysqlAlias(first, "o_delay") +
			`, CAST(` + a.Add(o.Error) + ` AS CHAR(1024))` + mysqlAlias(first, "o_error") +
			`, CAST(` + a.Add(refund) + ` AS SIGNED)` + mysqlAlias(first, "o_refund")
	})
	// In a multiple-table UPDATE the server may apply assignments in any order, so none
	// reads a column that another one writes.
	b.WriteString(` SET t.status = u.o_status,` +
		` t.next_attempt_at = CASE WHEN u.o_status = 'pending' THEN ` + mysqlLater(`u.o_delay`) + ` ELSE t.next_attempt_at END,` +
		` t.last_error = CASE WHEN u.o_status = 'delivered' THEN t.last_error ELSE u.o_error END,` +
		` t.delivered_at = CASE WHEN u.o_status = 'delivered' THEN UTC_TIMESTAMP(6) ELSE t.delivered_at END,` +
		` t.attempts = GREATEST(t.attempts - u.o_refund, 0),` +
		` t.locked_by = NULL, t.locked_until = NULL, t.updated_at = UTC_TIMESTAMP(6)` +
		` WHERE t.status = 'processing'`)
	return mysqlSettled(ctx, q, t, outcomes, b.String(), a.Values)
}

// mysqlAllDelivered reports whether every outcome is a delivery.
func mysqlAllDelivered(outcomes []dialect.Outcome) bool {
	for _, o := range outcomes {
		if o.Status != dialect.StatusDelivered {
			return false
		}
	}
	return true
}

// mysqlSettled runs a Complete statement and returns the leases it could not apply.
func mysqlSettled(ctx context.Context, q dialect.DBTX, t dialect.Table, outcomes []dialect.Outcome, query string, vals []any) ([]uuid.UUID, error) {
	res, err := mysqlExec(ctx, q, query, vals...)
	if err != nil {
		return nil, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return nil, err
	}
	leases := dialect.Leases(outcomes)
	switch {
	case n >= int64(len(outcomes)):
		return nil, nil
	case n == 0: // every applied row changes status, so 0 means none was applied
		return dialect.Lost(leases, nil), nil
	}
	// Some were applied. Without RETURNING, find them: a row this statement settled still
	// carries the outcome's token and is no longer processing. A row of the same claim
	// settled by an earlier call looks the same but for its updated_at, which is older than
	// this statement's (one UTC_TIMESTAMP(6) per statement), so of such rows only those
	// with the newest updated_at count as applied now.
	rows, err := mysqlLeaseRows(ctx, q, t, leases)
	if err != nil {
		return nil, err
	}
	var (
		set     = mysqlLeaseSet(leases)
		settled []mysqlLeaseRow
		newest  int64
	)
	for _, r := range rows {
		if r.status != dialect.StatusProcessing && r.heldUnder(set) {
			settled = append(settled, r)
			newest = max(newest, r.updated)
		}
	}
	var applied []uuid.UUID
	for _, r := range settled {
		if r.updated == newest {
			applied = append(applied, r.id)
		}
	}
	return dialect.Lost(leases, applied), nil
}

func (Dialect) Extend(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ExtendParams) ([]uuid.UUID, error) {
	if len(p.Leases) == 0 {
		return nil, nil
	}
	a := &dialect.Args{}
	var b strings.Builder
	b.WriteString(`UPDATE `)
	mysqlLeaseJoin(&b, mysqlTable(t), len(p.Leases), func(i int, first bool) string {
		l := &p.Leases[i]
		return `CAST(` + a.Add(sqlkit.UUIDBytes(l.ID)) + ` AS BINARY(16))` + mysqlAlias(first, "o_id") +
			`, CAST(` + a.Add(sqlkit.UUIDBytes(l.Token)) + ` AS BINARY(16))` + mysqlAlias(first, "o_token")
	})
	b.WriteString(` SET t.locked_until = ` + mysqlLater(a.Add(sqlkit.Micros(p.Lease))) + `, t.updated_at = UTC_TIMESTAMP(6)` +
		` WHERE t.status = 'processing'`)
	res, err := mysqlExec(ctx, q, b.String(), a.Values...)
	if err != nil {
		return nil, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return nil, err
	}
	if n >= int64(len(p.Leases)) {
		return nil, nil
	}
	// The rows still processing under their token are held (extended now, or unchanged
	// because nothing moved within the microsecond); the others were lost.
	rows, err := mysqlLeaseRows(ctx, q, t, p.Leases)
	if err != nil {
		return nil, err
	}
	set := mysqlLeaseSet(p.Leases)
	var held []uuid.UUID
	for _, r := range rows {
		if r.status == dialect.StatusProcessing && r.heldUnder(set) {
			held = append(held, r.id)
		}
	}
	return dialect.Lost(p.Leases, held), nil
}

// mysqlLeaseRow is the lease state of one row, read after a Complete or Extend that did
// not apply to every row it was given.
type mysqlLeaseRow struct {
	id, token uuid.UUID
	status    dialect.Status
	updated   int64
}

// mysqlLeaseSet indexes leases for mysqlLeaseRow.heldUnder.
func mysqlLeaseSet(leases []dialect.Lease) map[dialect.Lease]bool {
	set := make(map[dialect.Lease]bool, len(leases))
	for _, l := range leases {
		set[l] = true
	}
	return set
}

// heldUnder reports whether one of the leases names the row with its current token.
func (r mysqlLeaseRow) heldUnder(set map[dialect.Lease]bool) bool {
	return set[dialect.Lease{ID: r.id, Token: r.token}]
}

func mysqlLeaseRows(ctx context.Context, q dialect.DBTX, t dialect.Table, leases []dialect.Lease) ([]mysqlLeaseRow, error) {
	a := &dialect.Args{}
	var b strings.Builder
	b.WriteString(`SELECT id, lease_token, status, ` + mysqlMicros(`updated_at`) + ` FROM ` + mysqlTable(t) +
		` WHERE id IN ` + a.List(len(leases), func(i int) any { return sqlkit.UUIDBytes(leases[i].ID) }))
	rows, err := q.QueryContext(ctx, b.String(), a.Values...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []mysqlLeaseRow
	for rows.Next() {
		var (
			r     mysqlLeaseRow
			token uuid.NullUUID
		)
		if err := rows.Scan(&r.id, &token, &r.status, &r.updated); err != nil {
			return nil, err
		}
		r.token = token.UUID
		out = append(out, r)
	}
	return out, rows.Err()
}

// Bury finds candidates with a plain (non-locking) read in claim order through the claim
// index, so that retained rows are never scanned (with ExpiredOnly, status = 'processing'
// makes it the short walk of the rows in flight; the index leads with status), then
// updates them by primary key, checking the predicate again (without the scope, which the
// candidates already met and no write changes), and reads back by primary key only when
// some changed meanwhile. A single UPDATE ... ORDER BY ... LIMIT would lock every row it
// scans across the pending set (next-key locks at the default REPEATABLE READ, blocking
// enqueues), and finding its rows afterwards by lease_token, which has no index, would
// scan the table.
func (Dialect) Bury(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.BuryParams) ([]uuid.UUID, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	tbl := mysqlTable(t)
	a := &dialect.Args{}
	now := func() string { return `UTC_TIMESTAMP(6)` }
	ids, err := dialect.QueryIDs(ctx, q, `SELECT id FROM `+tbl+` FORCE INDEX (`+sqlkit.QuoteIdent(t.Index("claim"), '`')+`) WHERE `+
		sqlkit.BuryCandidates(a, p, now, sqlkit.UUIDBytes, "")+` ORDER BY created_at, id LIMIT `+a.Add(p.Limit), a.Values...)
	if err != nil || len(ids) == 0 {
		return nil, err
	}
	a = &dialect.Args{}
	var b strings.Builder
	b.WriteString(`UPDATE ` + tbl + ` FORCE INDEX (PRIMARY) SET status = 'dead', last_error = ` + a.Add(p.Reason) +
		`, locked_by = NULL, locked_until = NULL, lease_token = ` + a.Add(sqlkit.UUIDBytes(p.Token)) +
		`, updated_at = UTC_TIMESTAMP(6) WHERE id IN `)
	inList := func(a *dialect.Args) string {
		return a.List(len(ids), func(i int) any { return sqlkit.UUIDBytes(ids[i]) })
	}
	b.WriteString(inList(a) + ` AND ` + sqlkit.BuryCandidates(a, dialect.BuryParams{MaxAttempts: p.MaxAttempts, ExpiredOnly: p.ExpiredOnly}, now, sqlkit.UUIDBytes, ""))
	res, err := mysqlExec(ctx, q, b.String(), a.Values...)
	if err != nil {
		return nil, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return nil, err
	}
	if n == int64(len(ids)) {
		return ids, nil
	}
	a = &dialect.Args{}
	b.Reset()
	b.WriteString(`SELECT id FROM ` + tbl + ` WHERE id IN ` + inList(a) + ` AND lease_token = ` + a.Add(sqlkit.UUIDBytes(p.Token)) + ` ORDER BY created_at, id`)
	return dialect.QueryIDs(ctx, q, b.String(), a.Values...)
}

func (Dialect) Get(ctx context.Context, q dialect.DBTX, t dialect.Table, id uuid.UUID) (dialect.Record, error) {
	return sqlkit.GetRecord(q.QueryRowContext(ctx, `SELECT `+mysqlColumns+` FROM `+mysqlTable(t)+` WHERE id = ?`, sqlkit.UUIDBytes(id)))
}
