package postgres_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/conformance"
	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/postgres"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
)

// directOf maps each pool through a PgBouncer to a pool straight to the server on the same
// schema, for the listeners (conformance.Harness.ListenDB, outbox.Options.ListenDB).
var directOf sync.Map // *sql.DB → *sql.DB

// params are the pgx parameters each pooling mode needs: none in session mode; in
// transaction mode, unprepared statements (TestPgBouncerPreparedStatementsExplained).
var params = map[string][]string{testdb.TransactionPooling: {"default_query_exec_mode=exec"}}

// TestPgBouncerConformance runs the conformance suite through a private PgBouncer in each
// pooling mode: in session mode at pgx's defaults, in transaction mode with pgx's
// statements unprepared (default_query_exec_mode=exec, what the error of
// TestPgBouncerPreparedStatementsExplained says to set) and the listeners past the pooler
// (Harness.ListenDB, which the suite's publishers get as outbox.Options.ListenDB).
func TestPgBouncerConformance(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{testdb.SessionPooling, testdb.TransactionPooling} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			h := conformance.Harness{
				Dialect: outbox.Postgres(),
				OpenDB: func(t testing.TB) *sql.DB {
					pooled, direct := testdb.Behind(t, mode, params[mode]...)
					directOf.Store(pooled, direct)
					t.Cleanup(func() { directOf.Delete(pooled) })
					return pooled
				},
				Reopen: func(t testing.TB, db *sql.DB) *sql.DB {
					again := testdb.Reopen(t, db)
					if direct, ok := directOf.Load(db); ok {
						directOf.Store(again, testdb.Reopen(t, direct.(*sql.DB)))
						t.Cleanup(func() { directOf.Delete(again) })
					}
					return again
				},
				OtherServer: func(t testing.TB) *sql.DB { return testdb.SQLite(t) },
				DSN:         func(t testing.TB, db *sql.DB) (string, string) { return "pgx", testdb.OpenedDSN(t, db) },
			}
			if mode == testdb.TransactionPooling {
				h.ListenDB = func(t testing.TB, db *sql.DB) *sql.DB {
					direct, ok := directOf.Load(db)
					if !ok {
						t.Fatal("ListenDB of a pool the harness did not open")
					}
					return direct.(*sql.DB)
				}
			}
			conformance.Run(t, h)
		})
	}
}

// TestPgBouncerPreparedStatementsExplained: at pgx's defaults pgx prepares each statement
// under a name derived from its text, per client connection; through transaction pooling
// two clients meet on one server connection (the pooler here has one), where the second
// one's prepare fails with 42P05. The enqueue's error says what to set, as a CheckError.
func TestPgBouncerPreparedStatementsExplained(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := testdb.NewRole(t)
	bouncer := testdb.PgBouncer(t, testdb.BouncerOptions{Mode: testdb.TransactionPooling, Users: []string{r.Name}, PoolSize: 1})
	admin := r.Open(t, testdb.PostgresDSN())
	// migrations.Up through the pooler from two clients: the second one's reads of goose's
	// version table are prepared under the names the first one's are.
	var upErr error
	for range 2 {
		if upErr = migrations.Up(ctx, r.Open(t, bouncer), "postgres", migrations.Options{}); upErr != nil {
			break
		}
	}
	var ce *outbox.CheckError
	require.ErrorAs(t, upErr, &ce, "migrations.Up's prepared statement error is explained: %v", upErr)
	require.Contains(t, upErr.Error(), "default_query_exec_mode=exec")
	require.NoError(t, migrations.Up(ctx, admin, "postgres", migrations.Options{}))
	db := r.Open(t, bouncer) // pgx's defaults
	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{DisableNotify: true})
	require.NoError(t, err)

	enqueueOn := func(c *sql.Conn) error {
		tx, err := c.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		if _, err := store.Enqueue(ctx, tx, pgMsg(1)); err != nil {
			return err
		}
		return tx.Commit()
	}
	first, err := db.Conn(ctx)
	require.NoError(t, err)
	defer first.Close()
	second, err := db.Conn(ctx)
	require.NoError(t, err)
	defer second.Close()
	require.NoError(t, enqueueOn(first), "the first client prepares the insert on the one server connection")
	err = enqueueOn(second)
	require.Error(t, err, "the second client's prepare of the same statement meets the first one's")
	require.ErrorAs(t, err, &ce, "a prepared statement error behind a pooler is explained: %v", err)
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.Contains(t, err.Error(), "default_query_exec_mode=exec")
	require.Contains(t, err.Error(), "max_prepared_statements")
	require.Contains(t, err.Error(), "42P05", "the driver's error stays in the message")

	var n int
	require.NoError(t, admin.QueryRowContext(ctx, `SELECT count(*) FROM outbox_events`).Scan(&n))
	require.Equal(t, 1, n, "the failed transaction inserted nothing")
}

// TestPgBouncerDeafListener: LISTEN through transaction pooling hears nothing; the listener
// finds out with its own probe, without calling ready, and returns an error matching
// errors.ErrUnsupported that says what to do, which a Publisher logs once as a warning and
// then polls. Through session pooling the same listener hears its probe.
func TestPgBouncerDeafListener(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tbl, err := dialect.NewTable(outbox.DefaultTable)
	require.NoError(t, err)

	session, _ := testdb.Behind(t, testdb.SessionPooling)
	lctx, stop := context.WithCancel(ctx)
	ready := make(chan struct{})
	heard := make(chan error, 1)
	go func() { heard <- postgres.New().Listen(lctx, session, tbl, func() { close(ready) }, func(string) {}) }()
	select {
	case <-ready:
	case err := <-heard:
		t.Fatalf("the listener through session pooling stopped: %v", err)
	case <-ctx.Done():
		t.Fatal("the listener through session pooling was not ready")
	}
	stop()
	<-heard

	pooled, _ := testdb.Behind(t, testdb.TransactionPooling, params[testdb.TransactionPooling]...)
	require.NoError(t, migrations.Up(ctx, pooled, "postgres", migrations.Options{}))
	readied := false
	start := time.Now()
	err = postgres.New().Listen(ctx, pooled, tbl, func() { readied = true }, func(string) {})
	require.False(t, readied, "a deaf listener never reports ready")
	require.ErrorIs(t, err, errors.ErrUnsupported)
	require.Contains(t, err.Error(), "outbox.Options.ListenDB")
	require.Contains(t, err.Error(), "transaction-pooling")
	require.Less(t, time.Since(start), postgres.ProbeWithin+10*time.Second, "the probe has a deadline")

	// A publisher on that pool says so once, as a warning, and delivers by polling.
	var logs lockedBuffer
	store, err := outbox.New(pooled, outbox.Postgres(), outbox.Options{})
	require.NoError(t, err)
	var delivered atomic.Int64
	p, err := outbox.NewPublisher(store, outbox.PerMessage(func(context.Context, outbox.Delivery) error {
		delivered.Add(1)
		return nil
	}), outbox.PublisherOptions{
		Scope:  outbox.Scope{Namespace: "orders"},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	require.NoError(t, err)
	stopPublisher := runPublisher(t, ctx, p)
	tx, err := pooled.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = store.Enqueue(ctx, tx, pgMsg(1))
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	testdb.Poll(t, 30*time.Second, "the publisher to deliver by polling", func() bool { return delivered.Load() == 1 })
	testdb.Poll(t, 30*time.Second, "the warning about the deaf listener", func() bool {
		return strings.Contains(logs.String(), "ListenDB")
	})
	stopPublisher()
	require.Equal(t, 1, strings.Count(logs.String(), "level=WARN"), "one warning, no retries: %s", logs.String())
}

// claimWatch is the PostgreSQL dialect that reports its listener's readiness and the time
// of its last claim, so that a test can enqueue once a publisher is idle.
type claimWatch struct {
	*postgres.Dialect
	ready     chan struct{}
	readyOnce sync.Once
	lastClaim atomic.Int64
}

func (c *claimWatch) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]outbox.Record, error) {
	defer c.lastClaim.Store(time.Now().UnixNano())
	return c.Dialect.Claim(ctx, db, t, p)
}

func (c *claimWatch) Listen(ctx context.Context, db *sql.DB, t dialect.Table, ready func(), wake func(string)) error {
	return c.Dialect.Listen(ctx, db, t, func() { ready(); c.readyOnce.Do(func() { close(c.ready) }) }, wake)
}

// TestPgBouncerListenDB: publishers on a transaction-pooling PgBouncer, with
// Options.ListenDB straight to the server, are woken within seconds by an event another
// process commits through the pooler, while they poll once a minute.
func TestPgBouncerListenDB(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pooled, direct := testdb.Behind(t, testdb.TransactionPooling, params[testdb.TransactionPooling]...)
	require.NoError(t, migrations.Up(ctx, pooled, "postgres", migrations.Options{}))
	d := &claimWatch{Dialect: postgres.New(), ready: make(chan struct{})}
	store, err := outbox.New(pooled, d, outbox.Options{ListenDB: direct})
	require.NoError(t, err)
	delivered := make(chan uuid.UUID, 10)
	var logs lockedBuffer
	p, err := outbox.NewPublisher(store, outbox.PerMessage(func(_ context.Context, m outbox.Delivery) error {
		delivered <- m.ID
		return nil
	}), outbox.PublisherOptions{
		Scope: outbox.Scope{Namespace: "orders"}, PollInterval: time.Minute, IdleBackoffMax: time.Minute,
		Lease: 3 * time.Minute, SweepInterval: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	require.NoError(t, err)
	runPublisher(t, ctx, p)
	select {
	case <-d.ready:
	case <-ctx.Done():
		t.Fatalf("the listener on ListenDB did not get ready: %s", logs.String())
	}
	testdb.Poll(t, 30*time.Second, "the publisher to go idle", func() bool {
		last := d.lastClaim.Load()
		return last != 0 && time.Since(time.Unix(0, last)) > 300*time.Millisecond
	})

	// Another process: a pool and a Store of its own, through the pooler.
	other := testdb.Reopen(t, pooled)
	producer, err := outbox.New(other, outbox.Postgres(), outbox.Options{})
	require.NoError(t, err)
	tx, err := other.BeginTx(ctx, nil)
	require.NoError(t, err)
	res, err := producer.Enqueue(ctx, tx, outbox.Message{Namespace: "orders", Topic: "t", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	select {
	case id := <-delivered:
		require.Equal(t, res.ID, id)
	case <-time.After(20 * time.Second):
		t.Fatalf("not woken within 20s, while polling once a minute: %s", logs.String())
	}
	require.Empty(t, logs.String(), "no warning with a listener past the pooler")
	require.Equal(t, 1, direct.Stats().InUse, "the listener's connection comes from ListenDB")
}

// runPublisher runs p until the function it returns is called, or the test ends.
func runPublisher(t *testing.T, ctx context.Context, p *outbox.Publisher) (stop func()) {
	t.Helper()
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(pctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Publisher.Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// lockedBuffer is a bytes.Buffer for a logger that goroutines share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
