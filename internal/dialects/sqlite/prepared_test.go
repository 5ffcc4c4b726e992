package sqlite_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"modernc.org/sqlite"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
)

// TestSQLiteHotStatementsRunPrepared: once a Store has prepared its hot statements, a
// claim and an ack send none of them to the driver as unprepared text. The driver is
// wrapped so that every statement database/sql runs unprepared (QueryContext, ExecContext
// on the connection) is recorded apart from the runs of prepared statements. Counting how
// many statements are cached (TestSQLiteOneConnectionPool) would not notice the cached ones
// going unused.
func TestSQLiteHotStatementsRunPrepared(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, db, rec := newLoggedSQLiteStore(ctx, t)

	require.NoError(t, s.Ack(ctx, enqueueAndClaim(ctx, t, s, db, 3)...)) // prepares them
	rec.reset()
	require.NoError(t, s.Ack(ctx, enqueueAndClaim(ctx, t, s, db, 3)...))
	var hot []string
	for _, q := range rec.all() {
		for _, mark := range []string{`SELECT 1 FROM`, `SET status = 'processing'`, `SET status = 'delivered'`} {
			if strings.Contains(q, mark) {
				hot = append(hot, q)
			}
		}
	}
	require.Empty(t, hot, "the probe, the claim and the ack run prepared")
	require.NotEmpty(t, rec.all(), "the wrapper sees unprepared statements (the enqueue's INSERT)")
}

// TestSQLiteOrderedLeaseRunsPrepared: an ordered claim's lease, alone and after a settle in
// one transaction, runs prepared once warm: the race detector slows SQLite's parser some
// twenty times, and eight ordered publishers spent a third of their time parsing.
func TestSQLiteOrderedLeaseRunsPrepared(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, db, rec := newLoggedSQLiteStore(ctx, t)
	require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{Ordered: true}))
	for _, k := range []string{"a", "b", "c", "d"} {
		_, err := s.EnqueueStandalone(ctx, outbox.Message{Namespace: "n", Topic: "t", PartitionKey: k, Payload: []byte(`{}`)})
		require.NoError(t, err)
	}
	o := outbox.ClaimOptions{Scope: outbox.Scope{Namespace: "n"}, Limit: 1, Lease: time.Minute, MaxAttempts: 5, WorkerID: "w", Ordered: true}
	claimAndSettle := func() {
		recs, err := s.Claim(ctx, o)
		require.NoError(t, err)
		require.Len(t, recs, 1)
		recs, _, err = s.CompleteAndClaim(ctx, []outbox.Outcome{{Lease: recs[0].Lease(), Status: outbox.StatusDelivered}}, o)
		require.NoError(t, err)
		require.Len(t, recs, 1)
		require.NoError(t, s.Ack(ctx, recs[0].Lease()))
	}
	claimAndSettle() // prepares them
	rec.reset()
	claimAndSettle()
	for _, q := range rec.all() {
		require.NotContains(t, q, `SET status = 'processing'`, "the ordered lease runs prepared")
	}
	require.Equal(t, 2, rec.preparedRuns(`SET status = 'processing'`), "the claim's lease and the settle's")
}

// TestSQLiteRunsPrepared: the run claim's read and lease run prepared whatever the number
// of heads and rows: their texts do not depend on them, so a warm claim parses neither.
func TestSQLiteRunsPrepared(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, db, rec := newLoggedSQLiteStore(ctx, t)
	require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{Ordered: true}))
	o := outbox.ClaimOptions{Scope: outbox.Scope{Namespace: "n"}, Limit: 100, Lease: time.Minute, MaxAttempts: 5, WorkerID: "w", Ordered: true, Runs: true}
	claimRuns := func(keys []string, rows int) {
		var msgs []outbox.Message
		for i := range rows {
			for _, k := range keys {
				msgs = append(msgs, outbox.Message{Namespace: "n", Topic: "t", PartitionKey: k, Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))})
			}
		}
		_, err := s.EnqueueStandalone(ctx, msgs...)
		require.NoError(t, err)
		recs, err := s.Claim(ctx, o)
		require.NoError(t, err)
		require.Len(t, recs, len(msgs), "every key's run")
		var leases []outbox.Lease
		for _, r := range recs {
			leases = append(leases, r.Lease())
		}
		require.NoError(t, s.Ack(ctx, leases...))
	}
	claimRuns([]string{"a", "b"}, 2) // prepares them
	rec.reset()
	claimRuns([]string{"c", "d", "e"}, 4)
	for _, q := range rec.all() {
		require.NotContains(t, q, `json_each`, "the run read and the run lease run prepared")
	}
	require.Equal(t, 2, rec.preparedRuns(`json_each`), "the run read and the run lease")
}

// newLoggedSQLiteStore returns a Store on a new, migrated SQLite database whose driver
// records what it runs (unpreparedLog), the database, and the record.
func newLoggedSQLiteStore(ctx context.Context, t *testing.T) (*outbox.Store, *sql.DB, *unpreparedLog) {
	t.Helper()
	rec := &unpreparedLog{}
	db := sql.OpenDB(unpreparedConnector{dsn: testdb.SQLiteDSN(filepath.Join(t.TempDir(), "outbox.db")), log: rec})
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{}))
	s, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	require.NoError(t, err)
	return s, db, rec
}

// unpreparedLog records the statements database/sql sends to the driver unprepared, and
// apart from them every run of a prepared statement.
type unpreparedLog struct {
	mu       sync.Mutex
	queries  []string
	prepared []string
}

func (l *unpreparedLog) addPrepared(q string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.prepared = append(l.prepared, q)
}

// preparedRuns returns how many runs of prepared statements contained mark.
func (l *unpreparedLog) preparedRuns(mark string) (n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, q := range l.prepared {
		if strings.Contains(q, mark) {
			n++
		}
	}
	return n
}

func (l *unpreparedLog) add(q string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.queries = append(l.queries, q)
}

func (l *unpreparedLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.queries, l.prepared = nil, nil
}

func (l *unpreparedLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.queries...)
}

// every returns every statement run, unprepared and prepared.
func (l *unpreparedLog) every() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append(append([]string(nil), l.queries...), l.prepared...)
}

type unpreparedConnector struct {
	dsn string
	log *unpreparedLog
}

func (c unpreparedConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := (&sqlite.Driver{}).Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return unpreparedConn{conn.(sqliteDriverConn), c.log}, nil
}

func (unpreparedConnector) Driver() driver.Driver { return &sqlite.Driver{} }

type sqliteDriverConn interface {
	driver.Conn
	driver.ConnPrepareContext
	driver.ConnBeginTx
	driver.QueryerContext
	driver.ExecerContext
}

type unpreparedConn struct {
	sqliteDriverConn
	log *unpreparedLog
}

func (c unpreparedConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	c.log.add(q)
	return c.sqliteDriverConn.QueryContext(ctx, q, args)
}

func (c unpreparedConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	c.log.add(q)
	return c.sqliteDriverConn.ExecContext(ctx, q, args)
}

func (c unpreparedConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	st, err := c.sqliteDriverConn.PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	return loggedStmt{st.(sqliteDriverStmt), q, c.log}, nil
}

type sqliteDriverStmt interface {
	driver.Stmt
	driver.StmtExecContext
	driver.StmtQueryContext
}

type loggedStmt struct {
	sqliteDriverStmt
	q   string
	log *unpreparedLog
}

func (s loggedStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	s.log.addPrepared(s.q)
	return s.sqliteDriverStmt.QueryContext(ctx, args)
}

func (s loggedStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.log.addPrepared(s.q)
	return s.sqliteDriverStmt.ExecContext(ctx, args)
}

// TestSQLiteClaimSkipsProbeDuringBacklog: a claim probes for eligible rows before it takes
// the write lock, except right after a claim of the same scope came back full; a short or
// failed claim turns the probe back on. Five rows, claims of two.
func TestSQLiteClaimSkipsProbeDuringBacklog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _, rec := newLoggedSQLiteStore(ctx, t)
	msgs := make([]outbox.Message, 5)
	for i := range msgs {
		msgs[i] = outbox.Message{Namespace: "n", Topic: "t", Payload: json.RawMessage(`{}`)}
	}
	_, err := s.EnqueueStandalone(ctx, msgs...)
	require.NoError(t, err)

	claim := func(ctx context.Context, ns string) (int, error) {
		recs, err := s.Claim(ctx, outbox.ClaimOptions{Scope: outbox.Scope{Namespace: ns}, Limit: 2, Lease: time.Minute, MaxAttempts: 5, WorkerID: "w"})
		return len(recs), err
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	steps := []struct {
		what           string
		ctx            context.Context
		ns             string
		got            int
		fails          bool
		probes, claims int // prepared runs so far
	}{
		{"first claim: probe, full", ctx, "n", 2, false, 1, 1},
		{"another scope has no backlog of its own: probe, nothing, no lock", ctx, "other", 0, false, 2, 1},
		{"backlog: no probe, full", ctx, "n", 2, false, 2, 2},
		{"backlog: no probe, the claim fails", cancelled, "n", 0, true, 2, 2},
		{"after a failure: probe, one row (short)", ctx, "n", 1, false, 3, 3},
		{"after a short claim: probe, nothing, no lock", ctx, "n", 0, false, 4, 3},
	}
	for _, st := range steps {
		got, err := claim(st.ctx, st.ns)
		if st.fails {
			require.Error(t, err, st.what)
		} else {
			require.NoError(t, err, st.what)
		}
		require.Equal(t, st.got, got, st.what)
		require.Equal(t, st.probes, rec.preparedRuns(`SELECT 1 FROM`), "probes: "+st.what)
		require.Equal(t, st.claims, rec.preparedRuns(`SET status = 'processing'`), "claim statements: "+st.what)
	}
}

// TestOrderedCheckRunsOnce: a Store looks for the order index before its first ordered claim
// and BlockedKeys, and not again once it was found: the claims' hot path runs no extra query.
func TestOrderedCheckRunsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, db, rec := newLoggedSQLiteStore(ctx, t)
	require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{Ordered: true}))
	_, err := s.EnqueueStandalone(ctx, outbox.Message{Namespace: "n", Topic: "t", PartitionKey: "k", Payload: []byte(`{}`)})
	require.NoError(t, err)
	rec.reset()
	o := outbox.ClaimOptions{Scope: outbox.Scope{Namespace: "n"}, Limit: 10, Lease: time.Minute, MaxAttempts: 5, WorkerID: "w", Ordered: true}
	for range 3 {
		_, err := s.Claim(ctx, o)
		require.NoError(t, err)
		_, _, err = s.CompleteAndClaim(ctx, nil, o)
		require.NoError(t, err)
		_, err = s.BlockedKeys(ctx, outbox.Scope{}, 10)
		require.NoError(t, err)
	}
	var checks int
	for _, q := range rec.all() {
		if strings.Contains(q, "sqlite_master") {
			checks++
		}
	}
	require.Equal(t, 1, checks, "the order index is looked for once per Store")
}
