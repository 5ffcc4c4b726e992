package mysql_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/conformance"
	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/dialecttest"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
)

func TestMySQLConformance(t *testing.T) {
	t.Parallel()
	conformance.Run(t, conformance.Harness{
		Dialect:     outbox.MySQL(),
		OpenDB:      func(t testing.TB) *sql.DB { return testdb.MySQL(t) },
		Reopen:      testdb.Reopen,
		OtherServer: func(t testing.TB) *sql.DB { return testdb.SQLite(t) },
		DSN:         func(t testing.TB, db *sql.DB) (string, string) { return "mysql", testdb.DSN(t, "mysql", db) },
	})
}

// myEnv is one MySQL test's database with the outbox table and a store on it.
type myEnv struct {
	ctx   context.Context
	db    *sql.DB
	store *outbox.Store
	table string
}

func setupMySQL(t *testing.T, table string) *myEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	if table == "" {
		table = outbox.DefaultTable
	}
	db := testdb.MySQL(t)
	require.NoError(t, migrations.Up(ctx, db, "mysql", migrations.Options{Table: table}))
	s, err := outbox.New(db, outbox.MySQL(), outbox.Options{Table: table})
	require.NoError(t, err)
	return &myEnv{ctx: ctx, db: db, store: s, table: table}
}

// storeOn returns a store on another handle to the same table.
func (e *myEnv) storeOn(t *testing.T, db *sql.DB) *outbox.Store {
	t.Helper()
	s, err := outbox.New(db, outbox.MySQL(), outbox.Options{Table: e.table})
	require.NoError(t, err)
	return s
}

// enqueue commits msgs in one transaction.
func (e *myEnv) enqueue(t *testing.T, msgs ...outbox.Message) []outbox.Result {
	t.Helper()
	return myEnqueue(t, e.ctx, e.db, e.store, msgs...)
}

func myEnqueue(t *testing.T, ctx context.Context, db *sql.DB, s *outbox.Store, msgs ...outbox.Message) []outbox.Result {
	t.Helper()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	res, err := s.EnqueueBatch(ctx, tx, msgs)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	return res
}

// count counts rows matching where ("" for all).
func (e *myEnv) count(t *testing.T, where string) int {
	t.Helper()
	q := "SELECT COUNT(*) FROM `" + e.table + "`"
	if where != "" {
		q += " WHERE " + where
	}
	var n int
	require.NoError(t, e.db.QueryRowContext(e.ctx, q).Scan(&n))
	return n
}

func (e *myEnv) exec(t *testing.T, query string, args ...any) int64 {
	t.Helper()
	res, err := e.db.ExecContext(e.ctx, strings.ReplaceAll(query, "$table", "`"+e.table+"`"), args...)
	require.NoError(t, err)
	n, err := res.RowsAffected()
	require.NoError(t, err)
	return n
}

// expire ends the leases of ids as if their time had run out, without waiting for it.
func (e *myEnv) expire(t *testing.T, ids ...uuid.UUID) {
	t.Helper()
	for _, id := range ids {
		require.EqualValues(t, 1, e.exec(t, "UPDATE $table SET locked_until = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE id = ?", id[:]))
	}
}

func (e *myEnv) get(t *testing.T, id uuid.UUID) outbox.Record {
	t.Helper()
	r, err := e.store.Get(e.ctx, id)
	require.NoError(t, err)
	return r
}

func (e *myEnv) claim(t *testing.T, s *outbox.Store, o outbox.ClaimOptions) []outbox.Record {
	t.Helper()
	recs, err := s.Claim(e.ctx, o)
	require.NoError(t, err)
	return recs
}

func myMsg(i int) outbox.Message {
	return outbox.Message{Namespace: "orders", Topic: "order.created", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
}

func myMsgs(n int) []outbox.Message {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = myMsg(i)
	}
	return msgs
}

func myClaimOpts(limit int) outbox.ClaimOptions {
	return outbox.ClaimOptions{Limit: limit, Lease: time.Hour, MaxAttempts: 5, WorkerID: "mysql-worker"}
}

func myIDs(recs []outbox.Record) []uuid.UUID {
	ids := make([]uuid.UUID, len(recs))
	for i, r := range recs {
		ids[i] = r.ID
	}
	return ids
}

// reopenMySQL opens another pool on the test's database with a changed driver
// configuration, through wrap when it is not nil.
func reopenMySQL(t *testing.T, db *sql.DB, tweak func(*mysql.Config), wrap func(driver.Connector) driver.Connector) *sql.DB {
	t.Helper()
	var name string
	require.NoError(t, db.QueryRow("SELECT DATABASE()").Scan(&name))
	cfg, err := mysql.ParseDSN(testdb.MySQLDSN())
	require.NoError(t, err)
	cfg.DBName = name
	if tweak != nil {
		tweak(cfg)
	}
	c, err := mysql.NewConnector(cfg)
	require.NoError(t, err)
	if wrap != nil {
		c = wrap(c)
	}
	other := sql.OpenDB(c)
	t.Cleanup(func() { _ = other.Close() })
	return other
}

func TestMySQLRoundTrip(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	tenant := uuid.New()
	m := outbox.Message{
		Namespace: "billing", Topic: "invoice.paid", TenantID: tenant,
		DedupeKey: tenant.String() + "/invoice-7", PartitionKey: "invoice-7",
		Headers: outbox.Headers{"traceparent": "00-abc-01", "content-type": "application/json"},
		Payload: json.RawMessage(`{ "invoice": 7, "note": "Grüße 🚀" }`),
	}
	res := e.enqueue(t, m, myMsg(2))
	require.False(t, res[0].Duplicate)

	stored := e.get(t, res[0].ID)
	sum := sha256.Sum256(m.Payload)
	require.Equal(t, tenant, stored.TenantID)
	require.Equal(t, m.DedupeKey, stored.DedupeKey)
	require.Equal(t, m.PartitionKey, stored.PartitionKey)
	require.Equal(t, m.Headers, stored.Headers)
	require.Equal(t, string(m.Payload), string(stored.Payload))
	require.Equal(t, sum[:], stored.PayloadHash)
	require.Equal(t, outbox.StatusPending, stored.Status)
	require.True(t, stored.CreatedAt.Equal(stored.UpdatedAt))
	require.True(t, stored.CreatedAt.Equal(stored.NextAttemptAt))
	require.True(t, stored.LockedUntil.IsZero())
	require.True(t, stored.DeliveredAt.IsZero())

	recs := e.claim(t, e.store, outbox.ClaimOptions{Limit: 10, Lease: 90 * time.Second, MaxAttempts: 3, WorkerID: "w-1"})
	require.Equal(t, []uuid.UUID{res[0].ID, res[1].ID}, myIDs(recs))
	for _, r := range recs {
		// What the claim returns is exactly what it stored.
		require.Equal(t, e.get(t, r.ID), r)
		require.Equal(t, outbox.StatusProcessing, r.Status)
		require.Equal(t, 1, r.Attempts)
		require.Equal(t, 90*time.Second, r.LockedUntil.Sub(r.UpdatedAt))
		require.True(t, r.UpdatedAt.After(stored.UpdatedAt))
	}

	require.NoError(t, e.store.Ack(e.ctx, recs[0].Lease()))
	require.NoError(t, e.store.Nack(e.ctx, outbox.RetryPolicy{}, outbox.Failure{Lease: recs[1].Lease(), Attempts: 1, Err: outbox.RetryAfter(errors.New("busy"), time.Minute)}))
	acked := e.get(t, recs[0].ID)
	require.Equal(t, outbox.StatusDelivered, acked.Status)
	require.True(t, acked.DeliveredAt.Equal(acked.UpdatedAt))
	require.Empty(t, acked.LockedBy)
	require.True(t, acked.LockedUntil.IsZero())
	require.Equal(t, recs[0].LeaseToken, acked.LeaseToken, "the token stays on a settled row")
	nacked := e.get(t, recs[1].ID)
	require.Equal(t, outbox.StatusPending, nacked.Status)
	require.Equal(t, "busy (retry after 1m0s)", nacked.LastError)
	require.Equal(t, time.Minute, nacked.NextAttemptAt.Sub(nacked.UpdatedAt))

	require.ErrorIs(t, e.store.Ack(e.ctx, recs[0].Lease()), outbox.ErrLeaseLost, "a second ack")
	_, err := e.store.Get(e.ctx, uuid.New())
	require.ErrorIs(t, err, outbox.ErrNotFound)
}

// TestMySQLClaimPlan checks with EXPLAIN, on the statements the dialect really runs, that
// both reads of a claim through the claim index walk it in order (no filesort), with or
// without a scope, that expired leases are locked by primary key, and that Complete joins
// the table by primary key.
func TestMySQLClaimPlan(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	tenant := uuid.New()
	msgs := myMsgs(4000)
	for i := range msgs {
		if i%2 == 1 {
			msgs[i].Topic = "order.paid"
		}
		if i%7 == 0 {
			msgs[i].TenantID = tenant
		}
	}
	e.enqueue(t, msgs...)
	require.EqualValues(t, 2000, e.exec(t, "UPDATE $table SET status = 'delivered', delivered_at = UTC_TIMESTAMP(6) ORDER BY created_at, id LIMIT 2000"))
	live := e.claim(t, e.store, myClaimOpts(50)) // leases in flight: the reclaim read passes them
	rows, err := e.db.QueryContext(e.ctx, "ANALYZE TABLE `"+e.table+"`")
	require.NoError(t, err)
	require.NoError(t, rows.Close())

	rec := &myRecorder{}
	s := e.storeOn(t, reopenMySQL(t, e.db, nil, rec.wrap))
	requireIndexWalk := func(t *testing.T, what, index string, plan myPlan) {
		t.Helper()
		t.Logf("EXPLAIN of the %s:\n%s", what, plan)
		require.Len(t, plan, 1)
		require.Equal(t, e.table+"_"+index+"_idx", plan[0]["key"], "the %s index serves the %s", index, what)
		require.Contains(t, []string{"ref", "range"}, plan[0]["type"])
		require.NotContains(t, plan[0]["Extra"], "filesort", "rows come in index order, never sorted")
	}
	scoped := myClaimOpts(10)
	scoped.Scope = outbox.Scope{Namespace: "orders", Topics: []string{"order.created", "order.paid"}, TenantID: tenant}
	for _, o := range []outbox.ClaimOptions{myClaimOpts(10), scoped} {
		t.Run(fmt.Sprintf("scope=%v", o.Namespace != ""), func(t *testing.T) {
			rec.reset()
			recs := e.claim(t, s, o)
			require.Len(t, recs, 10)
			reads := rec.matching("FORCE INDEX (`" + e.table + "_claim_idx`)")
			require.Len(t, reads, 1, "expired leases are looked for in the claim index")
			require.NotContains(t, reads[0].query, "FOR UPDATE", "expired leases are looked for without locking")
			requireIndexWalk(t, "reclaim read", "claim", myExplain(t, e, reads[0]))
			due := rec.matching("FORCE INDEX (`" + e.table + "_due_idx`)")
			require.Len(t, due, 1, "nothing expired, so the pending read runs too")
			require.Contains(t, due[0].query, "FOR UPDATE SKIP LOCKED")
			requireIndexWalk(t, "pending read", "due", myExplain(t, e, due[0]))

			rec.reset()
			require.NoError(t, s.Ack(e.ctx, myLeases(recs)...))
			updates := rec.matching("UPDATE")
			require.Len(t, updates, 1, "a batch ack is one statement")
			plan := myExplain(t, e, updates[0])
			t.Logf("EXPLAIN of the batch ack:\n%s", plan)
			var target myPlanRow
			for _, row := range plan {
				if row["table"] == "t" || row["table"] == e.table {
					target = row
				}
			}
			// A uniform ack (one claim, all delivered) is "id IN (...) AND lease_token = ?",
			// a range on the primary key; a mixed batch joins by primary key (eq_ref).
			require.Equal(t, "PRIMARY", target["key"], "the ack finds its rows by primary key")
			require.Contains(t, []string{"eq_ref", "range"}, target["type"])
		})
	}

	// Expired leases are locked by primary key, then pending rows fill the batch.
	e.expire(t, live[3].ID, live[7].ID)
	rec.reset()
	recs := e.claim(t, s, myClaimOpts(10))
	require.Len(t, recs, 10)
	require.Contains(t, myIDs(recs), live[3].ID)
	require.Contains(t, myIDs(recs), live[7].ID)
	locks := rec.matching("FOR UPDATE SKIP LOCKED")
	require.Len(t, locks, 2)
	plan := myExplain(t, e, locks[0])
	t.Logf("EXPLAIN of the reclaim lock:\n%s", plan)
	require.Len(t, plan, 1)
	require.Equal(t, "PRIMARY", plan[0]["key"])
	require.Equal(t, "range", plan[0]["type"])
	requireIndexWalk(t, "pending read", "due", myExplain(t, e, locks[1]))
}

func myLeases(recs []outbox.Record) []outbox.Lease {
	ls := make([]outbox.Lease, len(recs))
	for i, r := range recs {
		ls[i] = r.Lease()
	}
	return ls
}

type myPlanRow map[string]string

type myPlan []myPlanRow

func (p myPlan) String() string {
	var b strings.Builder
	for _, r := range p {
		fmt.Fprintf(&b, "  id=%s select_type=%s table=%s type=%s key=%s rows=%s Extra=%s\n",
			r["id"], r["select_type"], r["table"], r["type"], r["key"], r["rows"], r["Extra"])
	}
	return b.String()
}

// myExplain runs EXPLAIN on a recorded statement with its arguments.
func myExplain(t *testing.T, e *myEnv, q myRecorded) myPlan {
	t.Helper()
	rows, err := e.db.QueryContext(e.ctx, "EXPLAIN "+q.query, q.args...)
	require.NoError(t, err)
	defer rows.Close()
	cols, err := rows.Columns()
	require.NoError(t, err)
	var plan myPlan
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		require.NoError(t, rows.Scan(ptrs...))
		row := myPlanRow{}
		for i, c := range cols {
			row[c] = vals[i].String
		}
		plan = append(plan, row)
	}
	require.NoError(t, rows.Err())
	return plan
}

// myRecorder records the statements a pool runs, with their arguments, so that tests can
// EXPLAIN exactly what the dialect sent.
type myRecorder struct {
	mu    sync.Mutex
	stmts []myRecorded
}

type myRecorded struct {
	query string
	args  []any
}

func (r *myRecorder) wrap(c driver.Connector) driver.Connector { return myRecConnector{c, r} }

func (r *myRecorder) add(query string, nv []driver.NamedValue) {
	args := make([]any, len(nv))
	for i, v := range nv {
		args[i] = v.Value
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stmts = append(r.stmts, myRecorded{query, args})
}

func (r *myRecorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stmts = nil
}

func (r *myRecorder) matching(substr string) []myRecorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []myRecorded
	for _, s := range r.stmts {
		if strings.Contains(s.query, substr) {
			out = append(out, s)
		}
	}
	return out
}

type myRecConnector struct {
	driver.Connector
	rec *myRecorder
}

func (c myRecConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return myRecConn{conn, c.rec}, nil
}

// myRecConn forwards everything to go-sql-driver's connection, recording statement texts.
// When the driver declines a statement with arguments (driver.ErrSkip, no
// interpolateParams), database/sql prepares it through PrepareContext: recorded once.
type myRecConn struct {
	driver.Conn
	rec *myRecorder
}

func (c myRecConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	c.rec.add(query, args)
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
}

func (c myRecConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	c.rec.add(query, args)
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
}

func (c myRecConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
}

func (c myRecConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

func (c myRecConn) CheckNamedValue(nv *driver.NamedValue) error {
	return c.Conn.(driver.NamedValueChecker).CheckNamedValue(nv)
}

func (c myRecConn) ResetSession(ctx context.Context) error {
	return c.Conn.(driver.SessionResetter).ResetSession(ctx)
}

func (c myRecConn) IsValid() bool { return c.Conn.(driver.Validator).IsValid() }

// TestMySQLClaimStatements counts, with the server's own session counters, what one
// claim sends: the statements are fixed, and the round trips depend on whether the
// driver prepares statements on the server or interpolates them.
func TestMySQLClaimStatements(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	for _, interpolate := range []bool{false, true} {
		t.Run(fmt.Sprintf("interpolateParams=%v", interpolate), func(t *testing.T) {
			e.enqueue(t, myMsgs(20)...)
			db := reopenMySQL(t, e.db, func(c *mysql.Config) { c.InterpolateParams = interpolate }, nil)
			db.SetMaxOpenConns(1) // one session, whose counters we read
			s := e.storeOn(t, db)
			status := func() map[string]int {
				rows, err := db.QueryContext(e.ctx, "SHOW SESSION STATUS WHERE Variable_name IN"+
					" ('Questions', 'Com_stmt_prepare', 'Com_stmt_execute', 'Com_select', 'Com_update', 'Com_begin', 'Com_commit', 'Com_rollback', 'Com_set_option')")
				require.NoError(t, err)
				defer rows.Close()
				m := map[string]int{}
				for rows.Next() {
					var k string
					var v int
					require.NoError(t, rows.Scan(&k, &v))
					m[k] = v
				}
				require.NoError(t, rows.Err())
				return m
			}
			measure := func(limit int) map[string]int {
				before := status()
				recs, err := s.Claim(e.ctx, myClaimOpts(limit))
				require.NoError(t, err)
				after := status()
				d := map[string]int{"claimed": len(recs)}
				for k, v := range after {
					d[k] = v - before[k]
				}
				// The second SHOW STATUS counts itself in Questions.
				d["Questions"]--
				return d
			}
			full := measure(5)
			t.Logf("claim of %d rows: %v", full["claimed"], full)
			require.Equal(t, 5, full["claimed"])
			require.Equal(t, 1, full["Com_begin"])
			require.Equal(t, 1, full["Com_commit"])
			require.Equal(t, 2, full["Com_select"], "reclaim read and pending read")
			require.Equal(t, 1, full["Com_update"])
			// Questions counts every statement the client sent, prepared ones when they are
			// executed; a prepare is one more round trip.
			t.Logf("round trips: %d", full["Questions"]+full["Com_stmt_prepare"])

			rest := measure(100)
			require.Equal(t, 15, rest["claimed"])
			none := measure(10)
			t.Logf("claim with nothing to claim: %v", none)
			require.Equal(t, 0, none["claimed"])
			require.Equal(t, 0, none["Com_update"])
			require.Equal(t, 1, none["Com_rollback"], "an empty claim only ends its transaction")
		})
	}
}

func TestMySQLDedupeKeepsTransactionUsable(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	_, err := e.db.ExecContext(e.ctx, "CREATE TABLE orders (id INT PRIMARY KEY)")
	require.NoError(t, err)
	m := myMsg(1)
	m.DedupeKey = "order-1/created"
	first := e.enqueue(t, m)[0]
	require.False(t, first.Duplicate)

	tx, err := e.db.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	_, err = tx.ExecContext(e.ctx, "INSERT INTO orders VALUES (1)")
	require.NoError(t, err)
	dup, err := e.store.Enqueue(e.ctx, tx, m)
	require.NoError(t, err, "a duplicate is an outcome, not an error")
	require.True(t, dup.Duplicate)
	require.Equal(t, uuid.Nil, dup.ID)
	batch, err := e.store.EnqueueBatch(e.ctx, tx, []outbox.Message{m, myMsg(2), m})
	require.NoError(t, err)
	require.True(t, batch[0].Duplicate)
	require.False(t, batch[1].Duplicate)
	require.True(t, batch[2].Duplicate)
	// The business transaction goes on and commits everything it did.
	_, err = tx.ExecContext(e.ctx, "INSERT INTO orders VALUES (2)")
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	var orders int
	require.NoError(t, e.db.QueryRowContext(e.ctx, "SELECT COUNT(*) FROM orders").Scan(&orders))
	require.Equal(t, 2, orders)
	require.Equal(t, 2, e.count(t, ""))

	// Outside a transaction too.
	dup, err = dialecttest.EnqueueOne(e.store, e.ctx, m)
	require.NoError(t, err)
	require.True(t, dup.Duplicate)
	// Other errors are still errors: a missing table is not a duplicate.
	other, err := outbox.New(e.db, outbox.MySQL(), outbox.Options{Table: "no_such_table"})
	require.NoError(t, err)
	_, err = dialecttest.EnqueueOne(other, e.ctx, m)
	require.Error(t, err)
}

func TestMySQLDedupeKeysAreBytewise(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	keys := []string{"key", "KEY", "Key", "key ", "key  ", " key", "kéy", "ke\u0301y", "KÉY"}
	msgs := make([]outbox.Message, len(keys))
	for i, k := range keys {
		msgs[i] = myMsg(i)
		msgs[i].DedupeKey = k
	}
	for i, r := range e.enqueue(t, msgs...) {
		require.False(t, r.Duplicate, "key %q is its own row", keys[i])
	}
	require.Equal(t, len(keys), e.count(t, ""))
	for i, r := range e.enqueue(t, msgs...) {
		require.True(t, r.Duplicate, "key %q again", keys[i])
	}
	// Namespaces and topics compare byte for byte too.
	a, b := myMsg(1), myMsg(1)
	a.DedupeKey, b.DedupeKey = "k", "k"
	b.Topic = "ORDER.CREATED"
	for _, r := range e.enqueue(t, a, b) {
		require.False(t, r.Duplicate)
	}
	for _, k := range keys {
		var n int
		require.NoError(t, e.db.QueryRowContext(e.ctx, "SELECT COUNT(*) FROM `"+e.table+"` WHERE dedupe_key = ?", k).Scan(&n))
		require.Equal(t, 1, n, "key %q", k)
	}
}

func TestMySQLBatchMixedDuplicates(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	seen := map[string]bool{}
	var existing []outbox.Message
	for i := range 10 {
		m := myMsg(i)
		m.DedupeKey = fmt.Sprintf("existing-%d", i)
		existing = append(existing, m)
		seen[m.DedupeKey] = true
	}
	e.enqueue(t, existing...)

	// 2500 messages cross two chunk boundaries: keys that exist already, new keys, keys
	// repeated within the batch (also across chunks), and no key.
	const n = 2500
	msgs := myMsgs(n)
	want := make([]bool, n)
	for i := range msgs {
		switch i % 5 {
		case 0:
			msgs[i].DedupeKey = fmt.Sprintf("existing-%d", i%10)
		case 1:
			msgs[i].DedupeKey = fmt.Sprintf("new-%d", i)
		case 2:
			msgs[i].DedupeKey = fmt.Sprintf("repeated-%d", i%300)
		}
		k := msgs[i].DedupeKey
		want[i] = k != "" && seen[k]
		if k != "" {
			seen[k] = true
		}
	}
	res := e.enqueue(t, msgs...)
	inserted := map[uuid.UUID]int{}
	for i, r := range res {
		require.Equal(t, want[i], r.Duplicate, "message %d (key %q)", i, msgs[i].DedupeKey)
		if !r.Duplicate {
			inserted[r.ID] = i
		}
	}
	require.Equal(t, 10+len(inserted), e.count(t, ""))
	rows, err := e.db.QueryContext(e.ctx, "SELECT id, payload FROM `"+e.table+"` WHERE dedupe_key IS NULL OR dedupe_key NOT LIKE 'existing-%'")
	require.NoError(t, err)
	defer rows.Close()
	got := 0
	for rows.Next() {
		var id uuid.UUID
		var payload []byte
		require.NoError(t, rows.Scan(&id, &payload))
		i, ok := inserted[id]
		require.True(t, ok, "row %s was reported as a duplicate", id)
		require.Equal(t, string(msgs[i].Payload), string(payload))
		got++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, len(inserted), got)

	// All duplicates, all new, and one of each, in multi-row statements.
	for i, r := range e.enqueue(t, msgs[0], msgs[1], msgs[2]) {
		require.True(t, r.Duplicate, "message %d", i)
	}
	fresh := myMsgs(3)
	fresh[0].DedupeKey, fresh[2].DedupeKey = "fresh-0", "fresh-2"
	for _, r := range e.enqueue(t, fresh...) {
		require.False(t, r.Duplicate)
	}
	res = e.enqueue(t, msgs[1], myMsg(9), fresh[2])
	require.Equal(t, []bool{true, false, true}, []bool{res[0].Duplicate, res[1].Duplicate, res[2].Duplicate})
}

func TestMySQLLargeBatch(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	var packet int
	require.NoError(t, e.db.QueryRowContext(e.ctx, "SELECT @@max_allowed_packet").Scan(&packet))
	// More data than one packet may carry: the insert splits by bytes, not only by rows.
	big := `"` + strings.Repeat("x", 900<<10) + `"`
	n := packet/len(big) + 2
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = myMsg(i)
		msgs[i].Payload = json.RawMessage(big)
	}
	res := e.enqueue(t, msgs...)
	require.Len(t, res, n)
	require.Equal(t, n, e.count(t, ""))
	sum := sha256.Sum256([]byte(big))
	r := e.get(t, res[n-1].ID)
	require.Equal(t, sum[:], r.PayloadHash)
	require.Equal(t, big, string(r.Payload))
}

func TestMySQLCustomTable(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "billing_outbox")
	var tables []string
	rows, err := e.db.QueryContext(e.ctx, "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() ORDER BY 1")
	require.NoError(t, err)
	for rows.Next() {
		var name string
		require.NoError(t, rows.Scan(&name))
		tables = append(tables, name)
	}
	require.NoError(t, rows.Close())
	require.Equal(t, []string{"billing_outbox", "billing_outbox_dedupe", "billing_outbox_dedupe_lock", "billing_outbox_goose_version"}, tables)

	m := myMsg(1)
	m.DedupeKey = "k"
	res := e.enqueue(t, m, myMsg(2))
	require.True(t, e.enqueue(t, m)[0].Duplicate)
	recs := e.claim(t, e.store, myClaimOpts(10))
	require.Equal(t, []uuid.UUID{res[0].ID, res[1].ID}, myIDs(recs))
	require.NoError(t, e.store.Extend(e.ctx, time.Hour, recs[0].Lease()))
	require.NoError(t, e.store.Ack(e.ctx, recs[0].Lease()))
	require.NoError(t, e.store.Nack(e.ctx, outbox.RetryPolicy{MaxAttempts: 1}, outbox.Failure{Lease: recs[1].Lease(), Attempts: 1, Err: errors.New("boom")}))
	require.Equal(t, outbox.StatusDelivered, e.get(t, res[0].ID).Status)
	require.Equal(t, outbox.StatusDead, e.get(t, res[1].ID).Status)
	buried, err := e.store.Bury(e.ctx, outbox.Scope{}, 1, 10)
	require.NoError(t, err)
	require.Empty(t, buried)

	def, err := outbox.New(e.db, outbox.MySQL(), outbox.Options{})
	require.NoError(t, err)
	_, err = dialecttest.EnqueueOne(def, e.ctx, myMsg(3))
	require.Error(t, err, "the default table does not exist")
}

// TestMySQLTimeZoneIndependent reads and writes through sessions whose time zone is not
// UTC, with and without parseTime: every time stays the database's UTC clock, and every
// session reads the same values.
func TestMySQLTimeZoneIndependent(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	cases := []struct {
		name     string
		zone     string
		offset   int // hours of NOW() ahead of UTC_TIMESTAMP()
		tweak    func(*mysql.Config)
		variable string
	}{
		{"NoParseTime", "'+05:00'", 5, func(c *mysql.Config) { c.ParseTime = false }, "+05:00"},
		{"ParseTimeOtherLoc", "'-03:00'", -3, func(c *mysql.Config) {
			c.ParseTime, c.Loc = true, time.FixedZone("UTC-7", -7*3600)
		}, "-03:00"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			db := reopenMySQL(t, e.db, func(cfg *mysql.Config) {
				c.tweak(cfg)
				cfg.Params = map[string]string{"time_zone": c.zone}
			}, nil)
			var zone string
			var offset int
			require.NoError(t, db.QueryRowContext(e.ctx, "SELECT @@session.time_zone, TIMESTAMPDIFF(MINUTE, UTC_TIMESTAMP(), NOW())").Scan(&zone, &offset))
			require.Equal(t, c.variable, zone)
			require.InDelta(t, c.offset*60, offset, 1, "the session clock is %d hours off UTC", c.offset)

			s := e.storeOn(t, db)
			delayed := myMsg(1)
			delayed.Delay = time.Hour
			res := myEnqueue(t, e.ctx, db, s, delayed, myMsg(2))
			r, err := s.Get(e.ctx, res[0].ID)
			require.NoError(t, err)
			require.Equal(t, time.UTC, r.CreatedAt.Location())
			// The server runs on this host, so its UTC clock and ours agree closely.
			require.WithinDuration(t, time.Now(), r.CreatedAt, time.Minute)
			require.Equal(t, time.Hour, r.NextAttemptAt.Sub(r.CreatedAt))
			var ageSeconds int
			require.NoError(t, e.db.QueryRowContext(e.ctx, "SELECT TIMESTAMPDIFF(SECOND, created_at, UTC_TIMESTAMP()) FROM `"+e.table+"` WHERE id = ?", res[0].ID[:]).Scan(&ageSeconds))
			require.True(t, ageSeconds >= 0 && ageSeconds < 60, "stored in UTC, %ds old", ageSeconds)

			recs, err := s.Claim(e.ctx, myClaimOpts(10))
			require.NoError(t, err)
			require.Equal(t, []uuid.UUID{res[1].ID}, myIDs(recs), "the delayed row is not due")
			require.WithinDuration(t, time.Now(), recs[0].UpdatedAt, time.Minute)
			require.Equal(t, time.Hour, recs[0].LockedUntil.Sub(recs[0].UpdatedAt))
			// Every session reads the same instants.
			require.Equal(t, e.get(t, res[0].ID), r)
			require.Equal(t, e.get(t, res[1].ID), recs[0])
			require.NoError(t, s.Ack(e.ctx, recs[0].Lease()))
		})
	}
}

// TestMySQLClaimRetriesLockWaits holds a table lock so that every claim statement times
// out at once (lock_wait_timeout=0): the claim is tried 4 times, counted by
// the server, and then fails with the server's error. Other errors are not retried.
func TestMySQLClaimRetriesLockWaits(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	e.enqueue(t, myMsg(1))
	db := reopenMySQL(t, e.db, func(c *mysql.Config) { c.Params = map[string]string{"lock_wait_timeout": "0"} }, nil)
	db.SetMaxOpenConns(1)
	s := e.storeOn(t, db)
	counter := func(conn interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	}, name string) int {
		var n int
		require.NoError(t, conn.QueryRowContext(e.ctx, "SHOW SESSION STATUS LIKE '"+name+"'").Scan(&name, &n))
		return n
	}
	begins := func() int { return counter(db, "Com_begin") }

	lock, err := e.db.Conn(e.ctx)
	require.NoError(t, err)
	defer lock.Close()
	_, err = lock.ExecContext(e.ctx, "LOCK TABLES `"+e.table+"` WRITE")
	require.NoError(t, err)
	before := begins()
	_, err = s.Claim(e.ctx, myClaimOpts(10))
	require.Error(t, err)
	require.Contains(t, err.Error(), "Error 1205")
	var me *mysql.MySQLError
	require.True(t, errors.As(err, &me), "the driver's error is wrapped, not flattened")
	require.EqualValues(t, 1205, me.Number)
	require.Equal(t, 4, begins()-before, "a lock wait timeout is retried")
	_, err = lock.ExecContext(e.ctx, "UNLOCK TABLES")
	require.NoError(t, err)
	recs := e.claim(t, s, myClaimOpts(10))
	require.Len(t, recs, 1)

	// Writes on the pool are retried too; on a connection, which may be in a transaction
	// that a deadlock would have rolled back, they are not.
	_, err = lock.ExecContext(e.ctx, "LOCK TABLES `"+e.table+"` WRITE")
	require.NoError(t, err)
	before = counter(db, "Com_update") // a uniform ack is a single-table UPDATE
	require.ErrorContains(t, s.Ack(e.ctx, recs[0].Lease()), "Error 1205")
	require.Equal(t, 4, counter(db, "Com_update")-before)
	conn, err := db.Conn(e.ctx)
	require.NoError(t, err)
	table, err := dialect.NewTable(e.table)
	require.NoError(t, err)
	before = counter(conn, "Com_update")
	_, err = outbox.MySQL().Complete(e.ctx, conn, table, []outbox.Outcome{{Lease: recs[0].Lease(), Status: outbox.StatusDelivered}})
	require.ErrorContains(t, err, "Error 1205")
	require.Equal(t, 1, counter(conn, "Com_update")-before)
	require.NoError(t, conn.Close())
	_, err = lock.ExecContext(e.ctx, "UNLOCK TABLES")
	require.NoError(t, err)
	require.NoError(t, s.Ack(e.ctx, recs[0].Lease()))

	missingTable, err := outbox.New(db, outbox.MySQL(), outbox.Options{Table: "no_such_table"})
	require.NoError(t, err)
	before = begins()
	_, err = missingTable.Claim(e.ctx, myClaimOpts(10))
	require.ErrorContains(t, err, "Error 1146")
	require.Equal(t, 1, begins()-before, "other errors are not retried")

	// A cancelled caller gets its error and leaves no transaction open.
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	_, err = s.Claim(ctx, myClaimOpts(10))
	require.ErrorIs(t, err, context.Canceled)
	var open int
	require.NoError(t, e.db.QueryRowContext(e.ctx, "SELECT COUNT(*) FROM information_schema.innodb_trx t JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id WHERE p.db = DATABASE()").Scan(&open))
	require.Zero(t, open)
}

func TestMySQLLeaseLost(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	e.enqueue(t, myMsgs(5)...)
	recs := e.claim(t, e.store, myClaimOpts(5))
	require.Len(t, recs, 5)
	a, b, c, d, f := recs[0], recs[1], recs[2], recs[3], recs[4]
	lostIDs := func(err error) []uuid.UUID {
		t.Helper()
		var lost *outbox.LeaseLostError
		require.True(t, errors.As(err, &lost), "want a LeaseLostError, got %v", err)
		return lost.IDs
	}

	// A row settled by an earlier call of the same claim is lost for a later one, even in a
	// batch where another row is applied.
	require.NoError(t, e.store.Ack(e.ctx, a.Lease()))
	require.Equal(t, []uuid.UUID{a.ID}, lostIDs(e.store.Ack(e.ctx, a.Lease(), b.Lease())))
	require.Equal(t, outbox.StatusDelivered, e.get(t, b.ID).Status)

	// A reclaimed row refuses its stale holder; the fresh row of the same batch is applied.
	e.expire(t, c.ID)
	re := e.claim(t, e.store, outbox.ClaimOptions{Limit: 5, Lease: time.Hour, MaxAttempts: 5, WorkerID: "w-2"})
	require.Equal(t, []uuid.UUID{c.ID}, myIDs(re))
	require.Equal(t, 2, re[0].Attempts)
	require.Equal(t, []uuid.UUID{c.ID}, lostIDs(e.store.Nack(e.ctx, outbox.RetryPolicy{},
		outbox.Failure{Lease: c.Lease(), Attempts: 1, Err: errors.New("late")},
		outbox.Failure{Lease: d.Lease(), Attempts: 1, Err: errors.New("on time")})))
	require.Equal(t, "on time", e.get(t, d.ID).LastError)
	got := e.get(t, c.ID)
	require.Equal(t, re[0], got, "the stale nack changed nothing")

	// Extend: the stale lease is lost and changes nothing, the live one is extended.
	require.Equal(t, []uuid.UUID{c.ID}, lostIDs(e.store.Extend(e.ctx, 2*time.Hour, f.Lease(), c.Lease())))
	require.Equal(t, re[0], e.get(t, c.ID))
	got = e.get(t, f.ID)
	require.Equal(t, 2*time.Hour, got.LockedUntil.Sub(got.UpdatedAt))
	require.Equal(t, f.LeaseToken, got.LeaseToken)

	// The same lease twice in one call is one row, applied once.
	require.NoError(t, e.store.Ack(e.ctx, re[0].Lease(), re[0].Lease()))
	require.NoError(t, e.store.Extend(e.ctx, time.Hour, f.Lease(), f.Lease()))
	require.Equal(t, []uuid.UUID{f.ID}, lostIDs(e.store.Extend(e.ctx, time.Hour, outbox.Lease{ID: f.ID, Token: uuid.New()})))
	// A row under two leases is refused: by row, a stale lease beside the live one would
	// pass for applied.
	require.ErrorIs(t, e.store.Extend(e.ctx, time.Hour, outbox.Lease{ID: f.ID, Token: uuid.New()}, f.Lease()), outbox.ErrInvalid)
}

func TestMySQLBury(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	other := myMsg(9)
	other.Namespace = "billing"
	res := e.enqueue(t, myMsg(0), myMsg(1), myMsg(2), other, myMsg(4))
	recs := e.claim(t, e.store, myClaimOpts(4))
	require.Len(t, recs, 4)
	pending, expired, live, otherNS := recs[0], recs[1], recs[2], recs[3]
	require.Equal(t, res[3].ID, otherNS.ID)
	require.NoError(t, e.store.Nack(e.ctx, outbox.RetryPolicy{}, outbox.Failure{Lease: pending.Lease(), Attempts: 1, Err: outbox.RetryAfter(nil, 0)}))
	e.expire(t, expired.ID, otherNS.ID)

	scope := outbox.Scope{Namespace: "orders"}
	buried, err := e.store.Bury(e.ctx, scope, 1, 1)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{pending.ID}, buried, "oldest first, at most the limit")
	buried, err = e.store.Bury(e.ctx, scope, 1, 10)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{expired.ID}, buried, "the live lease, the other namespace and the unattempted row stay")
	for _, id := range []uuid.UUID{pending.ID, expired.ID} {
		r := e.get(t, id)
		require.Equal(t, outbox.StatusDead, r.Status)
		require.Equal(t, "attempt limit reached (1 attempts)", r.LastError)
		require.Empty(t, r.LockedBy)
		require.True(t, r.LockedUntil.IsZero())
		require.NotEqual(t, uuid.Nil, r.LeaseToken)
		require.NotEqual(t, recs[0].LeaseToken, r.LeaseToken, "bury writes its own token")
	}
	require.Equal(t, outbox.StatusProcessing, e.get(t, live.ID).Status)
	require.Equal(t, outbox.StatusPending, e.get(t, res[4].ID).Status)
	require.Equal(t, outbox.StatusProcessing, e.get(t, otherNS.ID).Status)
	buried, err = e.store.Bury(e.ctx, outbox.Scope{}, 1, 10)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{otherNS.ID}, buried)
	buried, err = e.store.Bury(e.ctx, outbox.Scope{}, 1, 10)
	require.NoError(t, err)
	require.Empty(t, buried)
}

// TestMySQLBatchLockOrder has producers enqueue overlapping sets of dedupe keys, each in its
// own shuffled order and together with new keys, concurrently: every key is one row, and no
// producer deadlocks, because Insert checks the keys in one global order.
func TestMySQLBatchLockOrder(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	const keys, producers, rounds = 100, 8, 4
	shared := make([]outbox.Message, keys)
	for i := range shared {
		shared[i] = myMsg(i)
		shared[i].DedupeKey = fmt.Sprintf("shared-%03d", i)
	}
	e.enqueue(t, shared[:keys/2]...) // half exist already, half are raced for
	var (
		wg      sync.WaitGroup
		errs    = make(chan error, producers)
		winners atomic.Int64
	)
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				batch := slices.Clone(shared)
				rand.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
				for i := range 10 {
					m := myMsg(i)
					m.DedupeKey = fmt.Sprintf("own-%d-%d-%d", p, r, i)
					batch = append(batch, m, myMsg(i))
				}
				err := func() error {
					tx, err := e.db.BeginTx(e.ctx, nil)
					if err != nil {
						return err
					}
					defer func() { _ = tx.Rollback() }()
					res, err := e.store.EnqueueBatch(e.ctx, tx, batch)
					if err != nil {
						return err
					}
					for i, r := range res {
						if strings.HasPrefix(batch[i].DedupeKey, "shared-") && !r.Duplicate {
							winners.Add(1)
						}
					}
					return tx.Commit()
				}()
				if err != nil {
					errs <- fmt.Errorf("producer %d round %d: %w", p, r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, keys/2, winners.Load(), "each new shared key is inserted once")
	require.Equal(t, keys+producers*rounds*20, e.count(t, ""))
}

// TestMySQLWritesByPrimaryKeyOnSmallTables checks the plans of the statements that write
// claimed rows on a nearly empty table, where the optimizer would rather scan: an UPDATE
// that scans locks every row it reads, so each must find its rows by primary key.
func TestMySQLWritesByPrimaryKeyOnSmallTables(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	rec := &myRecorder{}
	s := e.storeOn(t, reopenMySQL(t, e.db, nil, rec.wrap))
	e.enqueue(t, myMsgs(3)...)
	recs := e.claim(t, s, myClaimOpts(3))
	require.Len(t, recs, 3)
	require.NoError(t, s.Extend(e.ctx, time.Hour, myLeases(recs)...))
	require.NoError(t, s.Ack(e.ctx, myLeases(recs)...))
	var updates []myRecorded
	for _, r := range rec.matching("UPDATE ") {
		if strings.HasPrefix(r.query, "UPDATE ") {
			updates = append(updates, r)
		}
	}
	require.Len(t, updates, 3, "claim, extend, ack")
	for _, u := range updates {
		plan := myExplain(t, e, u)
		t.Logf("EXPLAIN %.60s...:\n%s", u.query, plan)
		found := false
		for _, row := range plan {
			if row["table"] == "t" || row["table"] == e.table {
				found = true
				require.Equal(t, "PRIMARY", row["key"])
				require.Contains(t, []string{"eq_ref", "range", "const"}, row["type"])
			}
		}
		require.True(t, found, "the plan reads the outbox table")
	}
}

// TestMySQLClientFoundRows runs the lease operations through a connection with
// clientFoundRows=true, under which MySQL counts matched rather than changed rows: claims,
// lost leases and burying are unaffected. (Insert is not: see the MySQL documentation.)
func TestMySQLClientFoundRows(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	s := e.storeOn(t, reopenMySQL(t, e.db, func(c *mysql.Config) { c.ClientFoundRows = true }, nil))
	e.enqueue(t, myMsgs(3)...)
	recs := e.claim(t, s, myClaimOpts(3))
	require.Len(t, recs, 3)
	forged := recs[2].Lease()
	forged.Token = uuid.New()
	var lost *outbox.LeaseLostError
	require.True(t, errors.As(s.Extend(e.ctx, time.Hour, recs[0].Lease(), forged), &lost))
	require.Equal(t, []uuid.UUID{recs[2].ID}, lost.IDs)
	require.True(t, errors.As(s.Ack(e.ctx, recs[0].Lease(), recs[1].Lease(), forged), &lost))
	require.Equal(t, []uuid.UUID{recs[2].ID}, lost.IDs)
	require.ErrorIs(t, s.Ack(e.ctx, recs[0].Lease()), outbox.ErrLeaseLost)
	e.expire(t, recs[2].ID)
	buried, err := s.Bury(e.ctx, outbox.Scope{}, 1, 10)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{recs[2].ID}, buried)
}

// TestMySQLConcurrentReclaims expires 600 leases at once and lets 8 claimers take them
// over: each row is reclaimed exactly once, with its second attempt.
func TestMySQLConcurrentReclaims(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	const rows, claimers = 600, 8
	e.enqueue(t, myMsgs(rows)...)
	require.Len(t, e.claim(t, e.store, myClaimOpts(rows)), rows)
	require.EqualValues(t, rows, e.exec(t, "UPDATE $table SET locked_until = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND"))
	var (
		mu       sync.Mutex
		counts   = map[uuid.UUID]int{}
		attempts = map[int]int{}
		seen     atomic.Int64
		errs     = make(chan error, claimers)
		wg       sync.WaitGroup
	)
	for w := range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := outbox.ClaimOptions{Limit: 20, Lease: time.Hour, MaxAttempts: 5, WorkerID: fmt.Sprintf("w-%d", w)}
			for seen.Load() < rows && e.ctx.Err() == nil {
				recs, err := e.store.Claim(e.ctx, o)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for _, r := range recs {
					counts[r.ID]++
					attempts[r.Attempts]++
				}
				mu.Unlock()
				seen.Add(int64(len(recs)))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, counts, rows)
	for id, n := range counts {
		require.Equal(t, 1, n, "row %s", id)
	}
	require.Equal(t, map[int]int{2: rows}, attempts, "every reclaim is the second attempt")
}

// TestMySQLFailedInsertReleasesItsKeys: when the outbox insert fails after the keys were
// reserved, the reservations are removed, so even a caller that commits anyway does not
// leave a key taken by an event that does not exist.
func TestMySQLFailedInsertReleasesItsKeys(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "outbox_events")
	// A trigger makes the outbox insert fail after the dedupe step succeeded.
	_, err := e.db.ExecContext(e.ctx, "CREATE TRIGGER fail_outbox BEFORE INSERT ON outbox_events FOR EACH ROW "+
		"SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'injected failure'")
	require.NoError(t, err)
	tx, err := e.db.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	m := myMsg(1)
	m.DedupeKey = "k"
	_, err = e.store.Enqueue(e.ctx, tx, m)
	require.ErrorContains(t, err, "injected failure")
	require.NoError(t, tx.Commit(), "a careless caller commits after the error")
	var keys int
	require.NoError(t, e.db.QueryRowContext(e.ctx, "SELECT COUNT(*) FROM outbox_events_dedupe").Scan(&keys))
	require.Zero(t, keys, "the reservation was released")

	_, err = e.db.ExecContext(e.ctx, "DROP TRIGGER fail_outbox")
	require.NoError(t, err)
	r, err := dialecttest.EnqueueOne(e.store, e.ctx, m)
	require.NoError(t, err)
	require.False(t, r.Duplicate, "the key is free")
}

// TestMySQLFailedBatchLeavesNothing: a batch past 1000 rows spans several statements on
// MySQL; when a later one fails, a caller that commits anyway keeps none of the batch:
// neither the outbox rows of the chunks that went in nor any reserved key.
func TestMySQLFailedBatchLeavesNothing(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, trigger string
	}{
		// The second outbox INSERT (rows 1000..1499) meets the failing row.
		{"insert", "CREATE TRIGGER fail_batch BEFORE INSERT ON outbox_events FOR EACH ROW " +
			"IF NEW.topic = 'boom' THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'injected failure'; END IF"},
		// The second key reservation (keys in order: the last 500) meets the failing key.
		{"reserve", "CREATE TRIGGER fail_batch BEFORE INSERT ON outbox_events_dedupe FOR EACH ROW " +
			"IF NEW.dedupe_key = 'k-1499' THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'injected failure'; END IF"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := setupMySQL(t, "outbox_events")
			_, err := e.db.ExecContext(e.ctx, c.trigger)
			require.NoError(t, err)
			msgs := make([]outbox.Message, 1500)
			for i := range msgs {
				msgs[i] = myMsg(i)
				msgs[i].DedupeKey = fmt.Sprintf("k-%04d", i)
			}
			msgs[1200].Topic = "boom"
			tx, err := e.db.BeginTx(e.ctx, nil)
			require.NoError(t, err)
			_, err = e.store.EnqueueBatch(e.ctx, tx, msgs)
			require.ErrorContains(t, err, "injected failure")
			require.NoError(t, tx.Commit(), "a careless caller commits after the error")
			for _, table := range []string{"outbox_events", "outbox_events_dedupe"} {
				var n int
				require.NoError(t, e.db.QueryRowContext(e.ctx, "SELECT COUNT(*) FROM "+table).Scan(&n))
				require.Zero(t, n, "%s keeps nothing of the failed batch", table)
			}
		})
	}
}

// afterFirstQuery is a DBTX that runs hook once, after the first query it passes on: as if
// another worker acted between a dialect's read and its next statement.
type afterFirstQuery struct {
	dialect.DBTX
	hook func()
	done bool
}

func (q *afterFirstQuery) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	rows, err := q.DBTX.QueryContext(ctx, query, args...)
	if !q.done {
		q.done = true
		q.hook()
	}
	return rows, err
}

// TestMySQLBuryRechecksCandidates: Bury reads its candidates without locking and updates
// them by primary key afterwards. A candidate whose lease was renewed in between (its worker
// was alive after all) must be left alone, and Bury reports only the rows it buried. Both
// sweeps are checked.
func TestMySQLBuryRechecksCandidates(t *testing.T) {
	for _, expiredOnly := range []bool{false, true} {
		t.Run(fmt.Sprintf("ExpiredOnly=%v", expiredOnly), func(t *testing.T) {
			e := setupMySQL(t, "")
			e.enqueue(t, myMsg(0), myMsg(1))
			recs := e.claim(t, e.store, myClaimOpts(2))
			require.Len(t, recs, 2)
			gone, renewed := recs[0], recs[1]
			e.expire(t, gone.ID, renewed.ID)
			q := &afterFirstQuery{DBTX: e.db, hook: func() {
				require.EqualValues(t, 1, e.exec(t, "UPDATE $table SET locked_until = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR WHERE id = ?", renewed.ID[:]))
			}}
			buried, err := outbox.MySQL().Bury(e.ctx, q, e.store.Table(), dialect.BuryParams{
				MaxAttempts: 1, Limit: 10, Reason: "test", Token: uuid.New(), ExpiredOnly: expiredOnly})
			require.NoError(t, err)
			require.True(t, q.done, "the hook ran after the candidate read")
			require.Equal(t, []uuid.UUID{gone.ID}, buried)
			require.Equal(t, outbox.StatusDead, e.get(t, gone.ID).Status)
			require.Equal(t, outbox.StatusProcessing, e.get(t, renewed.ID).Status, "the renewed lease protects its row")
		})
	}
}

// A payload that Options.MaxPayloadBytes lets pass but the server's max_allowed_packet (16 MiB
// on MariaDB by default) refuses fails with an error that names the setting to change, not
// only the server's "Error 1153". (go-sql-driver's own maxAllowedPacket does not refuse an
// enqueue: it sends a bound payload bigger than that in chunks, and does not interpolate
// one; TestPacketTooLarge covers its error.)
func TestMySQLPacketTooLargeNamesTheSetting(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	var serverMax int
	require.NoError(t, e.db.QueryRowContext(e.ctx, `SELECT @@max_allowed_packet`).Scan(&serverMax))
	payload := func(n int) json.RawMessage { return json.RawMessage(`"` + strings.Repeat("x", n) + `"`) }
	enqueue := func(db *sql.DB, n int) error {
		s, err := outbox.New(db, outbox.MySQL(), outbox.Options{MaxPayloadBytes: 1 << 30})
		require.NoError(t, err)
		tx, err := db.BeginTx(e.ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		_, err = s.Enqueue(e.ctx, tx, outbox.Message{Namespace: "n", Topic: "t", Payload: payload(n)})
		return err
	}

	if serverMax < 256<<20 { // the server's own limit, where a test can reach it
		err := enqueue(e.db, serverMax+1024)
		if !errors.Is(err, driver.ErrBadConn) {
			// The driver read the server's error before the connection closed.
			require.ErrorIs(t, err, outbox.ErrMisconfigured)
		}
		require.ErrorContains(t, err, "max_allowed_packet")
		require.ErrorContains(t, err, "Options.MaxPayloadBytes")
		require.ErrorContains(t, err, "SET GLOBAL max_allowed_packet")
	}

	// Options.MaxPayloadBytes itself is named when it refuses a payload.
	_, err := dialecttest.EnqueueOne(e.store, e.ctx, outbox.Message{Namespace: "n", Topic: "t", Payload: payload(outbox.DefaultMaxPayloadBytes)})
	require.ErrorIs(t, err, outbox.ErrInvalid)
	require.ErrorContains(t, err, "(Options.MaxPayloadBytes)")
}

// TestMySQLMissingStripe: a dedupe key whose lock stripe is missing from <table>_dedupe_lock
// (a table not migrated up to date, or emptied by hand) fails the enqueue with a CheckError
// that says to migrate; it is never reported as a duplicate, and nothing is written.
func TestMySQLMissingStripe(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	_, err := e.db.ExecContext(e.ctx, "DELETE FROM outbox_events_dedupe_lock")
	require.NoError(t, err)
	m, m2 := myMsg(1), myMsg(3)
	m.DedupeKey, m2.DedupeKey = "k", "k2"
	// One key (the short statement) and two (the derived table).
	for _, batch := range [][]outbox.Message{{m, myMsg(2)}, {m, m2, myMsg(2)}} {
		tx, err := e.db.BeginTx(e.ctx, nil)
		require.NoError(t, err)
		_, err = e.store.EnqueueBatch(e.ctx, tx, batch)
		require.ErrorIs(t, err, outbox.ErrMisconfigured)
		require.ErrorContains(t, err, "outbox migrate up")
		require.NoError(t, tx.Commit())
	}
	var n int
	require.NoError(t, e.db.QueryRowContext(e.ctx, "SELECT (SELECT COUNT(*) FROM outbox_events) + (SELECT COUNT(*) FROM outbox_events_dedupe)").Scan(&n))
	require.Zero(t, n, "nothing written")
}

// TestMySQLRunShareSkipsHeldHeads: a claim that takes a share of the heads it found skips
// the heads another claimer holds locked and takes the next ones, as an unshared claim
// does, rather than coming back empty while a head it found is free.
func TestMySQLRunShareSkipsHeldHeads(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "outbox_review_share")
	require.NoError(t, migrations.Up(e.ctx, e.db, "mysql", migrations.Options{Table: e.table, Ordered: true}))
	msgs := []outbox.Message{myMsg(0), myMsg(1), myMsg(2)}
	for i, k := range []string{"a", "b", "c"} {
		msgs[i].PartitionKey = k
	}
	ids := resultIDsMy(e.enqueue(t, msgs...))
	// Another claimer's transaction, not yet committed, holds the two oldest heads.
	// Read committed and by primary key, as a claim locks: the two rows alone.
	held, err := e.db.BeginTx(e.ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	require.NoError(t, err)
	defer func() { _ = held.Rollback() }()
	rows, err := held.QueryContext(e.ctx, "SELECT id FROM `"+e.table+"` FORCE INDEX (PRIMARY) WHERE id IN (?, ?) FOR UPDATE", ids[0][:], ids[1][:])
	require.NoError(t, err)
	require.NoError(t, rows.Close())

	o := myClaimOpts(10)
	o.Scope = outbox.Scope{Namespace: "orders"}
	o.Ordered, o.Runs, o.RunShare = true, true, 4
	recs := e.claim(t, e.store, o)
	require.Equal(t, []uuid.UUID{ids[2]}, myIDs(recs), "the free head is taken: a share of one of the three heads found")
}

func resultIDsMy(res []outbox.Result) []uuid.UUID {
	ids := make([]uuid.UUID, len(res))
	for i, r := range res {
		ids[i] = r.ID
	}
	return ids
}

// myOrderedRows makes table with the ordered migration set, enqueues one row per key in
// keys, in that order, and returns their ids and the options of an ordered claim of limit
// rows with runs.
func myOrderedRows(t *testing.T, table string, limit int, keys ...string) (*myEnv, []uuid.UUID, outbox.ClaimOptions) {
	t.Helper()
	e := setupMySQL(t, table)
	require.NoError(t, migrations.Up(e.ctx, e.db, "mysql", migrations.Options{Table: e.table, Ordered: true}))
	msgs := make([]outbox.Message, len(keys))
	for i, k := range keys {
		msgs[i] = myMsg(i)
		msgs[i].PartitionKey = k
	}
	o := myClaimOpts(limit)
	o.Scope = outbox.Scope{Namespace: "orders"}
	o.Ordered, o.Runs = true, true
	return e, resultIDsMy(e.enqueue(t, msgs...)), o
}

// A settle-and-claim that would continue more keys than half its batch (a row or so each)
// searches for heads instead, oldest first: here another key's head and the continued keys'
// next rows, where continuing would have taken those keys' rows alone.
func TestMySQLContinueManyKeysSearchesHeads(t *testing.T) {
	t.Parallel()
	e, ids, o := myOrderedRows(t, "outbox_continue_many", 3, "a", "b", "c", "d", "a", "b", "c")
	first := e.claim(t, e.store, o)
	require.Equal(t, ids[:3], myIDs(first))
	outs := make([]outbox.Outcome, len(first))
	for i, r := range first {
		outs[i] = outbox.Outcome{Lease: r.Lease(), Status: outbox.StatusDelivered}
	}
	o.Continue = true
	next, lost, err := e.store.CompleteAndClaim(e.ctx, outs, o)
	require.NoError(t, err)
	require.Empty(t, lost)
	require.Equal(t, ids[3:6], myIDs(next), "key d's head, then a's and b's next rows: the oldest heads")
}

// TestMySQLContinues: MySQL honours Continue, which the conformance suite only checks when
// a dialect does (OrderedClaimer/RunsContinue skips otherwise): the delivered key's next run
// comes before another key's older head.
func TestMySQLContinues(t *testing.T) {
	t.Parallel()
	e, ids, o := myOrderedRows(t, "outbox_continues", 1, "a", "b", "a", "a")
	first := e.claim(t, e.store, o)
	require.Equal(t, ids[:1], myIDs(first))
	o.Limit, o.Continue = 2, true
	next, lost, err := e.store.CompleteAndClaim(e.ctx, []outbox.Outcome{{Lease: first[0].Lease(), Status: outbox.StatusDelivered}}, o)
	require.NoError(t, err)
	require.Empty(t, lost)
	require.Equal(t, []uuid.UUID{ids[2], ids[3]}, myIDs(next), "a's run, before b's older head")
}
