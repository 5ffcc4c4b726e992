package inbox_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/inbox"
	"github.com/outboxgo/outbox/internal/testdb"
)

// The suite runs every test on every built-in backend, each on a fresh database.
var backends = []string{"postgres", "mysql", "sqlite"}

var suite = []struct {
	name string
	fn   func(t *testing.T, e *env)
}{
	{"ProcessOnce", testProcessOnce},
	{"ConcurrentDeliveriesRunHandlerOnce", testConcurrentDeliveries},
	{"ConcurrentDeliveriesAfterFailedFirst", testConcurrentAfterFailedFirst},
	{"CrashBeforeCommitIsProcessedOnRedelivery", testCrashBeforeCommit},
	{"CancelBeforeCommitIsProcessedOnRedelivery", testCancelBeforeCommit},
	{"CancelWhileWaitingForAnotherDelivery", testCancelWhileWaiting},
	{"HandlerErrorRollsBack", testHandlerError},
	{"HandlerPanicRollsBack", testHandlerPanic},
	{"GroupsAreIndependent", testGroups},
	{"ClaimOnCallersTx", testClaimOnCallersTx},
	{"PurgeInBatchesKeepsYoungRows", testPurge},
	{"PurgeWhileDelivering", testPurgeWhileDelivering},
	{"BadInput", testBadInput},
	{"MigrationsUpDownUp", testMigrations},
	{"OneConnectionPool", testOneConnectionPool},
}

func TestInbox(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			for _, tc := range suite {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					tc.fn(t, setup(t, b))
				})
			}
		})
	}
}

// env is one test's database with a migrated inbox table of a random name (so that lock
// waits on it can be told apart from other tests' on a shared server) and a business table,
// effects, that handlers write to.
type env struct {
	ctx     context.Context
	backend string
	db      *sql.DB
	table   string
	in      *inbox.Inbox
}

func setup(t testing.TB, backend string) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	db := testdb.Open(t, backend)
	table := "inbox_" + randomHex(6)
	require.NoError(t, inbox.MigrateUp(ctx, db, backend, inbox.MigrateOptions{Table: table}))
	text := "VARCHAR" // MySQL's VARCHAR compares case-insensitively; VARBINARY byte for byte
	if backend == "mysql" {
		text = "VARBINARY"
	}
	_, err := db.ExecContext(ctx, `CREATE TABLE effects (grp `+text+`(128) NOT NULL, message_id `+text+`(255) NOT NULL)`)
	require.NoError(t, err)
	in, err := inbox.New(db, backend, inbox.Options{Table: table})
	require.NoError(t, err)
	return &env{ctx: ctx, backend: backend, db: db, table: table, in: in}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// bind rewrites "?" placeholders as "$n" on PostgreSQL.
func (e *env) bind(query string) string { return testdb.Rebind(e.backend, query) }

// effect is the business write of a handler: one row in effects, with no unique key, so a
// handler that ran twice leaves two rows.
func (e *env) effect(group, id string) inbox.Handler {
	return func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, e.bind(`INSERT INTO effects (grp, message_id) VALUES (?, ?)`), group, id)
		return err
	}
}

func (e *env) effects(t *testing.T, group, id string) int {
	t.Helper()
	var n int
	require.NoError(t, e.db.QueryRowContext(e.ctx, e.bind(`SELECT COUNT(*) FROM effects WHERE grp = ? AND message_id = ?`), group, id).Scan(&n))
	return n
}

func (e *env) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, e.db.QueryRowContext(e.ctx, `SELECT COUNT(*) FROM `+table).Scan(&n))
	return n
}

// lockWaiters counts sessions waiting for a lock on the test's inbox table, or returns
// -1 where that cannot be observed (SQLite's writers wait in the busy handler).
func (e *env) lockWaiters(t testing.TB) int {
	var q string
	switch e.backend {
	case "postgres":
		q = `SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%` + e.table + `%'`
	case "mysql":
		// MariaDB's innodb_trx misses some waiting transactions; a session still executing
		// the claim while the first delivery's handler runs can only be waiting for it.
		q = "SELECT COUNT(*) FROM information_schema.processlist WHERE db = DATABASE() AND command IN ('Query', 'Execute')" +
			" AND info LIKE 'INSERT %`" + e.table + "`%'"
	default:
		return -1
	}
	var n int
	if err := e.db.QueryRowContext(e.ctx, q).Scan(&n); err != nil {
		t.Errorf("count lock waiters: %v", err) // may run on a handler's goroutine: no FailNow
		return -1
	}
	return n
}

// awaitWaiters polls until n sessions wait for a lock on the inbox table, failing t after
// a deadline. It returns at once where waiters cannot be observed.
func (e *env) awaitWaiters(t testing.TB, n int) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		got := e.lockWaiters(t)
		if got < 0 || got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%d deliveries wait for the first one's transaction, want %d", got, n)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func testProcessOnce(t *testing.T, e *env) {
	res, err := e.in.Process(e.ctx, "billing", "m-1", e.effect("billing", "m-1"))
	require.NoError(t, err)
	require.False(t, res.Duplicate)
	for range 3 {
		res, err = e.in.Process(e.ctx, "billing", "m-1", func(context.Context, *sql.Tx) error {
			t.Error("the handler ran for a duplicate")
			return nil
		})
		require.NoError(t, err)
		require.True(t, res.Duplicate)
	}
	require.Equal(t, 1, e.effects(t, "billing", "m-1"))
	require.Equal(t, 1, e.count(t, e.table))
}

// deliver runs process n times concurrently, all released at once, and returns their
// results and errors.
func deliver(n int, process func() (inbox.Result, error)) ([]inbox.Result, []error) {
	results, errs := make([]inbox.Result, n), make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], errs[i] = process()
		})
	}
	close(start)
	wg.Wait()
	return results, errs
}

func testConcurrentDeliveries(t *testing.T, e *env) {
	const n = 16
	var runs atomic.Int32
	results, errs := deliver(n, func() (inbox.Result, error) {
		return e.in.Process(e.ctx, "billing", "m-1", func(ctx context.Context, tx *sql.Tx) error {
			if runs.Add(1) == 1 {
				// Hold the first delivery's transaction open until every other delivery
				// waits for it, so that they truly race for the key.
				e.awaitWaiters(t, n-1)
			}
			return e.effect("billing", "m-1")(ctx, tx)
		})
	})
	processed := 0
	for i := range n {
		require.NoError(t, errs[i], "delivery %d", i)
		if !results[i].Duplicate {
			processed++
		}
	}
	require.Equal(t, 1, processed, "exactly one delivery processes the message")
	require.EqualValues(t, 1, runs.Load(), "the handler ran once")
	require.Equal(t, 1, e.effects(t, "billing", "m-1"), "its effect happened once")
}

// testConcurrentAfterFailedFirst: the first delivery's handler fails while the others wait
// for it. Its rollback hands the key to one of them; the rest are duplicates, and none of
// them fails (on InnoDB most waiters' claims deadlock here, and Process begins them again).
func testConcurrentAfterFailedFirst(t *testing.T, e *env) {
	const n = 16
	boom := errors.New("boom")
	var runs atomic.Int32
	results, errs := deliver(n, func() (inbox.Result, error) {
		return e.in.Process(e.ctx, "billing", "m-1", func(ctx context.Context, tx *sql.Tx) error {
			if err := e.effect("billing", "m-1")(ctx, tx); err != nil {
				return err
			}
			if runs.Add(1) == 1 {
				e.awaitWaiters(t, n-1)
				return boom
			}
			return nil
		})
	})
	failed, processed := 0, 0
	for i := range n {
		switch {
		case errors.Is(errs[i], boom):
			failed++
		case errs[i] != nil:
			t.Errorf("delivery %d: %v", i, errs[i])
		case !results[i].Duplicate:
			processed++
		}
	}
	require.Equal(t, 1, failed)
	require.Equal(t, 1, processed, "one waiter takes over the failed delivery's key")
	require.EqualValues(t, 2, runs.Load())
	require.Equal(t, 1, e.effects(t, "billing", "m-1"))
}

// testCrashBeforeCommit runs a delivery in a child process that is killed with SIGKILL
// after its handler wrote and before it committed; the redelivery processes the message
// once.
func testCrashBeforeCommit(t *testing.T, e *env) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		crashEnv+"=1",
		"INBOX_CRASH_BACKEND="+e.backend,
		"INBOX_CRASH_DSN="+e.dsn(t),
		"INBOX_CRASH_TABLE="+e.table,
	)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(out).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		require.Equal(t, "handled\n", s, "the child's handler ran")
	case <-time.After(30 * time.Second):
		t.Fatal("the child's handler did not run")
	}
	require.NoError(t, cmd.Process.Kill())
	killed = true
	_ = cmd.Wait()

	require.Zero(t, e.effects(t, "billing", "m-1"), "the killed delivery left no effect")
	res, err := e.in.Process(e.ctx, "billing", "m-1", e.effect("billing", "m-1"))
	require.NoError(t, err)
	require.False(t, res.Duplicate, "the redelivery processes the message")
	res, err = e.in.Process(e.ctx, "billing", "m-1", e.effect("billing", "m-1"))
	require.NoError(t, err)
	require.True(t, res.Duplicate)
	require.Equal(t, 1, e.effects(t, "billing", "m-1"))
}

// dsn returns a DSN on the test's own database, for a child process.
func (e *env) dsn(t *testing.T) string {
	t.Helper()
	return testdb.DSN(t, e.backend, e.db)
}

func (e *env) mysqlConfig(t *testing.T) *mysql.Config {
	t.Helper()
	cfg, err := mysql.ParseDSN(testdb.MySQLDSN())
	require.NoError(t, err)
	require.NoError(t, e.db.QueryRowContext(e.ctx, `SELECT DATABASE()`).Scan(&cfg.DBName))
	return cfg
}

// crashEnv, when set, makes the test binary the child of testCrashBeforeCommit.
const crashEnv = "INBOX_CRASH_CHILD"

// crashChild processes m-1 with a handler that writes its effect, reports it on stdout and
// blocks, waiting to be killed.
func crashChild() {
	driver := map[string]string{"postgres": "pgx", "mysql": "mysql", "sqlite": "sqlite"}[os.Getenv("INBOX_CRASH_BACKEND")]
	db, err := sql.Open(driver, os.Getenv("INBOX_CRASH_DSN"))
	if err == nil {
		var in *inbox.Inbox
		in, err = inbox.New(db, os.Getenv("INBOX_CRASH_BACKEND"), inbox.Options{Table: os.Getenv("INBOX_CRASH_TABLE")})
		if err == nil {
			_, err = in.Process(context.Background(), "billing", "m-1", func(ctx context.Context, tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, `INSERT INTO effects (grp, message_id) VALUES ('billing', 'm-1')`); err != nil {
					return err
				}
				fmt.Println("handled")
				select {} // killed here, before the commit
			})
		}
	}
	fmt.Fprintln(os.Stderr, "crash child:", err)
	os.Exit(2)
}

func TestMain(m *testing.M) {
	if os.Getenv(crashEnv) != "" {
		crashChild()
	}
	os.Exit(m.Run())
}

// testCancelBeforeCommit: the delivery's context ends after the handler wrote; database/sql
// rolls the transaction back, and the redelivery processes the message once.
func testCancelBeforeCommit(t *testing.T, e *env) {
	ctx, cancel := context.WithCancel(e.ctx)
	_, err := e.in.Process(ctx, "billing", "m-1", func(ctx context.Context, tx *sql.Tx) error {
		if err := e.effect("billing", "m-1")(ctx, tx); err != nil {
			return err
		}
		cancel()
		return nil
	})
	require.Error(t, err)
	require.Zero(t, e.effects(t, "billing", "m-1"))
	require.Zero(t, e.count(t, e.table))
	res, err := e.in.Process(e.ctx, "billing", "m-1", e.effect("billing", "m-1"))
	require.NoError(t, err)
	require.False(t, res.Duplicate)
	require.Equal(t, 1, e.effects(t, "billing", "m-1"))
}

// testCancelWhileWaiting: a delivery waiting for a concurrent one of the same message gives
// up when its context ends, without running its handler, and leaves the first one alone.
func testCancelWhileWaiting(t *testing.T, e *env) {
	started, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	releaseFirst := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(releaseFirst) // a failing test must not leave the first delivery blocked
	first := make(chan error, 1)
	go func() {
		_, err := e.in.Process(e.ctx, "billing", "m-1", func(ctx context.Context, tx *sql.Tx) error {
			close(started)
			<-release
			return e.effect("billing", "m-1")(ctx, tx)
		})
		first <- err
	}()
	select {
	case <-started:
	case err := <-first:
		t.Fatalf("the first delivery ended before its handler ran: %v", err)
	}

	ctx, cancel := context.WithCancel(e.ctx)
	second := make(chan error, 1)
	go func() {
		_, err := e.in.Process(ctx, "billing", "m-1", func(context.Context, *sql.Tx) error {
			t.Error("the waiting delivery ran its handler")
			return nil
		})
		second <- err
	}()
	e.awaitWaiters(t, 1)
	cancel()
	select {
	case err := <-second:
		require.Error(t, err, "the cancelled delivery reports its failure")
	case <-time.After(30 * time.Second):
		t.Fatal("the cancelled delivery kept waiting")
	}
	releaseFirst()
	require.NoError(t, <-first)
	require.Equal(t, 1, e.effects(t, "billing", "m-1"))
	res, err := e.in.Process(e.ctx, "billing", "m-1", e.effect("billing", "m-1"))
	require.NoError(t, err)
	require.True(t, res.Duplicate)
}

func testHandlerError(t *testing.T, e *env) {
	boom := errors.New("boom")
	_, err := e.in.Process(e.ctx, "billing", "m-1", func(ctx context.Context, tx *sql.Tx) error {
		require.NoError(t, e.effect("billing", "m-1")(ctx, tx))
		return fmt.Errorf("charge: %w", boom)
	})
	require.ErrorIs(t, err, boom, "the handler's error comes back")
	require.Zero(t, e.effects(t, "billing", "m-1"), "the handler's writes rolled back")
	require.Zero(t, e.count(t, e.table), "the record rolled back")

	res, err := e.in.Process(e.ctx, "billing", "m-1", e.effect("billing", "m-1"))
	require.NoError(t, err)
	require.False(t, res.Duplicate, "the redelivery processes the message")
	require.Equal(t, 1, e.effects(t, "billing", "m-1"))
}

func testHandlerPanic(t *testing.T, e *env) {
	require.Panics(t, func() {
		_, _ = e.in.Process(e.ctx, "billing", "m-1", func(ctx context.Context, tx *sql.Tx) error {
			require.NoError(t, e.effect("billing", "m-1")(ctx, tx))
			panic("handler bug")
		})
	})
	require.Zero(t, e.effects(t, "billing", "m-1"))
	require.Zero(t, e.count(t, e.table))
	res, err := e.in.Process(e.ctx, "billing", "m-1", e.effect("billing", "m-1"))
	require.NoError(t, err)
	require.False(t, res.Duplicate)
}

func testGroups(t *testing.T, e *env) {
	for _, g := range []string{"billing", "shipping", "Billing"} {
		res, err := e.in.Process(e.ctx, g, "m-1", e.effect(g, "m-1"))
		require.NoError(t, err)
		require.False(t, res.Duplicate, "group %s processes m-1 for itself", g)
	}
	for _, g := range []string{"billing", "shipping", "Billing"} {
		res, err := e.in.Process(e.ctx, g, "m-1", e.effect(g, "m-1"))
		require.NoError(t, err)
		require.True(t, res.Duplicate)
		require.Equal(t, 1, e.effects(t, g, "m-1"))
	}
	// Ids are compared byte for byte, and other ids of the same group are independent.
	for _, id := range []string{"M-1", "m-1 ", "m-2"} {
		res, err := e.in.Process(e.ctx, "billing", id, e.effect("billing", id))
		require.NoError(t, err)
		require.False(t, res.Duplicate, "id %q", id)
	}
}

func testClaimOnCallersTx(t *testing.T, e *env) {
	// claim begins a transaction and claims m-1 on it.
	claim := func() (*sql.Tx, inbox.Result) {
		tx, err := e.db.BeginTx(e.ctx, nil)
		require.NoError(t, err)
		res, err := e.in.Claim(e.ctx, tx, "billing", "m-1")
		require.NoError(t, err)
		return tx, res
	}
	// A claim whose transaction rolls back records nothing.
	tx, res := claim()
	require.False(t, res.Duplicate)
	require.NoError(t, tx.Rollback())
	require.Zero(t, e.count(t, e.table))

	// A committed one does.
	tx, res = claim()
	require.False(t, res.Duplicate)
	require.NoError(t, e.effect("billing", "m-1")(e.ctx, tx))
	require.NoError(t, tx.Commit())

	// A duplicate leaves the caller's transaction usable (no aborted transaction on
	// PostgreSQL): it writes and commits after the claim.
	tx, res = claim()
	require.True(t, res.Duplicate)
	require.NoError(t, e.effect("billing", "after-duplicate")(e.ctx, tx))
	require.NoError(t, tx.Commit())
	require.Equal(t, 1, e.effects(t, "billing", "m-1"))
	require.Equal(t, 1, e.effects(t, "billing", "after-duplicate"))

	// Process sees what Claim recorded.
	res, err := e.in.Process(e.ctx, "billing", "m-1", e.effect("billing", "m-1"))
	require.NoError(t, err)
	require.True(t, res.Duplicate)
}

func testPurge(t *testing.T, e *env) {
	noop := func(context.Context, *sql.Tx) error { return nil }
	for i := range 5 {
		_, err := e.in.Process(e.ctx, "billing", fmt.Sprintf("old-%d", i), noop)
		require.NoError(t, err)
	}
	for i := range 3 {
		_, err := e.in.Process(e.ctx, "billing", fmt.Sprintf("young-%d", i), noop)
		require.NoError(t, err)
	}
	e.backdate(t, "old-%")

	n, err := e.in.Purge(e.ctx, time.Hour, 2)
	require.NoError(t, err)
	require.EqualValues(t, 5, n, "three batches of at most two rows")
	require.Equal(t, 3, e.count(t, e.table), "young rows stay")
	n, err = e.in.Purge(e.ctx, time.Hour, 0)
	require.NoError(t, err)
	require.Zero(t, n)

	// The retention is the dedupe window: a purged message is processed again.
	res, err := e.in.Process(e.ctx, "billing", "old-0", noop)
	require.NoError(t, err)
	require.False(t, res.Duplicate)
	res, err = e.in.Process(e.ctx, "billing", "young-0", noop)
	require.NoError(t, err)
	require.True(t, res.Duplicate)

	// A cancelled purge says so.
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	_, err = e.in.Purge(ctx, time.Hour, 10)
	require.ErrorIs(t, err, context.Canceled)
}

// backdate moves the records of the ids matching like two hours into the past.
func (e *env) backdate(t *testing.T, like string) {
	t.Helper()
	expr := map[string]string{
		"postgres": `processed_at - interval '2 hours'`,
		"mysql":    `processed_at - INTERVAL 2 HOUR`,
		"sqlite":   `processed_at - 7200000000`,
	}[e.backend]
	_, err := e.db.ExecContext(e.ctx, e.bind(`UPDATE `+e.table+` SET processed_at = `+expr+` WHERE message_id LIKE ?`), like)
	require.NoError(t, err)
}

// testPurgeWhileDelivering: purges run beside deliveries of new messages and redeliveries
// of old ones without failing either, and delete only old records.
func testPurgeWhileDelivering(t *testing.T, e *env) {
	noop := func(context.Context, *sql.Tx) error { return nil }
	for i := range 100 {
		_, err := e.in.Process(e.ctx, "billing", fmt.Sprintf("old-%03d", i), noop)
		require.NoError(t, err)
	}
	e.backdate(t, "old-%")
	var wg sync.WaitGroup
	var purged atomic.Int64
	for range 2 {
		wg.Go(func() {
			n, err := e.in.Purge(e.ctx, time.Hour, 7)
			purged.Add(n)
			if err != nil {
				t.Error(err)
			}
		})
	}
	for w := range 4 {
		wg.Go(func() {
			for i := range 25 {
				for _, id := range []string{fmt.Sprintf("new-%d-%d", w, i), fmt.Sprintf("old-%03d", w*25+i)} {
					if _, err := e.in.Process(e.ctx, "billing", id, noop); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()
	var young int
	require.NoError(t, e.db.QueryRowContext(e.ctx, `SELECT COUNT(*) FROM `+e.table+` WHERE message_id LIKE 'new-%'`).Scan(&young))
	require.Equal(t, 100, young, "purges never delete young records")
	require.LessOrEqual(t, purged.Load(), int64(100))
}

func testBadInput(t *testing.T, e *env) {
	ran := false
	h := func(context.Context, *sql.Tx) error { ran = true; return nil }
	long := func(n int) string { return strings.Repeat("x", n) }
	for _, c := range []struct {
		field, group, id string
	}{
		{"group", "", "m-1"},
		{"group", long(inbox.MaxGroupBytes + 1), "m-1"},
		{"group", "bad\xff", "m-1"},
		{"group", "nul\x00", "m-1"},
		{"messageID", "billing", ""},
		{"messageID", "billing", long(inbox.MaxMessageIDBytes + 1)},
		{"messageID", "billing", "bad\xff"},
		{"messageID", "billing", "nul\x00"},
	} {
		_, err := e.in.Process(e.ctx, c.group, c.id, h)
		requireInvalid(t, err, c.field)
		tx, err := e.db.BeginTx(e.ctx, nil)
		require.NoError(t, err)
		_, err = e.in.Claim(e.ctx, tx, c.group, c.id)
		requireInvalid(t, err, c.field)
		require.NoError(t, tx.Rollback())
	}
	// The longest valid keys fit the schema.
	_, err := e.in.Process(e.ctx, long(inbox.MaxGroupBytes), long(inbox.MaxMessageIDBytes), func(context.Context, *sql.Tx) error { return nil })
	require.NoError(t, err)
	require.Equal(t, 1, e.count(t, e.table))

	_, err = e.in.Process(e.ctx, "billing", "m-1", nil)
	requireInvalid(t, err, "handler")
	_, err = e.in.Claim(e.ctx, nil, "billing", "m-1")
	requireInvalid(t, err, "Tx")
	var nilTx *sql.Tx
	_, err = e.in.Claim(e.ctx, nilTx, "billing", "m-1")
	requireInvalid(t, err, "Tx")
	require.False(t, ran)
	require.Equal(t, 1, e.count(t, e.table), "bad input wrote nothing")

	_, err = e.in.Purge(e.ctx, 0, 10)
	requireInvalid(t, err, "olderThan")
	_, err = e.in.Purge(e.ctx, -time.Hour, 10)
	requireInvalid(t, err, "olderThan")
	_, err = e.in.Purge(e.ctx, time.Hour, -1)
	requireInvalid(t, err, "batch")
	_, err = e.in.Purge(e.ctx, time.Hour, inbox.MaxPurgeBatch+1)
	requireInvalid(t, err, "batch")

	_, err = inbox.New(nil, e.backend, inbox.Options{})
	requireInvalid(t, err, "db")
	_, err = inbox.New(e.db, e.backend, inbox.Options{Table: "Bad-Name"})
	requireInvalid(t, err, "table")
	_, err = inbox.New(e.db, e.backend, inbox.Options{Isolation: sql.IsolationLevel(99)})
	requireInvalid(t, err, "Isolation")
	_, err = inbox.New(e.db, "oracle", inbox.Options{})
	require.ErrorIs(t, err, errors.ErrUnsupported)

	// A missing table is a database error, not a panic.
	missing, err := inbox.New(e.db, e.backend, inbox.Options{Table: "no_such_inbox"})
	require.NoError(t, err)
	_, err = missing.Process(e.ctx, "billing", "m-1", h)
	require.Error(t, err)
	require.False(t, ran)
}

func requireInvalid(t *testing.T, err error, field string) {
	t.Helper()
	require.ErrorIs(t, err, outbox.ErrInvalid)
	var ve *outbox.ValidationError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, field, ve.Field)
}

func testMigrations(t *testing.T, e *env) {
	const table = "billing_inbox"
	opts := inbox.MigrateOptions{Table: table}
	require.NoError(t, inbox.MigrateUp(e.ctx, e.db, e.backend, opts))
	require.NoError(t, inbox.MigrateUp(e.ctx, e.db, e.backend, opts), "up twice is a no-op")
	in, err := inbox.New(e.db, e.backend, inbox.Options{Table: table})
	require.NoError(t, err)
	res, err := in.Process(e.ctx, "billing", "m-1", e.effect("billing", "m-1"))
	require.NoError(t, err)
	require.False(t, res.Duplicate)
	// The suite's table is another table: m-1 is new there.
	res, err = e.in.Process(e.ctx, "billing", "m-1", e.effect("billing", "m-1"))
	require.NoError(t, err)
	require.False(t, res.Duplicate)

	require.NoError(t, inbox.MigrateDown(e.ctx, e.db, e.backend, opts))
	_, err = in.Process(e.ctx, "billing", "m-2", e.effect("billing", "m-2"))
	require.Error(t, err, "down drops the table")
	require.NoError(t, inbox.MigrateUp(e.ctx, e.db, e.backend, opts))
	require.Zero(t, e.count(t, table))

	_, err = inbox.NewMigrationProvider(e.db, "oracle", opts)
	require.ErrorIs(t, err, errors.ErrUnsupported)
	_, err = inbox.NewMigrationProvider(e.db, e.backend, inbox.MigrateOptions{Table: "Bad"})
	require.ErrorIs(t, err, outbox.ErrInvalid)
	_, err = inbox.NewMigrationProvider(e.db, e.backend, inbox.MigrateOptions{VersionTable: "bad-name"})
	require.ErrorIs(t, err, outbox.ErrInvalid)
}

// TestMySQLClientFoundRows: with clientFoundRows the server reports matched rows rather than
// changed ones; the claim still tells a duplicate from a new key.
func TestMySQLClientFoundRows(t *testing.T) {
	t.Parallel()
	e := setup(t, "mysql")
	cfg := e.mysqlConfig(t)
	cfg.ClientFoundRows = true
	db, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	in, err := inbox.New(db, "mysql", inbox.Options{Table: e.table})
	require.NoError(t, err)
	res, err := in.Process(e.ctx, "billing", "m-1", e.effect("billing", "m-1"))
	require.NoError(t, err)
	require.False(t, res.Duplicate)
	res, err = in.Process(e.ctx, "billing", "m-1", e.effect("billing", "m-1"))
	require.NoError(t, err)
	require.True(t, res.Duplicate)
	require.Equal(t, 1, e.effects(t, "billing", "m-1"))
}

// TestMigrationFilesUsePlaceholder: every file names its table only through the ENVSUB
// placeholder, so a custom table name reaches every statement.
func TestMigrationFilesUsePlaceholder(t *testing.T) {
	t.Parallel()
	for _, d := range backends {
		b, err := fs.ReadFile(inbox.MigrationsFS, d+"/00001_outbox_inbox.sql")
		require.NoError(t, err)
		s := string(b)
		require.Contains(t, s, "-- +goose ENVSUB ON")
		rest := strings.ReplaceAll(s, inbox.MigrationPlaceholder, "")
		for _, line := range strings.Split(rest, "\n") {
			if !strings.HasPrefix(line, "--") {
				require.NotContains(t, line, inbox.DefaultTable, "%s: table named without the placeholder", d)
			}
		}
	}
}

// TestStricterIsolation: at SERIALIZABLE a claim that waited for a concurrent delivery may
// fail with a serialization error (PostgreSQL); Process begins again and reports the
// duplicate, so the concurrent deliveries still process the message once and none fails.
func TestStricterIsolation(t *testing.T) {
	t.Parallel()
	for _, b := range []string{"postgres", "mysql"} {
		for _, iso := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelSerializable} {
			t.Run(b+"/"+iso.String(), func(t *testing.T) {
				t.Parallel()
				e := setup(t, b)
				in, err := inbox.New(e.db, b, inbox.Options{Table: e.table, Isolation: iso})
				require.NoError(t, err)
				e.in = in
				testConcurrentDeliveries(t, e)
			})
		}
	}
}

// TestPurgeUsesRetentionIndex: the purge finds its batch through the retention index, not by
// scanning the table (the PostgreSQL session is told to avoid sequential scans, so that the
// small test table cannot make a scan the cheaper plan).
func TestPurgeUsesRetentionIndex(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			e := setup(t, b)
			for i := range 50 {
				_, err := e.in.Process(e.ctx, "billing", fmt.Sprint(i), func(context.Context, *sql.Tx) error { return nil })
				require.NoError(t, err)
			}
			tx, err := e.db.BeginTx(e.ctx, nil)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback() }()
			explain := "EXPLAIN "
			switch b {
			case "postgres":
				_, err = tx.ExecContext(e.ctx, `SET LOCAL enable_seqscan = off`)
				require.NoError(t, err)
			case "sqlite":
				explain = "EXPLAIN QUERY PLAN "
			}
			rows, err := tx.QueryContext(e.ctx, explain+inbox.PurgeSQL(e.in), int64(3600e6), 100)
			require.NoError(t, err)
			defer rows.Close()
			cols, err := rows.Columns()
			require.NoError(t, err)
			var plan strings.Builder
			for rows.Next() {
				vals := make([]sql.NullString, len(cols))
				ptrs := make([]any, len(cols))
				for i := range vals {
					ptrs[i] = &vals[i]
				}
				require.NoError(t, rows.Scan(ptrs...))
				for _, v := range vals {
					plan.WriteString(v.String + " ")
				}
				plan.WriteString("\n")
			}
			require.NoError(t, rows.Err())
			require.Contains(t, plan.String(), e.table+"_retention_idx", "plan:\n%s", plan.String())
			if b == "postgres" {
				require.Contains(t, plan.String(), "Tid Scan", "plan:\n%s", plan.String())
			}
			t.Logf("plan:\n%s", plan.String())
		})
	}
}

// testOneConnectionPool: Process (new, duplicate, failed handler) and Purge on a pool of one
// connection each return within a deadline: no call holds the connection while it waits for
// another.
func testOneConnectionPool(t *testing.T, e *env) {
	e.db.SetMaxOpenConns(1)
	do := func(what string, fn func(ctx context.Context) error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- fn(ctx) }()
		select {
		case err := <-done:
			require.NoError(t, err, what)
		case <-time.After(35 * time.Second):
			t.Fatalf("%s did not return on a one-connection pool", what)
		}
	}
	do("Process", func(ctx context.Context) error {
		res, err := e.in.Process(ctx, "g", "m1", e.effect("g", "m1"))
		if err == nil && res.Duplicate {
			err = errors.New("first delivery reported as a duplicate")
		}
		return err
	})
	do("Process again", func(ctx context.Context) error {
		res, err := e.in.Process(ctx, "g", "m1", e.effect("g", "m1"))
		if err == nil && !res.Duplicate {
			err = errors.New("redelivery not reported as a duplicate")
		}
		return err
	})
	do("Process with a failing handler", func(ctx context.Context) error {
		boom := errors.New("boom")
		if _, err := e.in.Process(ctx, "g", "m2", func(context.Context, *sql.Tx) error { return boom }); !errors.Is(err, boom) {
			return fmt.Errorf("want the handler's error, got %v", err)
		}
		return nil
	})
	do("Purge", func(ctx context.Context) error { _, err := e.in.Purge(ctx, time.Microsecond, 0); return err })
	require.Equal(t, 1, e.effects(t, "g", "m1"))
}

// TestMySQLPurgeDeadlockVictim: a purge chosen as a deadlock's victim runs its statement again
// rather than failing. The deadlock is made on purpose: a transaction heavier than the purge
// (so that InnoDB picks the purge as the victim) locks a record in the middle of the purge's
// batch, waits until the purge waits for it, then asks for a record the purge already holds.
func TestMySQLPurgeDeadlockVictim(t *testing.T) {
	t.Parallel()
	e := setup(t, "mysql")
	noop := func(context.Context, *sql.Tx) error { return nil }
	for i := range 10 {
		_, err := e.in.Process(e.ctx, "billing", fmt.Sprintf("old-%03d", i), noop)
		require.NoError(t, err)
	}
	e.backdate(t, "old-%")

	tx, err := e.db.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	_, err = tx.ExecContext(e.ctx, `INSERT INTO effects (grp, message_id)
		WITH RECURSIVE n (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500) SELECT 'heavy', i FROM n`)
	require.NoError(t, err)
	lock := "SELECT message_id FROM `" + e.table + "` WHERE consumer_group = 'billing' AND message_id = ? FOR UPDATE"
	var id string
	require.NoError(t, tx.QueryRowContext(e.ctx, lock, "old-005").Scan(&id))

	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := e.in.Purge(e.ctx, time.Hour, 7)
		done <- result{n, err}
	}()
	// Wait until the purge holds old-001: a probe that will not wait finds it locked.
	deadline := time.Now().Add(15 * time.Second)
	for !e.lockedByOther(t, lock, "old-001") {
		require.False(t, time.Now().After(deadline), "the purge never locked old-001")
		time.Sleep(2 * time.Millisecond)
	}
	// The purge holds old-001 and waits (or will) for old-005: asking for old-001 closes the cycle.
	require.NoError(t, tx.QueryRowContext(e.ctx, lock, "old-001").Scan(&id), "the heavier transaction must not be the victim")
	require.NoError(t, tx.Commit())

	r := <-done
	require.NoError(t, r.err)
	require.EqualValues(t, 10, r.n)
	require.Zero(t, e.count(t, e.table))
}

// lockedByOther reports whether another transaction holds the row that lock (a SELECT ... FOR
// UPDATE of one id) selects, asking with NOWAIT in a transaction of its own that it rolls back.
func (e *env) lockedByOther(t *testing.T, lock, id string) bool {
	t.Helper()
	tx, err := e.db.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	var got string
	err = tx.QueryRowContext(e.ctx, lock+" NOWAIT", id).Scan(&got)
	if err == nil || errors.Is(err, sql.ErrNoRows) {
		return false
	}
	require.ErrorContains(t, err, "Error 1205", "a locked row fails NOWAIT with a lock wait timeout")
	return true
}
