// Package postgres is the built-in dialect for PostgreSQL, behind outbox.Postgres: its
// SQL, its optional abilities (package dialect) and what it knows of the server and its
// drivers. It imports package dialect and the shared SQL helpers of package sqlkit, never
// the engine (package outbox), exactly as a dialect written outside the module does.
package postgres

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"sync"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// New returns the dialect for PostgreSQL. outbox.Postgres is the same and documents it for users.
func New() *Dialect { return &Dialect{} }

// The abilities the dialect has, checked at compile time.
var (
	_ dialect.Dialect        = (*Dialect)(nil)
	_ dialect.Checker        = (*Dialect)(nil)
	_ dialect.Admin          = (*Dialect)(nil)
	_ dialect.Notifier       = (*Dialect)(nil)
	_ dialect.OrderedClaimer = (*Dialect)(nil)
	_ dialect.SettleClaimer  = (*Dialect)(nil)
	_ sqlkit.Schemer         = (*Dialect)(nil)
	_ sqlkit.Renderer        = (*Dialect)(nil)
)

// Dialect keeps the statements that do not depend on call arguments rendered
// once per table name. Claim and Bury depend on the scope and are rendered per call.
//
// Batch statements bind Go slices ([]string, []*string, [][]byte, []int64) as PostgreSQL
// arrays. The id and token arrays of Complete and Extend bind as one array literal string
// (pgUUIDArray).
//
// Claim is one statement, run on the *sql.DB outside any caller transaction, so it is its
// own short transaction: the locking read of pgDue (the rows that can be claimed now, in the
// order they became so, through the due index), then
//
//	UPDATE "outbox_events" AS t SET status = 'processing', attempts = t.attempts + 1,
//	    locked_by = $3,
//	    locked_until = GREATEST(now(), t.updated_at + interval '1 microsecond') + $4::bigint * interval '1 microsecond',
//	    lease_token = $5, updated_at = GREATEST(now(), t.updated_at + interval '1 microsecond')
//	WHERE t.id = ANY(ARRAY(SELECT id FROM c))
//	RETURNING t.id, t.namespace, ... (every column)
//
// FOR UPDATE SKIP LOCKED lets concurrent claimers pass over each other's candidates
// instead of queueing behind them, and the UPDATE commits the lease before the locks go.
// MATERIALIZED (PostgreSQL 12) makes the locking subquery run exactly once, whatever join
// the planner picks. An ordered claim walks the partial claim index ON (created_at, id)
// WHERE status IN ('pending', 'processing') instead (ordered.go), which its leading
// status IN (...) term lets the planner use. Bury locks its candidates the same way.
//
// Complete (ack and nack) is one statement for the whole batch:
//
//	UPDATE "outbox_events" AS t SET status = u.status,
//	    next_attempt_at = CASE WHEN u.status = 'pending'
//	        THEN now() + u.delay_us * interval '1 microsecond' ELSE t.next_attempt_at END,
//	    last_error = CASE WHEN u.status = 'delivered' THEN t.last_error ELSE u.error END,
//	    delivered_at = CASE WHEN u.status = 'delivered' THEN now() ELSE t.delivered_at END,
//	    attempts = greatest(t.attempts - u.refund, 0),
//	    locked_by = NULL, locked_until = NULL, updated_at = now()
//	FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bigint[], $5::text[], $6::integer[])
//	    AS u(id, token, status, delay_us, error, refund)
//	WHERE t.id = ANY(ARRAY(SELECT unnest($1::uuid[]))) AND t.id = u.id AND t.lease_token = u.token
//	  AND CASE t.status WHEN 'processing' THEN true END
//	RETURNING t.id
//
// refund is 1 for an outcome with RefundAttempt (an outage gives back the claim's attempt)
// and 0 otherwise. The ids it does not return lost their lease. Extend has the same shape.
//
// Every time is the database's now() (the transaction's start time): the client never
// binds a time, only durations as whole microseconds, so workers on hosts with skewed
// clocks still agree on leases and schedules. Enqueue inside a long business transaction
// therefore stamps created_at and next_attempt_at with that transaction's start.
//
// Insert writes one row with INSERT ... VALUES and a batch with one INSERT ... SELECT
// FROM unnest(...) per 1000 rows (or 32 MiB of payload), one array per column whatever
// the batch size. Both bind only the optional columns some row sets (sqlkit.InsertShape); both
// statements are rendered once per table for every such shape. With dedupe keys they end
// in ON CONFLICT (namespace, topic, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING: a
// duplicate is skipped, never raised as a unique violation, which would abort the caller's
// transaction, and a batch reads the inserted ids back with RETURNING id.
//
// payload and headers are json, not jsonb, so the bytes consumers receive are the bytes
// enqueued, as the payload hash requires. Create the table with the migrations package.
type Dialect struct {
	stmts sync.Map // dialect.Table → *pgStatements
}

type pgStatements struct {
	complete, ack, extend, get string
	// insertOne and insertMany are rendered for every insert shape (sqlkit.InsertShape);
	// the leased ones for a chunk in which some row carries dialect.Row.Lease.
	insertOne, insertMany             [sqlkit.ShapeCount]string
	insertOneLeased, insertManyLeased [sqlkit.ShapeCount]string
}

// Batch insert bounds: rows per statement, and payload plus headers bytes per statement
// (PostgreSQL refuses a bound array over 1 GiB, and huge ones make poor neighbours).
const (
	pgRowsPerInsert  = 1000
	pgBytesPerInsert = 32 << 20
)

// pgOnConflict names the partial dedupe index, so rows without a key never conflict.
const pgOnConflict = ` ON CONFLICT (namespace, topic, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING`

// pgMicros turns a bound number of microseconds into an interval: durations are passed
// as integers so the client never chooses the interval's text form.
func pgMicros(expr string) string { return expr + ` * interval '1 microsecond'` }

// renderPgStatements renders the statements of table t.
//
// complete and extend join their outcomes (unnest of the arrays) to the table, and find the
// rows by id = ANY(ARRAY(SELECT unnest($1))), one probe of the primary key per outcome, as a
// claim finds its rows. All three test the status in a CASE, which implies no
// partial index's predicate: with status = 'processing', on statistics taken before a
// burst the planner read the whole claim index into the primary key's bitmap, and a log
// reader settling 300 rows behind thousands in flight took 60 ms a settle and fell behind
// for good (TestPostgresSettleByID). Joined on t.id = u.id alone, the planner read every row still
// processing (a scan of the table, or of the claim index) into a hash join: with two claim
// loops at batch 500, a settle of 1,000 outcomes so planned took 350-400 ms where the
// probes take a few, and held the other loop's settle waiting behind it.
func renderPgStatements(t dialect.Table) *pgStatements {
	tbl := pgTable(t)
	st := &pgStatements{
		ack: `UPDATE ` + tbl + ` SET status = 'delivered', delivered_at = now(), locked_by = NULL, locked_until = NULL,` +
			` updated_at = now() WHERE id = ANY($1::uuid[]) AND lease_token = $2::uuid AND CASE status WHEN 'processing' THEN true END RETURNING id`,
		complete: `UPDATE ` + tbl + ` AS t SET status = u.status,` +
			` next_attempt_at = CASE WHEN u.status = 'pending' THEN now() + ` + pgMicros(`u.delay_us`) + ` ELSE t.next_attempt_at END,` +
			` last_error = CASE WHEN u.status = 'delivered' THEN t.last_error ELSE u.error END,` +
			` delivered_at = CASE WHEN u.status = 'delivered' THEN now() ELSE t.delivered_at END,` +
			` attempts = greatest(t.attempts - u.refund, 0),` +
			` locked_by = NULL, locked_until = NULL, updated_at = now()` +
			` FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bigint[], $5::text[], $6::integer[])` +
			` AS u(id, token, status, delay_us, error, refund)` +
			` WHERE t.id = ANY(ARRAY(SELECT unnest($1::uuid[]))) AND t.id = u.id AND t.lease_token = u.token AND CASE t.status WHEN 'processing' THEN true END RETURNING t.id`,
		extend: `UPDATE ` + tbl + ` AS t SET locked_until = now() + ` + pgMicros(`$3::bigint`) + `, updated_at = now()` +
			` FROM unnest($1::uuid[], $2::uuid[]) AS u(id, token)` +
			` WHERE t.id = ANY(ARRAY(SELECT unnest($1::uuid[]))) AND t.id = u.id AND t.lease_token = u.token AND CASE t.status WHEN 'processing' THEN true END RETURNING t.id`,
		get: `SELECT ` + sqlkit.SelectList(sqlkit.RecordColumns, "", nil) + ` FROM ` + tbl + ` WHERE id = $1`,
	}
	for s := range sqlkit.InsertShape(sqlkit.ShapeCount) {
		st.insertOne[s], st.insertMany[s] = renderPgInsert(tbl, s, false)
		st.insertOneLeased[s], st.insertManyLeased[s] = renderPgInsert(tbl, s, true)
	}
	return st
}

// renderPgInsert renders the one-row and the batch INSERT of shape s. With leased, they
// also bind each row's lease (dialect.Row.Lease): the one-row form's row has one, and in
// the batch form a row whose lease_us is NULL is written pending, as without.
func renderPgInsert(tbl string, s sqlkit.InsertShape, leased bool) (one, many string) {
	cols := s.Columns()
	next, delay := `now()`, `now() + `+pgMicros(`u.delay_us`)
	var values, selects, arrays, names strings.Builder
	for i, c := range cols {
		values.WriteString(`$` + strconv.Itoa(i+1) + `, `)
		selects.WriteString(`u.` + c.Name + `, `)
		if i > 0 {
			arrays.WriteString(`, `)
			names.WriteString(`, `)
		}
		arrays.WriteString(`$` + strconv.Itoa(i+1) + `::` + c.PGType + `[]`)
		names.WriteString(c.Name)
	}
	if s&sqlkit.WithDelay != 0 {
		n := `$` + strconv.Itoa(len(cols)+1)
		next = `now() + ` + pgMicros(n+`::bigint`)
		arrays.WriteString(`, ` + n + `::bigint[]`)
		names.WriteString(`, delay_us`)
	} else {
		delay = next
	}
	conflict := ""
	if s&sqlkit.WithDedupe != 0 {
		conflict = pgOnConflict
	}
	head := `INSERT INTO ` + tbl + ` ` + s.ColumnList()
	if !leased {
		one = head + ` VALUES (` + values.String() + `'pending', 0, ` + next + `, now(), now())` + conflict
		many = head + ` SELECT ` + selects.String() + `'pending', 0, ` + delay + `, now(), now()` +
			` FROM unnest(` + arrays.String() + `) AS u(` + names.String() + `)` + conflict
	} else {
		// The lease's three values follow the shape's (and the delay's) in bind order.
		n := len(cols) + 1
		if s&sqlkit.WithDelay != 0 {
			n++
		}
		p := func(i int) string { return `$` + strconv.Itoa(n+i) }
		head = strings.TrimSuffix(head, `)`) + `, locked_by, lease_token, locked_until)`
		one = head + ` VALUES (` + values.String() + `'processing', 1, ` + next + `, now(), now(), ` +
			p(0) + `::text, ` + p(1) + `::uuid, now() + ` + pgMicros(p(2)+`::bigint`) + `)` + conflict
		many = head + ` SELECT ` + selects.String() +
			`CASE WHEN u.lease_us IS NULL THEN 'pending' ELSE 'processing' END, CASE WHEN u.lease_us IS NULL THEN 0 ELSE 1 END, ` +
			delay + `, now(), now(), u.locked_by, u.lease_token, now() + ` + pgMicros(`u.lease_us`) +
			` FROM unnest(` + arrays.String() + `, ` + p(0) + `::text[], ` + p(1) + `::uuid[], ` + p(2) + `::bigint[])` +
			` AS u(` + names.String() + `, locked_by, lease_token, lease_us)` + conflict
	}
	if conflict != "" {
		many += ` RETURNING id` // which rows went in: the others were duplicates
	}
	return one, many
}

func (d *Dialect) statements(t dialect.Table) *pgStatements {
	if s, ok := d.stmts.Load(t); ok {
		return s.(*pgStatements)
	}
	s, _ := d.stmts.LoadOrStore(t, renderPgStatements(t))
	return s.(*pgStatements)
}

// pgUUID binds a UUID as its text form, which every PostgreSQL driver sends as it is,
// and uuid.Nil as NULL.
func pgUUID(id uuid.UUID) any {
	if id == uuid.Nil {
		return nil
	}
	return id.String()
}

// pgUUIDArray renders n UUIDs as one PostgreSQL array literal, {id,id,...}, bound for a
// $n::uuid[] parameter. pgx sends a string as text in every query execution mode. A
// []string costs more: pgx first tries the binary uuid[] encoding, fails, formats an error
// out of the whole slice and then sends text, a quarter of the ack's client CPU; [][16]byte
// is cheaper still but has no encoding under the simple protocol. With 100 ids: 150-165
// µs per round trip against 254-259 µs for []string (BENCHMARKS.md).
func pgUUIDArray(n int, id func(i int) uuid.UUID) string {
	b := make([]byte, 0, n*37+2)
	b = append(b, '{')
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendUUID(b, id(i))
	}
	return string(append(b, '}'))
}

// appendUUID appends id in its canonical text form, as uuid.UUID.String writes it.
func appendUUID(b []byte, id uuid.UUID) []byte {
	var buf [36]byte
	hex.Encode(buf[0:8], id[0:4])
	buf[8] = '-'
	hex.Encode(buf[9:13], id[4:6])
	buf[13] = '-'
	hex.Encode(buf[14:18], id[6:8])
	buf[18] = '-'
	hex.Encode(buf[19:23], id[8:10])
	buf[23] = '-'
	hex.Encode(buf[24:], id[10:])
	return append(b, buf[:]...)
}

// pgNullStr is nullStr for []*string array elements.
func pgNullStr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (*Dialect) Name() string { return "postgres" }

// Insert runs the statements of RenderInsert on q: one way an insert is built, whether
// the engine runs it on a database/sql transaction or on a pgx one (package pgxv5).
func (d *Dialect) Insert(ctx context.Context, q dialect.DBTX, t dialect.Table, rows []dialect.Row) ([]bool, error) {
	stmts, err := d.RenderInsert(t, rows)
	if err != nil {
		return nil, err
	}
	return sqlkit.RunInsert(ctx, sqlkit.DBTXRunner(q), stmts, rows)
}

// RenderInsert implements [sqlkit.Renderer]: one INSERT ... VALUES for a single row, one
// INSERT ... SELECT FROM unnest per chunk of a batch (pgChunkLen).
func (d *Dialect) RenderInsert(t dialect.Table, rows []dialect.Row) ([]sqlkit.InsertStatement, error) {
	st := d.statements(t)
	stmts := make([]sqlkit.InsertStatement, 0, 1)
	for len(rows) > 0 {
		chunk := rows[:pgChunkLen(rows)]
		rows = rows[len(chunk):]
		shape := sqlkit.ShapeOf(chunk)
		leased := pgLeased(chunk)
		one, many := st.insertOne[shape], st.insertMany[shape]
		if leased {
			one, many = st.insertOneLeased[shape], st.insertManyLeased[shape]
		}
		var (
			is  sqlkit.InsertStatement
			err error
		)
		if len(chunk) == 1 {
			is, err = pgInsertOne(one, shape, leased, &chunk[0])
		} else {
			is, err = pgInsertMany(many, shape, leased, chunk)
		}
		if err != nil {
			return nil, err
		}
		stmts = append(stmts, is)
	}
	return stmts, nil
}

// pgChunkLen returns how many of rows go into the next statement: at least one, at most
// pgRowsPerInsert, and no more than pgBytesPerInsert of payload and headers unless the
// first row alone is bigger.
func pgChunkLen(rows []dialect.Row) int {
	size := 0
	for i := range rows {
		if i == pgRowsPerInsert {
			return i
		}
		size += len(rows[i].Payload)
		for k, v := range rows[i].Headers {
			size += len(k) + len(v)
		}
		if i > 0 && size > pgBytesPerInsert {
			return i
		}
	}
	return len(rows)
}

// pgLeased reports whether some row of rows is inserted leased (dialect.Row.Lease).
func pgLeased(rows []dialect.Row) bool {
	for i := range rows {
		if rows[i].Lease.Duration > 0 {
			return true
		}
	}
	return false
}

// InsertsLeased implements sqlkit.LeasedInserter.
func (*Dialect) InsertsLeased() bool { return true }

func pgInsertOne(query string, shape sqlkit.InsertShape, leased bool, r *dialect.Row) (sqlkit.InsertStatement, error) {
	headers, err := r.Headers.Value()
	if err != nil {
		return sqlkit.InsertStatement{}, err
	}
	// The payload is bound as a string, not []byte: in pgx's simple protocol mode a
	// []byte becomes a bytea literal, which a json column would not take as JSON.
	vals := shape.RowValues(make([]any, 0, 10), r, headers, pgUUID, string(r.Payload))
	if shape&sqlkit.WithDelay != 0 {
		vals = append(vals, sqlkit.Micros(r.Delay))
	}
	if leased {
		vals = append(vals, r.Lease.WorkerID, r.Lease.Token.String(), sqlkit.Micros(r.Lease.Duration))
	}
	result := sqlkit.InsertedAll
	if r.DedupeKey != "" {
		result = sqlkit.InsertedIfAffected
	}
	return sqlkit.InsertStatement{Statement: sqlkit.Statement{Query: query, Args: vals}, Rows: 1, Result: result}, nil
}

// pgInsertMany binds each column of the shape as one array. unnest returns the elements in
// order, so of two rows with one dedupe key in a batch the first goes in, as with VALUES
// lists; the report comes from RETURNING either way, so it is always what the database did.
func pgInsertMany(query string, shape sqlkit.InsertShape, leased bool, rows []dialect.Row) (sqlkit.InsertStatement, error) {
	n := len(rows)
	ids, namespaces, topics, payloads := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	hashes := make([][]byte, n)
	// Arrays of the columns outside the shape stay nil and are not bound.
	optional := func(bit sqlkit.InsertShape) []*string {
		if shape&bit == 0 {
			return nil
		}
		return make([]*string, n)
	}
	tenants, dedupes, pkeys, headers := optional(sqlkit.WithTenant), optional(sqlkit.WithDedupe), optional(sqlkit.WithPartition), optional(sqlkit.WithHeaders)
	var delays []int64
	if shape&sqlkit.WithDelay != 0 {
		delays = make([]int64, n)
	}
	for i := range rows {
		r := &rows[i]
		ids[i], namespaces[i], topics[i], payloads[i], hashes[i] = r.ID.String(), r.Namespace, r.Topic, string(r.Payload), r.PayloadHash
		if tenants != nil && r.TenantID != uuid.Nil {
			s := r.TenantID.String()
			tenants[i] = &s
		}
		if dedupes != nil {
			dedupes[i] = pgNullStr(r.DedupeKey)
		}
		if pkeys != nil {
			pkeys[i] = pgNullStr(r.PartitionKey)
		}
		if headers != nil {
			h, err := r.Headers.Value()
			if err != nil {
				return sqlkit.InsertStatement{}, err
			}
			if s, ok := h.(string); ok {
				headers[i] = &s
			}
		}
		if delays != nil {
			delays[i] = sqlkit.Micros(r.Delay)
		}
	}
	// In bind order (insertColumns), the optional arrays only when the shape has them.
	vals := []any{ids, namespaces, topics}
	for _, col := range []struct {
		bit sqlkit.InsertShape
		v   []*string
	}{{sqlkit.WithTenant, tenants}, {sqlkit.WithDedupe, dedupes}, {sqlkit.WithPartition, pkeys}, {sqlkit.WithHeaders, headers}} {
		if shape&col.bit != 0 {
			vals = append(vals, col.v)
		}
	}
	vals = append(vals, payloads, hashes)
	if delays != nil {
		vals = append(vals, delays)
	}
	if leased {
		// A row without a lease binds NULLs, which the statement writes as pending.
		workers, tokens, leases := make([]*string, n), make([]*string, n), make([]*int64, n)
		for i := range rows {
			l := rows[i].Lease
			if l.Duration <= 0 {
				continue
			}
			w, tok, us := l.WorkerID, l.Token.String(), sqlkit.Micros(l.Duration)
			workers[i], tokens[i], leases[i] = &w, &tok, &us
		}
		vals = append(vals, workers, tokens, leases)
	}
	is := sqlkit.InsertStatement{Statement: sqlkit.Statement{Query: query, Args: vals}, Rows: n}
	if shape&sqlkit.WithDedupe != 0 {
		is.Result = sqlkit.InsertedReturned // the statement ends in RETURNING id
	}
	return is, nil
}

// pgEligible renders the predicate of an ordered claim's candidates, which walk the claim
// index in creation order. The leading status IN (...) term implies the partial claim
// index's WHERE clause, which is what lets the planner use the index; the other terms are
// inside a scalar subquery, which the planner cannot estimate, for the reason pgDue gives:
// estimated, they made it read and sort the whole backlog on every claim of a table never
// analyzed (TestPostgresHotKeyClaimBounded).
func pgEligible(a *dialect.Args, p dialect.ClaimParams) string {
	return `status IN ('pending', 'processing') AND (SELECT ((status = 'pending' AND next_attempt_at <= now())` +
		` OR (status = 'processing' AND locked_until < now())) AND attempts < ` + a.Add(p.MaxAttempts) + `::bigint` +
		sqlkit.ScopeSQL(a, p.Scope, "", pgUUID) + `)`
}

// pgEligibleByID is pgEligible for a read that finds its rows by id: the status term is a
// CASE, which implies no partial index's predicate, so the rows are looked up by primary
// key. With pgEligible's status IN (...) the planner may read the claim index whole for
// the ids (id is its second column), which with bitmap scans off, as a claim with runs has
// them, it did: 16 ms a claim of 1,000 keys' heads against 5.
func pgEligibleByID(a *dialect.Args, p dialect.ClaimParams) string {
	return `CASE status WHEN 'pending' THEN next_attempt_at <= now() WHEN 'processing' THEN locked_until < now() END AND (SELECT attempts < ` +
		a.Add(p.MaxAttempts) + `::bigint` + sqlkit.ScopeSQL(a, p.Scope, "", pgUUID) + `)`
}

func (d *Dialect) claimRows(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]dialect.Record, error) {
	if p.Ordered && p.Runs {
		// The heads and their runs commit together (pgClaimRuns).
		return pgRetryDeadlock(ctx, func() (recs []dialect.Record, err error) {
			err = sqlkit.InTx(ctx, db, nil, func(tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, `SET LOCAL enable_bitmapscan = off`); err != nil {
					return err
				}
				recs, err = pgClaim(ctx, tx, t, p)
				return err
			})
			return recs, err
		})
	}
	return pgRetryDeadlock(ctx, func() ([]dialect.Record, error) { return pgClaim(ctx, db, t, p) })
}

// pgRetryDeadlock runs fn, a claim that is one statement on the pool (its own transaction),
// again after PostgreSQL chose it as a deadlock's victim (sqlkit.RetryLocked), as a MySQL claim
// runs again. FOR UPDATE SKIP LOCKED skips a locked row, but a row that another statement
// updated is locked in its newest version, and that lock waits ("while locking updated
// version of tuple"): two settle-and-claims of publishers that retry each other's rows met
// that way in a loaded test run (SQLSTATE 40P01). The victim's statement did nothing, so
// running it again is safe.
func pgRetryDeadlock[T any](ctx context.Context, fn func() (T, error)) (T, error) {
	return sqlkit.RetryLocked(ctx, pgDeadlock, fn)
}

// pgDeadlock reports whether err, or an error it wraps, is a PostgreSQL deadlock (SQLSTATE
// 40P01). The root package imports no driver: pgx's and lib/pq's errors both have a
// SQLState method.
func pgDeadlock(err error) bool {
	var e interface{ SQLState() string }
	return errors.As(err, &e) && e.SQLState() == "40P01"
}

// pgClaim claims on q: a *sql.DB (the statement is its own transaction) or a transaction;
// with runs (p.Runs), a transaction.
func pgClaim(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ClaimParams) ([]dialect.Record, error) {
	if p.Ordered && p.Namespace != "" {
		return pgClaimOrdered(ctx, q, t, p)
	}
	tbl := pgTable(t)
	a := &dialect.Args{Numbered: true}
	if !p.Ordered {
		return pgLease(ctx, q, t, p, a, pgDue(tbl, a, p, ""))
	}
	recs, err := pgLease(ctx, q, t, p, a, `WITH c AS MATERIALIZED (SELECT id FROM `+tbl+` WHERE `+pgEligible(a, p)+pgOrdered(tbl, p)+
		` ORDER BY created_at, id LIMIT `+a.Add(p.Limit)+`::bigint FOR UPDATE SKIP LOCKED)`)
	return pgWithRuns(ctx, q, t, p, recs, err)
}

// pgDueAt is when a live row can next be claimed: a pending row when it falls due, a row in
// flight when its lease runs out; NULL for the others. The due index is on (pgDueAt, id),
// partial on pgDueAt IS NOT NULL, and an unordered claim repeats the expression exactly.
const pgDueAt = `(CASE status WHEN 'pending' THEN next_attempt_at WHEN 'processing' THEN locked_until END)`

// pgDue renders the WITH clause of an unordered claim, whose query c returns the locked ids:
// the rows that can be claimed now, in the order they became so, one range of the due index
// read in exactly its order, which stops after the rows it returns:
//
//	WITH c AS MATERIALIZED (SELECT id FROM "outbox_events"
//	    WHERE (CASE status WHEN 'pending' THEN next_attempt_at
//	                       WHEN 'processing' THEN locked_until END) <= now()
//	      AND (SELECT attempts < $1::bigint [AND namespace = $n] [AND topic IN (...)] [AND tenant_id = $n])
//	    ORDER BY (CASE ... END), id LIMIT $2::bigint FOR UPDATE SKIP LOCKED)
//
// Rows delayed for later, waiting for a retry, or in flight under a live lease lie past the
// range's end and are never read, however many there are. The other terms are inside a
// scalar subquery, which the planner cannot estimate and takes to keep half the rows: on a
// table never analyzed (or analyzed while nearly empty) it estimated each scope term to keep
// almost nothing, expected the LIMIT to need every due row, and read and sorted them all
// (a bitmap scan of the due index, or a scan of the table); with only the due range to
// estimate, the walk of the index in order is its one good plan, whatever the statistics
// (TestPostgresDueClaimPlan). exclude is one more term ("" for none).
func pgDue(tbl string, a *dialect.Args, p dialect.ClaimParams, exclude string) string {
	return `WITH c AS MATERIALIZED (SELECT id FROM ` + tbl + ` WHERE ` + pgDueAt + ` <= now()` +
		` AND (SELECT attempts < ` + a.Add(p.MaxAttempts) + `::bigint` + sqlkit.ScopeSQL(a, p.Scope, "", pgUUID) + `)` + exclude +
		` ORDER BY ` + pgDueAt + `, id LIMIT ` + a.Add(p.Limit) + `::bigint FOR UPDATE SKIP LOCKED)`
}

// pgLease runs a claim: with, a WITH clause whose last query c returns the locked ids
// (its arguments already in a), followed by the UPDATE that leases them.
func pgLease(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ClaimParams, a *dialect.Args, with string) ([]dialect.Record, error) {
	return sqlkit.QueryClaimed(ctx, q, p, with+pgLeaseUpdate(pgTable(t), a, p), a.Values...)
}

// pgLeaseUpdate renders the UPDATE that leases the rows of c and returns claimColumns.
//
// It finds them as id = ANY(ARRAY(SELECT id FROM c)), one probe of the primary key per
// row, whatever the table's size. Joined as FROM c WHERE t.id = c.id, the planner read a
// table of a few thousand pages whole into a hash join (a sequential scan of 20 000 rows
// for 100 ids: 9-19 ms against 2 ms, EXPLAIN ANALYZE on PostgreSQL 15), the common case of
// an outbox whose retention keeps it small.
//
// The claim's now is pgStamp, not now() alone: the ordered settle-and-claim settles and
// then claims in one transaction, whose now() would give a retried row's settle and its
// claim the same updated_at.
func pgLeaseUpdate(tbl string, a *dialect.Args, p dialect.ClaimParams) string {
	return ` UPDATE ` + tbl + ` AS t SET status = 'processing', attempts = t.attempts + 1, locked_by = ` + a.Add(p.WorkerID) +
		`, locked_until = ` + pgStamp + ` + ` + pgMicros(a.Add(sqlkit.Micros(p.Lease))+`::bigint`) + `, lease_token = ` + a.Add(pgUUID(p.Token)) +
		`, updated_at = ` + pgStamp + ` WHERE t.id = ANY(ARRAY(SELECT id FROM c)) RETURNING ` + sqlkit.SelectList(sqlkit.ClaimColumns, "t.", nil)
}

// pgStamp is the time a claim writes to updated_at (and locked_until less the lease): the
// transaction's now(), or a microsecond past the row's updated_at when a statement of the
// same transaction already wrote that now, so that every change advances updated_at.
const pgStamp = `GREATEST(now(), t.updated_at + interval '1 microsecond')`

func (d *Dialect) Complete(ctx context.Context, q dialect.DBTX, t dialect.Table, outcomes []dialect.Outcome) ([]uuid.UUID, error) {
	if len(outcomes) == 0 {
		return nil, nil
	}
	query, vals := d.settle(t, outcomes)
	got, err := dialect.QueryIDs(ctx, q, query, vals...)
	if err != nil {
		return nil, err
	}
	return dialect.Lost(dialect.Leases(outcomes), got), nil
}

// settle returns the statement that applies outcomes, returning the ids it applied, and
// its arguments: the ack when every outcome acks under one token, the join otherwise. The
// first argument is the array of the outcomes' ids in both.
func (d *Dialect) settle(t dialect.Table, outcomes []dialect.Outcome) (string, []any) {
	n := len(outcomes)
	ids := pgUUIDArray(n, func(i int) uuid.UUID { return outcomes[i].ID })
	if token, ok := sqlkit.UniformAck(outcomes); ok {
		return d.statements(t).ack, []any{ids, token.String()}
	}
	// A uuid.Nil token binds as the all-zero UUID rather than NULL: either way it matches
	// no row, since claims store random tokens.
	tokens := pgUUIDArray(n, func(i int) uuid.UUID { return outcomes[i].Token })
	statuses, errs, delays, refunds := make([]string, n), make([]string, n), make([]int64, n), make([]int64, n)
	for i, o := range outcomes {
		statuses[i], delays[i], errs[i] = string(o.Status), sqlkit.Micros(o.Delay), o.Error
		if o.RefundAttempt {
			refunds[i] = 1
		}
	}
	return d.statements(t).complete, []any{ids, tokens, statuses, delays, errs, refunds}
}

func (d *Dialect) Extend(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ExtendParams) ([]uuid.UUID, error) {
	if len(p.Leases) == 0 {
		return nil, nil
	}
	ids := pgUUIDArray(len(p.Leases), func(i int) uuid.UUID { return p.Leases[i].ID })
	tokens := pgUUIDArray(len(p.Leases), func(i int) uuid.UUID { return p.Leases[i].Token })
	got, err := dialect.QueryIDs(ctx, q, d.statements(t).extend, ids, tokens, sqlkit.Micros(p.Lease))
	if err != nil {
		return nil, err
	}
	return dialect.Lost(p.Leases, got), nil
}

// Bury has the semantics of the SQLite dialect's UPDATE ... WHERE id IN (SELECT ...), in
// the claim's CTE form: a LIMIT ... FOR UPDATE SKIP LOCKED subquery under IN may be
// rescanned by a nested-loop semi-join and lock more than Limit rows; a materialized
// CTE runs once.
func (*Dialect) Bury(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.BuryParams) ([]uuid.UUID, error) {
	tbl := pgTable(t)
	a := &dialect.Args{Numbered: true}
	query := `WITH c AS MATERIALIZED (SELECT id FROM ` + tbl + ` WHERE ` + sqlkit.BuryCandidates(a, p, func() string { return `now()` }, pgUUID, `::bigint`) +
		` ORDER BY created_at, id LIMIT ` + a.Add(p.Limit) + `::bigint FOR UPDATE SKIP LOCKED)` +
		` UPDATE ` + tbl + ` AS t SET status = 'dead', last_error = ` + a.Add(p.Reason) +
		`, locked_by = NULL, locked_until = NULL, lease_token = ` + a.Add(pgUUID(p.Token)) +
		`, updated_at = now() WHERE t.id = ANY(ARRAY(SELECT id FROM c)) RETURNING t.id`
	return dialect.QueryIDs(ctx, q, query, a.Values...)
}

func (d *Dialect) Get(ctx context.Context, q dialect.DBTX, t dialect.Table, id uuid.UUID) (dialect.Record, error) {
	return sqlkit.GetRecord(q.QueryRowContext(ctx, d.statements(t).get, pgUUID(id)))
}

// completeAndClaimRows is CompleteAndClaim before the sort. An unordered claim is one statement: the
// settle (Complete's statement) and the claim (Claim's) as data-modifying CTEs, which run
// once, on one snapshot, and commit together:
//
//	WITH s AS (UPDATE ... (Complete) ... RETURNING t.id),
//	c AS MATERIALIZED (SELECT id FROM "outbox_events" WHERE (Claim's predicate)
//	    ORDER BY created_at, id LIMIT $n FOR UPDATE SKIP LOCKED),
//	leased AS (UPDATE ... (Claim's lease) ... WHERE t.id = ANY(ARRAY(SELECT id FROM c)) RETURNING (claimColumns))
//	SELECT * FROM leased UNION ALL SELECT x.id, '', '', NULL, ..., 0 AS attempts, ...
//	    FROM (SELECT unnest($1::uuid[]) EXCEPT SELECT id FROM s) AS x(id)
//
// The claim keeps the settled ids out: both CTEs read the snapshot from before the
// statement, where a settled row whose lease just expired is still claimable, and a
// statement must not update a row twice. It tests them as id NOT IN (SELECT unnest($1)),
// a hashed subplan: NOT (id = ANY($1)) compares each row the claim reads with every
// settled id once the plan is generic (after five runs of the prepared statement), which
// at batch 500, with the batch in flight read too, cost 2 ms of a 2.5 ms index scan
// (EXPLAIN ANALYZE, PostgreSQL 15) against 0.6 ms. The ids of outcomes that were not
// applied (their lease was lost) come back as rows with attempts 0, which no claimed row
// has (a claim counts its attempt); usually there are none, so the statement returns only
// the claimed rows (returning every settled id instead cost a scan of a batch of rows more
// per call). An ordered claim must see the keys the outcomes release, which a statement's
// snapshot cannot, so it runs after Complete in one transaction instead; one that continues
// the keys the outcomes delivered needs no such sight, and is one statement again
// (pgCompleteAndContinue).
func (d *Dialect) completeAndClaimRows(ctx context.Context, db *sql.DB, t dialect.Table, outcomes []dialect.Outcome, p dialect.ClaimParams) ([]dialect.Record, []uuid.UUID, error) {
	if p.Ordered && p.Continue && p.Runs && p.Namespace != "" {
		return pgCompleteAndContinue(ctx, d, db, t, outcomes, p)
	}
	if p.Ordered {
		return pgCompleteThenClaimOrdered(ctx, d, db, t, outcomes, p)
	}
	c, err := pgRetryDeadlock(ctx, func() (c pgClaimed, err error) {
		c.recs, c.lost, err = d.settleAndLease(ctx, db, t, outcomes, p, func(a *dialect.Args) string {
			return strings.TrimPrefix(pgDue(pgTable(t), a, p, ` AND id NOT IN (SELECT unnest($1::uuid[]))`), `WITH `)
		})
		return c, err
	})
	return c.recs, c.lost, err
}

// pgClaimed is what a settle-and-claim returns: the rows it leased, and the ids of the
// outcomes it did not apply (their lease was lost).
type pgClaimed struct {
	recs []dialect.Record
	lost []uuid.UUID
}

// settleAndLease runs on q, as one statement, the settle of outcomes (s) and a claim: claim
// renders its CTEs after s, the last of which, c, returns the ids to lease. It returns the
// leased rows and the ids of the outcomes not applied (their lease was lost).
func (d *Dialect) settleAndLease(ctx context.Context, q dialect.DBTX, t dialect.Table, outcomes []dialect.Outcome, p dialect.ClaimParams,
	claim func(a *dialect.Args) string) ([]dialect.Record, []uuid.UUID, error) {
	tbl := pgTable(t)
	settle, vals := d.settle(t, outcomes)
	a := &dialect.Args{Numbered: true, Values: vals}
	var b strings.Builder
	b.WriteString(`WITH s AS (` + settle + `), ` + claim(a) + `,`)
	b.WriteString(` leased AS (` + pgLeaseUpdate(tbl, a, p) + `) SELECT * FROM leased UNION ALL SELECT x.id`)
	for _, c := range sqlkit.ClaimColumns[1:] {
		switch c {
		case "namespace", "topic":
			b.WriteString(`, ''`)
		case "attempts":
			b.WriteString(`, 0`)
		default:
			b.WriteString(`, NULL`)
		}
	}
	// $1 is the outcomes' ids in both of settle's statements.
	b.WriteString(` FROM (SELECT unnest($1::uuid[]) EXCEPT SELECT id FROM s) AS x(id)`)
	rows, err := sqlkit.QueryAll(ctx, q, b.String(), a.Values, sqlkit.ScanClaimed)
	if err != nil {
		return nil, nil, err
	}
	var lost []uuid.UUID
	recs := rows[:0]
	for _, r := range rows {
		if r.Attempts == 0 {
			lost = append(lost, r.ID)
		} else {
			recs = append(recs, r)
		}
	}
	sqlkit.StampClaimed(recs, p)
	return recs, lost, nil
}

// pgCompleteThenClaimOrdered settles and then claims in order in one transaction: one
// commit, and the claim sees the keys the settle released.
func pgCompleteThenClaimOrdered(ctx context.Context, d *Dialect, db *sql.DB, t dialect.Table, outcomes []dialect.Outcome, p dialect.ClaimParams) (recs []dialect.Record, lost []uuid.UUID, err error) {
	err = sqlkit.InTx(ctx, db, nil, func(tx *sql.Tx) error {
		if lost, err = d.Complete(ctx, tx, t, outcomes); err != nil {
			return err
		}
		recs, err = pgClaim(ctx, tx, t, p)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return recs, lost, nil
}

// Claim implements [dialect.Dialect]. RETURNING has no order of its own, and an ordered
// claim merges two reads, so the records are put in claim order here, once.
func (d *Dialect) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]dialect.Record, error) {
	recs, err := d.claimRows(ctx, db, t, p)
	dialect.SortClaimed(recs)
	return recs, err
}

// CompleteAndClaim implements [dialect.SettleClaimer], with the claimed records in claim
// order (Claim).
func (d *Dialect) CompleteAndClaim(ctx context.Context, db *sql.DB, t dialect.Table, outcomes []dialect.Outcome, p dialect.ClaimParams) ([]dialect.Record, []uuid.UUID, error) {
	recs, lost, err := d.completeAndClaimRows(ctx, db, t, outcomes, p)
	dialect.SortClaimed(recs)
	return recs, lost, err
}

// SupportsSchema implements [sqlkit.Schemer]: every statement names the table by its schema
// when it has one.
func (*Dialect) SupportsSchema() bool { return true }

// pgTable returns the table's name quoted, qualified by its schema when it has one.
func pgTable(t dialect.Table) string { return pgQualify(t.Schema(), t.Name()) }

// pgQualify quotes name, a table or index of the table's schema, qualified by that schema
// when it is not empty.
func pgQualify(schema, name string) string {
	q := sqlkit.QuoteIdent(name, '"')
	if schema != "" {
		q = sqlkit.QuoteIdent(schema, '"') + "." + q
	}
	return q
}
