package pgxv5_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
	"github.com/outboxgo/outbox/outboxtest/testdb"
	"github.com/outboxgo/outbox/pgxv5"
)

// TestMain fails the package when a goroutine outlives its tests: a pool, a publisher or
// its listener left running. testdb's admin pools live as long as the process.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

// env is one test's database: a schema of its own with the outbox table and an orders
// table, a pgx pool on it, and a Store on that pool.
type env struct {
	db    *sql.DB // testdb's pool, for reading back
	dsn   string
	pool  *pgxpool.Pool
	store *outbox.Store
}

func setup(t *testing.T, opts outbox.Options) *env {
	t.Helper()
	ctx := context.Background()
	db := testdb.Postgres(t)
	require.NoError(t, migrations.Up(ctx, db, "postgres", migrations.Options{}))
	_, err := db.Exec(`CREATE TABLE orders (id bigint PRIMARY KEY)`)
	require.NoError(t, err)
	e := &env{db: db, dsn: testdb.DSN(t, "postgres", db)}
	e.pool = e.newPool(t, "")
	e.store, err = pgxv5.New(e.pool, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.store.DB().Close() })
	return e
}

// newPool opens a pgx pool on the test's schema, closed before the schema is dropped;
// app, when set, is its application_name.
func (e *env) newPool(t *testing.T, app string) *pgxpool.Pool {
	t.Helper()
	dsn := e.dsn
	if app != "" {
		u, err := url.Parse(dsn)
		require.NoError(t, err)
		q := u.Query()
		q.Set("application_name", app)
		u.RawQuery = q.Encode()
		dsn = u.String()
	}
	pool, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// begin starts a pgx transaction that is rolled back when the test ends unless committed.
func (e *env) begin(t *testing.T) pgx.Tx {
	t.Helper()
	tx, err := e.pool.Begin(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// commitOne enqueues one message of namespace ns on a pgx transaction and commits it.
func (e *env) commitOne(t *testing.T, ns string) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	tx := e.begin(t)
	res, err := pgxv5.Enqueue(ctx, e.store, tx, msg(ns, 1))
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	return res.ID
}

func (e *env) count(t *testing.T, where string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM outbox_events WHERE `+where, args...).Scan(&n))
	return n
}

func msg(ns string, i int) outbox.Message {
	return outbox.Message{Namespace: ns, Topic: "order.created", Payload: json.RawMessage(`{"order":` + strconv.Itoa(i) + `}`)}
}

// recorder is a transport that counts the deliveries of each id.
type recorder struct {
	mu   sync.Mutex
	seen map[uuid.UUID]int
}

func newRecorder() *recorder { return &recorder{seen: map[uuid.UUID]int{}} }

func (r *recorder) transport() outbox.Transport {
	return outbox.PerMessage(func(_ context.Context, d outbox.Delivery) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.seen[d.ID]++
		return nil
	})
}

func (r *recorder) times(id uuid.UUID) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[id]
}

// run starts p and stops it when the test ends.
func run(t *testing.T, p *outbox.Publisher) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// waitFor polls cond until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A message enqueued on a committed pgx transaction, beside the business row, is delivered
// once by a Publisher on the same pool.
func TestCommitDeliveredOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, outbox.Options{})
	tx := e.begin(t)
	_, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, 1)
	require.NoError(t, err)
	res, err := pgxv5.Enqueue(ctx, e.store, tx, msg("shop", 1))
	require.NoError(t, err)
	require.False(t, res.Duplicate)
	require.NotEqual(t, uuid.Nil, res.ID)
	require.NoError(t, tx.Commit(ctx))

	rec := newRecorder()
	p, err := outbox.NewPublisher(e.store, rec.transport(), outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "shop"}})
	require.NoError(t, err)
	run(t, p)
	waitFor(t, 10*time.Second, "the delivery to be settled", func() bool {
		r, err := e.store.Get(ctx, res.ID)
		require.NoError(t, err)
		return r.Status == outbox.StatusDelivered
	})
	require.Equal(t, 1, rec.times(res.ID))
	r, err := e.store.Get(ctx, res.ID)
	require.NoError(t, err)
	require.JSONEq(t, `{"order":1}`, string(r.Payload))
}

// A rolled-back pgx transaction leaves no row.
func TestRollbackWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, outbox.Options{})
	tx := e.begin(t)
	_, err := pgxv5.EnqueueBatch(ctx, e.store, tx, []outbox.Message{msg("shop", 1), msg("shop", 2)})
	require.NoError(t, err)
	require.Equal(t, 0, e.count(t, "true"), "not visible before commit")
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 0, e.count(t, "true"))
}

// A dedupe key that exists is reported as a duplicate, inside one transaction and across
// two, and the transaction goes on: the business row and the commit after it succeed.
func TestDuplicateKeepsTransactionUsable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, outbox.Options{})
	keyed := msg("shop", 1)
	keyed.DedupeKey = "order/1/created"

	tx := e.begin(t)
	first, err := pgxv5.Enqueue(ctx, e.store, tx, keyed)
	require.NoError(t, err)
	require.False(t, first.Duplicate)
	again, err := pgxv5.Enqueue(ctx, e.store, tx, keyed)
	require.NoError(t, err)
	require.Equal(t, outbox.Result{Duplicate: true}, again)
	_, err = tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, 1)
	require.NoError(t, err, "the transaction is usable after a duplicate")
	require.NoError(t, tx.Commit(ctx))

	tx = e.begin(t)
	rs, err := pgxv5.EnqueueBatch(ctx, e.store, tx, []outbox.Message{msg("shop", 2), keyed, msg("shop", 3)})
	require.NoError(t, err)
	require.Len(t, rs, 3)
	require.False(t, rs[0].Duplicate)
	require.Equal(t, outbox.Result{Duplicate: true}, rs[1])
	require.False(t, rs[2].Duplicate)
	_, err = tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, 2)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 1, e.count(t, "dedupe_key = $1", keyed.DedupeKey))
	require.Equal(t, 3, e.count(t, "true"))
}

// A batch larger than one statement, with every optional field in some rows and duplicate
// keys within it, is stored field for field as Store.EnqueueBatch stores it.
func TestBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, outbox.Options{})
	tenant := uuid.New()
	msgs := make([]outbox.Message, 2500)
	for i := range msgs {
		m := msg("shop", i)
		switch i % 5 {
		case 1:
			m.TenantID = tenant
			m.DedupeKey = tenant.String() + "/k" + strconv.Itoa(i/10) // some keys repeat
		case 2:
			m.PartitionKey = "p" + strconv.Itoa(i)
			m.Headers = outbox.Headers{"content-type": "application/json"}
		case 3:
			m.Delay = time.Hour
		}
		msgs[i] = m
	}
	tx := e.begin(t)
	rs, err := pgxv5.EnqueueBatch(ctx, e.store, tx, msgs)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Len(t, rs, len(msgs))
	keys := map[string]bool{}
	inserted := 0
	for i, r := range rs {
		m := msgs[i]
		dup := m.DedupeKey != "" && keys[m.DedupeKey]
		keys[m.DedupeKey] = true
		require.Equal(t, dup, r.Duplicate, "message %d", i)
		if dup {
			continue
		}
		inserted++
		got, err := e.store.Get(ctx, r.ID)
		require.NoError(t, err, "message %d", i)
		require.Equal(t, m.Namespace, got.Namespace)
		require.Equal(t, m.TenantID, got.TenantID)
		require.Equal(t, m.DedupeKey, got.DedupeKey)
		require.Equal(t, m.PartitionKey, got.PartitionKey)
		require.Equal(t, string(m.Payload), string(got.Payload))
		if len(m.Headers) > 0 {
			require.Equal(t, m.Headers, got.Headers)
		}
		require.Equal(t, m.Delay > 0, got.NextAttemptAt.After(got.CreatedAt.Add(time.Minute)), "message %d", i)
	}
	require.Equal(t, inserted, e.count(t, "true"))
}

// hook adds a trace header at the start of each enqueue and records the end.
type hook struct {
	mu    sync.Mutex
	ended []outbox.Message
	res   []outbox.Result
}

func (h *hook) StartEnqueue(ctx context.Context, m *outbox.Message) context.Context {
	if m.Headers == nil {
		m.Headers = outbox.Headers{}
	}
	m.Headers["traceparent"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	return ctx
}

func (h *hook) EndEnqueue(_ context.Context, m outbox.Message, res outbox.Result, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		h.ended = append(h.ended, m)
		h.res = append(h.res, res)
	}
}

// The Store's hooks see each message enqueued on a pgx transaction, and the header they add
// is stored with the row.
func TestHooksSeeTheMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := &hook{}
	e := setup(t, outbox.Options{Hooks: outbox.StoreHooks{Enqueue: h}})
	tx := e.begin(t)
	res, err := pgxv5.Enqueue(ctx, e.store, tx, msg("shop", 1))
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Len(t, h.ended, 1)
	require.Equal(t, res, h.res[0])
	require.Contains(t, h.ended[0].Headers, "traceparent")
	got, err := e.store.Get(ctx, res.ID)
	require.NoError(t, err)
	require.Equal(t, h.ended[0].Headers["traceparent"], got.Headers["traceparent"])
}

// claims is a publisher observer that counts the claims that found nothing.
type claims struct{ empty atomic.Int64 }

func (c *claims) StartPublish(ctx context.Context, _ []outbox.Delivery) context.Context { return ctx }
func (c *claims) EndPublish(context.Context, []outbox.Delivery, []outbox.AttemptResult) {}
func (c *claims) Settled(context.Context, []outbox.Settled)                             {}
func (c *claims) StartClaim(ctx context.Context) context.Context                        { return ctx }
func (c *claims) EndClaim(_ context.Context, n int, err error) {
	if n == 0 && err == nil {
		c.empty.Add(1)
	}
}

// newIdle returns a running publisher whose polling cannot explain a delivery within the
// tests' deadlines (once a minute), once its first claim has found nothing: what it
// delivers afterwards, only a wake-up can explain.
func newIdle(t *testing.T, s *outbox.Store, tr outbox.Transport, ns string) *outbox.Publisher {
	t.Helper()
	c := &claims{}
	p, err := outbox.NewPublisher(s, tr, outbox.PublisherOptions{
		Scope: outbox.Scope{Namespace: ns}, PollInterval: time.Minute, IdleBackoffMax: time.Minute,
		Lease: 3 * time.Minute, SweepInterval: time.Hour, Observer: c,
	})
	require.NoError(t, err)
	run(t, p)
	waitFor(t, 10*time.Second, "the publisher's first empty claim", func() bool { return c.empty.Load() > 0 })
	return p
}

// A commit on a pgx transaction wakes a publisher of another process (its own pool and
// Store) that polls once a minute, through NOTIFY; a rollback sends nothing.
func TestCommitWakesPublisherByNotify(t *testing.T) {
	t.Parallel()
	e := setup(t, outbox.Options{})
	app := "outbox_pgxv5_" + uuid.NewString()[:8]
	pubStore, err := pgxv5.New(e.newPool(t, app), outbox.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pubStore.DB().Close() })
	rec := newRecorder()
	newIdle(t, pubStore, rec.transport(), "shop")
	waitFor(t, 10*time.Second, "the listener", func() bool {
		var n int
		require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'`, app).Scan(&n))
		return n == 1
	})

	id := e.commitOne(t, "shop")
	waitFor(t, 10*time.Second, "a delivery woken by NOTIFY", func() bool { return rec.times(id) == 1 })
}

// With notifications off, a commit on a pgx transaction still wakes the publishers of the
// same Store in this process.
func TestCommitWakesPublisherInProcess(t *testing.T) {
	t.Parallel()
	e := setup(t, outbox.Options{DisableNotify: true})
	rec := newRecorder()
	newIdle(t, e.store, rec.transport(), "shop")
	id := e.commitOne(t, "shop")
	waitFor(t, 10*time.Second, "a delivery woken in process", func() bool { return rec.times(id) == 1 })
}

// Invalid input fails with a typed error before any SQL runs: nothing is written and the
// transaction goes on.
func TestValidationErrorsInsertNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, outbox.Options{})
	tx := e.begin(t)

	_, err := pgxv5.Enqueue(ctx, e.store, tx, outbox.Message{Topic: "t", Payload: json.RawMessage(`{}`)})
	require.ErrorIs(t, err, outbox.ErrInvalid)
	var ve *outbox.ValidationError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, "namespace", ve.Field)
	require.Equal(t, -1, ve.Index, "a single message has no index")

	bad := msg("shop", 2)
	bad.Payload = json.RawMessage(`{not json`)
	_, err = pgxv5.EnqueueBatch(ctx, e.store, tx, []outbox.Message{msg("shop", 1), bad})
	require.ErrorAs(t, err, &ve)
	require.Equal(t, "payload", ve.Field)
	require.Equal(t, 1, ve.Index)

	tenant := msg("shop", 3)
	tenant.TenantID, tenant.DedupeKey = uuid.New(), "k"
	_, err = pgxv5.Enqueue(ctx, e.store, tx, tenant)
	require.ErrorIs(t, err, outbox.ErrTenantMismatch)

	_, err = pgxv5.Enqueue(ctx, e.store, nil, msg("shop", 4))
	require.ErrorIs(t, err, outbox.ErrInvalid)
	_, err = pgxv5.Enqueue(ctx, nil, tx, msg("shop", 4))
	require.ErrorIs(t, err, outbox.ErrInvalid)

	_, err = tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, 1)
	require.NoError(t, err, "the transaction is usable")
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 0, e.count(t, "true"))
}

// A Store whose dialect cannot render its statements refuses a pgx transaction plainly.
func TestDialectWithoutRenderer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, outbox.Options{})
	s, err := outbox.New(testdb.SQLite(t), outbox.SQLite(), outbox.Options{})
	require.NoError(t, err)
	tx := e.begin(t)
	_, err = pgxv5.Enqueue(ctx, s, tx, msg("shop", 1))
	require.ErrorIs(t, err, errors.ErrUnsupported)
	require.ErrorContains(t, err, "does not render its statements")
}
