package outbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
)

// pubBackends are the backends every publisher test runs on. A backend whose server is
// unreachable is skipped by testdb (or fails under OUTBOX_TEST_REQUIRE).
var pubBackends = []string{"sqlite", "postgres", "mysql"}

func pubDialect(backend string) outbox.Dialect {
	switch backend {
	case "postgres":
		return outbox.Postgres()
	case "mysql":
		return outbox.MySQL()
	case "sqlite":
		return outbox.SQLite()
	}
	panic("no dialect for " + backend)
}

// pubDriver is the database/sql driver name testdb registers for backend.
func pubDriver(backend string) string {
	switch backend {
	case "postgres":
		return "pgx"
	case "mysql":
		return "mysql"
	}
	return "sqlite"
}

// pubEnv is one migrated, empty database and a store on it.
type pubEnv struct {
	backend string
	db      *sql.DB
	dsn     string // opens another pool to the same database or schema
	store   *outbox.Store
}

// eachBackend runs fn as a parallel subtest per backend.
func eachBackend(t *testing.T, fn func(t *testing.T, e *pubEnv)) {
	for _, b := range pubBackends {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			fn(t, pubSetup(t, b))
		})
	}
}

func pubSetup(t *testing.T, backend string) *pubEnv {
	t.Helper()
	ctx := context.Background()
	db := testdb.Open(t, backend)
	require.NoError(t, migrations.Up(ctx, db, backend, migrations.Options{}))
	e := &pubEnv{backend: backend, db: db, dsn: testdb.DSN(t, backend, db)}
	e.store = e.newStore(t, db, pubDialect(backend))
	return e
}

// openPool opens another pool on the test's database, closed before testdb drops it.
func (e *pubEnv) openPool(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open(pubDriver(e.backend), e.dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func (e *pubEnv) newStore(t *testing.T, db *sql.DB, d outbox.Dialect) *outbox.Store {
	t.Helper()
	s, err := outbox.New(db, d, outbox.Options{})
	require.NoError(t, err)
	return s
}

// enqueue commits n messages in namespace ns, topic "t", payloads {"n":i}, and returns
// their ids in order.
func (e *pubEnv) enqueue(t *testing.T, ns string, n int) []uuid.UUID {
	t.Helper()
	ctx := context.Background()
	ids := make([]uuid.UUID, 0, n)
	for start := 0; start < n; start += 500 {
		msgs := make([]outbox.Message, 0, 500)
		for i := start; i < min(n, start+500); i++ {
			msgs = append(msgs, outbox.Message{Namespace: ns, Topic: "t", PartitionKey: fmt.Sprint(i % 7),
				Headers: outbox.Headers{"seq": fmt.Sprint(i)}, Payload: []byte(fmt.Sprintf(`{"n": %d}`, i))})
		}
		tx, err := e.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		rs, err := e.store.EnqueueBatch(ctx, tx, msgs)
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		for _, r := range rs {
			ids = append(ids, r.ID)
		}
	}
	return ids
}

// rebind turns ? placeholders into PostgreSQL's $n.
func (e *pubEnv) rebind(q string) string { return testdb.Rebind(e.backend, q) }

// idArg binds a row id the way the backend stores it.
func (e *pubEnv) idArg(id uuid.UUID) any {
	if e.backend == "postgres" {
		return id.String()
	}
	return id[:]
}

// counts returns the number of rows per status.
func (e *pubEnv) counts(t require.TestingT) map[outbox.Status]int {
	rows, err := e.db.Query(`SELECT status, COUNT(*) FROM outbox_events GROUP BY status`)
	require.NoError(t, err)
	defer rows.Close()
	m := map[outbox.Status]int{}
	for rows.Next() {
		var s string
		var n int
		require.NoError(t, rows.Scan(&s, &n))
		m[outbox.Status(s)] = n
	}
	require.NoError(t, rows.Err())
	return m
}

// waitCounts polls the table until fn accepts the counts by status.
func (e *pubEnv) waitCounts(t *testing.T, within time.Duration, fn func(m map[outbox.Status]int) bool) map[outbox.Status]int {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		m := e.counts(t)
		if fn(m) {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("table did not reach the expected state within %s: %v", within, m)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *pubEnv) get(t require.TestingT, id uuid.UUID) outbox.Record {
	r, err := e.store.Get(context.Background(), id)
	require.NoError(t, err)
	return r
}

// testLogger writes the publisher's warnings and errors to the test log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// fastOptions are publisher options for tests: short intervals, quick retries.
func fastOptions(t *testing.T, ns string) outbox.PublisherOptions {
	return outbox.PublisherOptions{
		Scope:          outbox.Scope{Namespace: ns},
		BatchSize:      50,
		PollInterval:   20 * time.Millisecond,
		IdleBackoffMax: 100 * time.Millisecond,
		Lease:          3 * time.Second,
		Retry:          outbox.RetryPolicy{BaseDelay: 5 * time.Millisecond, MaxDelay: 50 * time.Millisecond, MaxAttempts: 10},
		SweepInterval:  100 * time.Millisecond,
		Logger:         testLogger(t),
	}
}

// start runs p until the test ends (or stop is called) and checks that Run returned nil.
func start(t *testing.T, p *outbox.Publisher) (stop func()) {
	t.Helper()
	return runUntilStopped(t, "Run", p.Run)
}

// runUntilStopped runs run (a Publisher's or a Relay's Run) until the test ends or stop is
// called, and checks that it returned nil within 30 s of its context's cancellation.
func runUntilStopped(t *testing.T, what string, run func(context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-errc:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Errorf("%s did not return within 30s of cancellation", what)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// recorder is a transport that records what it delivers and fails as told.
type recorder struct {
	mu        sync.Mutex
	inflight  map[uuid.UUID]string // id -> publisher holding it in a publish call
	attempts  map[uuid.UUID][]int  // attempts seen, in order
	delivered map[uuid.UUID]int    // successful publishes per id
	overlaps  []string
	// fail decides one message's outcome; nil delivers everything.
	fail func(d outbox.Delivery) error
}

func newRecorder(fail func(d outbox.Delivery) error) *recorder {
	return &recorder{inflight: map[uuid.UUID]string{}, attempts: map[uuid.UUID][]int{}, delivered: map[uuid.UUID]int{}, fail: fail}
}

// transport returns the recorder's Transport as used by publisher name.
func (r *recorder) transport(name string) outbox.Transport {
	return outbox.TransportFunc(func(ctx context.Context, batch []outbox.Delivery) []error {
		r.mu.Lock()
		for _, d := range batch {
			if other, ok := r.inflight[d.ID]; ok {
				r.overlaps = append(r.overlaps, fmt.Sprintf("%s in flight at %s and %s", d.ID, other, name))
			}
			r.inflight[d.ID] = name
			r.attempts[d.ID] = append(r.attempts[d.ID], d.Attempt)
		}
		r.mu.Unlock()
		// Let other claimers run while this batch is in flight.
		time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
		errs := make([]error, len(batch))
		r.mu.Lock()
		defer r.mu.Unlock()
		for i, d := range batch {
			delete(r.inflight, d.ID)
			if r.fail != nil {
				errs[i] = r.fail(d)
			}
			if errs[i] == nil {
				r.delivered[d.ID]++
			}
		}
		return errs
	})
}

func (r *recorder) seen(id uuid.UUID) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.attempts[id]...)
}

// deadLetters collects OnDead calls.
type deadLetters struct {
	mu  sync.Mutex
	dls []outbox.DeadLetter
}

func (d *deadLetters) hook(_ context.Context, dl outbox.DeadLetter) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dls = append(d.dls, dl)
}

func (d *deadLetters) all() []outbox.DeadLetter {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]outbox.DeadLetter(nil), d.dls...)
}

// TestPublisherConcurrentDrain: four publishers, each on its own pool as separate
// processes would be, drain 2000 messages through a transport that fails about 20% of
// deliveries. Every message is delivered, none is ever in flight at two owners at once, and
// none dies below the attempt limit.
func TestPublisherConcurrentDrain(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		const n = 2000
		ids, rec, m, total := e.drainByFour(t, "drain", n, func(o *outbox.PublisherOptions, tr outbox.Transport) outbox.Transport {
			o.Lease = 10 * time.Second
			if e.backend != "sqlite" { // SQLite has one writer: more loops only queue for it
				o.Concurrency = 2
			}
			return tr
		})
		t.Logf("%s: %v, stats %+v", e.backend, m, total)

		rec.mu.Lock()
		defer rec.mu.Unlock()
		require.Empty(t, rec.overlaps, "a message was in flight at two owners at once")
		duplicates := 0
		for _, id := range ids {
			r := e.get(t, id)
			if r.Status == outbox.StatusDead {
				require.Equal(t, 10, r.Attempts, "dead below the attempt limit: %s", r.LastError)
				continue
			}
			require.Equal(t, outbox.StatusDelivered, r.Status)
			require.Positive(t, rec.delivered[id], "message %s delivered but never published", id)
			duplicates += rec.delivered[id] - 1
			require.Len(t, rec.attempts[id], r.Attempts, "attempts recorded for %s", id)
		}
		// At least once: a message is published twice only when its first owner's lease ran
		// out before it could record the outcome (a SQLite writer can queue for seconds under
		// the race detector), and that owner then reports the lease lost.
		require.LessOrEqual(t, int64(duplicates), total.LeaseLost)
		require.Zero(t, total.Errors)
		require.EqualValues(t, m[outbox.StatusDelivered], total.Delivered)
		require.EqualValues(t, m[outbox.StatusDead], total.Dead)
		require.Equal(t, total.Claimed, total.Delivered+total.Retried+total.Dead+total.LeaseLost)
		require.Positive(t, total.Retried)
	})
}

// drainByFour enqueues n messages in namespace ns and drains them with four publishers,
// each on its own pool as separate processes would be, through a transport that fails about
// 20 % of deliveries; setup adjusts each publisher's options and may wrap its transport. It
// returns once every row is delivered or dead and the publishers have stopped: the ids, what
// the transport saw, the table's counts and the publishers' summed counters.
func (e *pubEnv) drainByFour(t *testing.T, ns string, n int, setup func(o *outbox.PublisherOptions, tr outbox.Transport) outbox.Transport) ([]uuid.UUID, *recorder, map[outbox.Status]int, outbox.PublisherStats) {
	t.Helper()
	ids := e.enqueue(t, ns, n)
	rec := newRecorder(func(outbox.Delivery) error {
		if rand.IntN(5) == 0 {
			return errors.New("broker hiccup")
		}
		return nil
	})
	var pubs []*outbox.Publisher
	var stops []func()
	for i := range 4 {
		o := fastOptions(t, ns)
		o.WorkerID = fmt.Sprintf("pub-%d", i)
		tr := setup(&o, rec.transport(o.WorkerID))
		p, err := outbox.NewPublisher(e.newStore(t, e.openPool(t), pubDialect(e.backend)), tr, o)
		require.NoError(t, err)
		pubs = append(pubs, p)
		stops = append(stops, start(t, p))
	}
	m := e.waitCounts(t, 2*time.Minute, func(m map[outbox.Status]int) bool {
		return m[outbox.StatusDelivered]+m[outbox.StatusDead] == n
	})
	for _, stop := range stops {
		stop()
	}
	return ids, rec, m, sumStats(pubs)
}

// sumStats adds up the counters of pubs.
func sumStats(pubs []*outbox.Publisher) outbox.PublisherStats {
	var total outbox.PublisherStats
	for _, p := range pubs {
		s := p.Stats()
		total.Claimed += s.Claimed
		total.Delivered += s.Delivered
		total.Retried += s.Retried
		total.Dead += s.Dead
		total.LeaseLost += s.LeaseLost
		total.Errors += s.Errors
	}
	return total
}

// Crash recovery runs a publisher in a child process (this test binary, re-executed), lets
// it claim a batch that its transport never finishes, kills it with SIGKILL, and checks that
// another publisher delivers every row once the lease has expired.
const (
	helperEnv        = "OUTBOX_PUBLISHER_HELPER"
	helperBackendEnv = "OUTBOX_PUBLISHER_HELPER_BACKEND"
	helperDSNEnv     = "OUTBOX_PUBLISHER_HELPER_DSN"
	helperFoldEnv    = "OUTBOX_PUBLISHER_HELPER_FOLD"
	crashLease       = time.Second
)

// TestPublisherHelperProcess is not a test: it is the child process of
// TestPublisherCrashRecovery, and returns at once in a normal run.
func TestPublisherHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		return
	}
	backend := os.Getenv(helperBackendEnv)
	db, err := sql.Open(pubDriver(backend), os.Getenv(helperDSNEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	dialect := pubDialect(backend)
	// The transport never returns: the process is killed with the batch in flight.
	tr := outbox.TransportFunc(func(ctx context.Context, batch []outbox.Delivery) []error {
		<-ctx.Done()
		return nil
	})
	o := outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "crash"}, WorkerID: "doomed", BatchSize: 100,
		Lease: crashLease, PollInterval: 50 * time.Millisecond}
	if os.Getenv(helperFoldEnv) == "1" {
		// Batches of five are published, and the settle that rides with the next claim
		// never returns: the process is killed between a publish and its settle.
		d := newFoldingDialect(backend)
		d.hang = true
		dialect = d
		tr = func(context.Context, []outbox.Delivery) []error { return nil }
		o.Namespace, o.BatchSize = "foldcrash", 5
	}
	store, err := outbox.New(db, dialect, outbox.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	p, err := outbox.NewPublisher(store, tr, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	_ = p.Run(context.Background())
	os.Exit(3) // unreachable: Run only returns when its context is cancelled
}

// syncBuffer collects a child's output while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// killHelper starts TestPublisherHelperProcess on e's database with env added, waits until
// ready (given the child's output so far) holds, and kills it with SIGKILL.
func killHelper(t *testing.T, e *pubEnv, what string, ready func(out string) bool, env ...string) {
	t.Helper()
	var out syncBuffer
	cmd := exec.Command(os.Args[0], "-test.run=^TestPublisherHelperProcess$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), helperEnv+"=1", helperBackendEnv+"="+e.backend, helperDSNEnv+"="+e.dsn), env...)
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	deadline := time.Now().Add(30 * time.Second)
	for !ready(out.String()) {
		select {
		case err := <-exited:
			t.Fatalf("child exited early (%v): %s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("child did not %s: %s", what, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(t, cmd.Process.Kill())
	<-exited
}

func TestPublisherCrashRecovery(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		const n = 25
		ids := e.enqueue(t, "crash", n)

		// Kill the child (SIGKILL: no shutdown, no cleanup) once it holds every row.
		killHelper(t, e, "claim the rows", func(string) bool { return e.counts(t)[outbox.StatusProcessing] >= n })

		var until time.Time
		for _, id := range ids {
			r := e.get(t, id)
			require.Equal(t, outbox.StatusProcessing, r.Status)
			require.Equal(t, "doomed", r.LockedBy)
			require.Equal(t, 1, r.Attempts)
			if r.LockedUntil.After(until) {
				until = r.LockedUntil
			}
		}

		var mu sync.Mutex
		deliveredAt := map[uuid.UUID]time.Time{}
		rec := newRecorder(func(d outbox.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			deliveredAt[d.ID] = time.Now()
			return nil
		})
		o := fastOptions(t, "crash")
		o.WorkerID = "survivor"
		p, err := outbox.NewPublisher(e.store, rec.transport("survivor"), o)
		require.NoError(t, err)
		start(t, p)
		e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == n })

		mu.Lock()
		at := maps.Clone(deliveredAt)
		mu.Unlock()
		for _, id := range ids {
			require.Equal(t, []int{2}, rec.seen(id), "the survivor delivers attempt 2 of %s", id)
			// Both clocks are this host's; allow for the database's rounding.
			require.False(t, at[id].Before(until.Add(-50*time.Millisecond)),
				"%s redelivered at %s, before its lease expired at %s", id, at[id], until)
			r := e.get(t, id)
			require.Equal(t, outbox.StatusDelivered, r.Status)
			require.Equal(t, 2, r.Attempts)
		}
	})
}

// TestPublisherPermanentError: a Permanent error dead-letters at once and calls OnDead; the
// other messages of the batch are delivered.
func TestPublisherPermanentError(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ids := e.enqueue(t, "perm", 5)
		poison := ids[2]
		rec := newRecorder(func(d outbox.Delivery) error {
			if d.ID == poison {
				return outbox.Permanent(errors.New("schema rejected"))
			}
			return nil
		})
		var dead deadLetters
		o := fastOptions(t, "perm")
		o.OnDead = dead.hook
		p, err := outbox.NewPublisher(e.store, rec.transport("p"), o)
		require.NoError(t, err)
		stop := start(t, p)
		e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool {
			return m[outbox.StatusDelivered] == 4 && m[outbox.StatusDead] == 1
		})
		stop()

		r := e.get(t, poison)
		require.Equal(t, outbox.StatusDead, r.Status)
		require.Equal(t, 1, r.Attempts)
		require.Equal(t, "permanent: schema rejected", r.LastError)
		dls := dead.all()
		require.Len(t, dls, 1)
		require.Equal(t, poison, dls[0].ID)
		require.Equal(t, "perm", dls[0].Namespace)
		require.JSONEq(t, `{"n": 2}`, string(dls[0].Payload))
		require.True(t, outbox.IsPermanent(dls[0].Err))
		require.Equal(t, r.LastError, dls[0].Reason)
		require.Equal(t, outbox.PublisherStats{Claimed: 5, Delivered: 4, Dead: 1}, p.Stats())
	})
}

// TestPublisherRetryAfter: a RetryAfter delay replaces the policy's backoff.
func TestPublisherRetryAfter(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ids := e.enqueue(t, "later", 1)
		const after = 1500 * time.Millisecond
		var failedAt time.Time
		var mu sync.Mutex
		rec := newRecorder(func(d outbox.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			if d.Attempt == 1 {
				failedAt = time.Now()
				return outbox.RetryAfter(errors.New("slow down"), after)
			}
			return nil
		})
		o := fastOptions(t, "later")
		// Were RetryAfter ignored, the next attempt would be half an hour away.
		o.Retry = outbox.RetryPolicy{BaseDelay: time.Hour, MaxDelay: time.Hour, MaxAttempts: 5}
		p, err := outbox.NewPublisher(e.store, rec.transport("p"), o)
		require.NoError(t, err)
		start(t, p)

		var r outbox.Record
		require.Eventually(t, func() bool {
			r = e.get(t, ids[0])
			return r.Status == outbox.StatusPending && r.Attempts == 1
		}, 10*time.Second, 5*time.Millisecond)
		require.Contains(t, r.LastError, "slow down")
		require.InDelta(t, after.Seconds(), r.NextAttemptAt.Sub(r.UpdatedAt).Seconds(), 0.01,
			"next_attempt_at %s - updated_at %s", r.NextAttemptAt, r.UpdatedAt)

		e.waitCounts(t, 10*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == 1 })
		require.Equal(t, []int{1, 2}, rec.seen(ids[0]))
		mu.Lock()
		defer mu.Unlock()
		require.GreaterOrEqual(t, time.Since(failedAt), after-50*time.Millisecond)
	})
}

// TestPublisherAttemptLimit: a message that always fails dies after MaxAttempts attempts.
func TestPublisherAttemptLimit(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ids := e.enqueue(t, "limit", 1)
		down := errors.New("broker down")
		rec := newRecorder(func(outbox.Delivery) error { return down })
		var dead deadLetters
		o := fastOptions(t, "limit")
		o.Retry = outbox.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond, MaxAttempts: 3}
		o.OnDead = dead.hook
		p, err := outbox.NewPublisher(e.store, rec.transport("p"), o)
		require.NoError(t, err)
		stop := start(t, p)
		e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDead] == 1 })
		stop()

		require.Equal(t, []int{1, 2, 3}, rec.seen(ids[0]))
		r := e.get(t, ids[0])
		require.Equal(t, 3, r.Attempts)
		require.Contains(t, r.LastError, "attempt limit reached (3 of 3)")
		require.Contains(t, r.LastError, "broker down")
		dls := dead.all()
		require.Len(t, dls, 1)
		require.ErrorIs(t, dls[0].Err, outbox.ErrAttemptLimit)
		require.ErrorIs(t, dls[0].Err, down)
		require.Equal(t, 3, dls[0].Attempt)
		require.Equal(t, outbox.PublisherStats{Claimed: 3, Retried: 2, Dead: 1}, p.Stats())
	})
}

// TestPublisherIntegrity: a payload changed in the table after enqueue is dead-lettered with
// an integrity reason and never reaches the transport.
func TestPublisherIntegrity(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ids := e.enqueue(t, "tamper", 3)
		bad := ids[1]
		_, err := e.db.Exec(e.rebind(`UPDATE outbox_events SET payload = ? WHERE id = ?`), `{"n": 1000000}`, e.idArg(bad))
		require.NoError(t, err)

		rec := newRecorder(nil)
		var dead deadLetters
		o := fastOptions(t, "tamper")
		o.OnDead = dead.hook
		p, err := outbox.NewPublisher(e.store, rec.transport("p"), o)
		require.NoError(t, err)
		stop := start(t, p)
		e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool {
			return m[outbox.StatusDelivered] == 2 && m[outbox.StatusDead] == 1
		})
		stop()

		require.Empty(t, rec.seen(bad), "a tampered payload reached the transport")
		require.Equal(t, []int{1}, rec.seen(ids[0]))
		r := e.get(t, bad)
		require.Equal(t, outbox.StatusDead, r.Status)
		require.Contains(t, r.LastError, "integrity")
		dls := dead.all()
		require.Len(t, dls, 1)
		require.Equal(t, bad, dls[0].ID)
		require.ErrorIs(t, dls[0].Err, outbox.ErrIntegrity)
		require.Equal(t, outbox.PublisherStats{Claimed: 3, Delivered: 2, Dead: 1}, p.Stats())
	})
}

// countingDialect counts Claim calls.
type countingDialect struct {
	outbox.Dialect
	claims atomic.Int64
}

func (d *countingDialect) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]outbox.Record, error) {
	d.claims.Add(1)
	return d.Dialect.Claim(ctx, db, t, p)
}

// TestPublisherIdleBackoff: an idle publisher backs off instead of polling every
// PollInterval, and picks up new work again.
func TestPublisherIdleBackoff(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		d := &countingDialect{Dialect: pubDialect(e.backend)}
		store := e.newStore(t, e.db, d)
		o := fastOptions(t, "idle")
		o.PollInterval, o.IdleBackoffMax, o.Lease = 50*time.Millisecond, 400*time.Millisecond, time.Second
		rec := newRecorder(nil)
		p, err := outbox.NewPublisher(store, rec.transport("p"), o)
		require.NoError(t, err)

		const window = 1500 * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), window)
		defer cancel()
		require.NoError(t, p.Run(ctx))
		// Waits of 50, 100, 200, 400, 400, ... ms give about 7 claims in 1.5s; polling at
		// PollInterval would give 30.
		claims := d.claims.Load()
		t.Logf("%s: %d claims in %s", e.backend, claims, window)
		require.LessOrEqual(t, claims, int64(10))
		require.GreaterOrEqual(t, claims, int64(2))

		// Work resets the backoff: an enqueue is picked up within IdleBackoffMax or so.
		start(t, p)
		ids := e.enqueue(t, "idle", 1)
		e.waitCounts(t, 10*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == 1 })
		require.Equal(t, []int{1}, rec.seen(ids[0]))
	})
}

// TestPublisherSweep: rows that reached the attempt limit under a lease that then expired
// (their worker crashed during the last attempt) are buried by the sweep, with OnDead.
func TestPublisherSweep(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ids := e.enqueue(t, "sweep", 3)
		recs, err := e.store.Claim(context.Background(), outbox.ClaimOptions{
			Scope: outbox.Scope{Namespace: "sweep"}, Limit: 10, Lease: 100 * time.Millisecond, MaxAttempts: 5, WorkerID: "crashed",
		})
		require.NoError(t, err)
		require.Len(t, recs, 3)

		rec := newRecorder(nil)
		var dead deadLetters
		o := fastOptions(t, "sweep")
		o.Retry.MaxAttempts = 1
		o.OnDead = dead.hook
		p, err := outbox.NewPublisher(e.store, rec.transport("p"), o)
		require.NoError(t, err)
		stop := start(t, p)
		e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDead] == 3 })
		stop()

		require.Empty(t, rec.seen(ids[0]), "a row at the attempt limit was published")
		dls := dead.all()
		require.Len(t, dls, 3)
		got := map[uuid.UUID]bool{}
		for _, dl := range dls {
			got[dl.ID] = true
			require.ErrorIs(t, dl.Err, outbox.ErrAttemptLimit)
			require.Equal(t, "sweep", dl.Namespace)
			require.Equal(t, 1, dl.Attempt)
			require.Contains(t, dl.Reason, "attempt limit")
		}
		for _, id := range ids {
			require.True(t, got[id])
		}
		require.Equal(t, outbox.PublisherStats{Dead: 3}, p.Stats())
	})
}

// TestPublisherTransportFaults: a panicking transport and one that returns the wrong number
// of results fail their batch, which is retried; the process carries on.
func TestPublisherTransportFaults(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ids := e.enqueue(t, "faults", 3)
		var calls atomic.Int64
		tr := outbox.TransportFunc(func(ctx context.Context, batch []outbox.Delivery) []error {
			switch calls.Add(1) {
			case 1:
				panic("transport bug")
			case 2:
				return make([]error, len(batch)+1) // one result too many
			}
			return nil
		})
		o := fastOptions(t, "faults")
		o.Logger = slog.New(slog.DiscardHandler) // the faults log stack traces
		p, err := outbox.NewPublisher(e.store, tr, o)
		require.NoError(t, err)
		stop := start(t, p)
		e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == 3 })
		stop()
		// The first two calls failed every message they held; which messages shared a call
		// depends on when their jittered retries fell due.
		claimed := 0
		for _, id := range ids {
			r := e.get(t, id)
			require.GreaterOrEqual(t, r.Attempts, 2, "the first call held every row")
			claimed += r.Attempts
		}
		require.Equal(t, outbox.PublisherStats{Claimed: int64(claimed), Delivered: 3, Retried: int64(claimed - 3), Errors: 2}, p.Stats())
	})
}

// TestPublisherScope: a publisher takes only its namespace, topics and tenant.
func TestPublisherScope(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ctx := context.Background()
		tenant := uuid.New()
		msgs := []outbox.Message{
			{Namespace: "a", Topic: "x", TenantID: tenant, Payload: []byte(`1`)}, // in scope
			{Namespace: "a", Topic: "x", Payload: []byte(`2`)},                   // no tenant
			{Namespace: "a", Topic: "y", TenantID: tenant, Payload: []byte(`3`)}, // other topic
			{Namespace: "b", Topic: "x", TenantID: tenant, Payload: []byte(`4`)}, // other namespace
		}
		tx, err := e.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		rs, err := e.store.EnqueueBatch(ctx, tx, msgs)
		require.NoError(t, err)
		require.NoError(t, tx.Commit())

		rec := newRecorder(nil)
		o := fastOptions(t, "a")
		o.Topics, o.TenantID = []string{"x"}, tenant
		p, err := outbox.NewPublisher(e.store, rec.transport("p"), o)
		require.NoError(t, err)
		stop := start(t, p)
		e.waitCounts(t, 10*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == 1 })
		stop()
		require.Equal(t, []int{1}, rec.seen(rs[0].ID))
		require.Equal(t, map[outbox.Status]int{outbox.StatusDelivered: 1, outbox.StatusPending: 3}, e.counts(t))
	})
}

// TestPublisherShutdown: cancelling Run's context mid-batch lets the in-flight batch finish
// and settle; a batch still in flight at the shutdown deadline has its transport context
// cancelled, keeps its lease, and a restarted publisher finishes it. No goroutine outlives Run.
//
// Not parallel, by necessity: goleak inspects every goroutine of the process, so this test
// runs while the parallel tests are still paused, and its backends run one after another.
func TestPublisherShutdown(t *testing.T) {
	for _, b := range pubBackends {
		t.Run(b+"/graceful", func(t *testing.T) {
			e := pubSetup(t, b)
			ids := e.enqueue(t, "shut", 10)
			started, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			var delivered atomic.Int64
			tr := outbox.TransportFunc(func(ctx context.Context, batch []outbox.Delivery) []error {
				once.Do(func() { close(started) })
				select {
				case <-release:
					delivered.Add(int64(len(batch)))
					return nil
				case <-ctx.Done():
					return failAllTest(len(batch), ctx.Err())
				}
			})
			o := fastOptions(t, "shut")
			o.ShutdownTimeout = 10 * time.Second
			p, err := outbox.NewPublisher(e.store, tr, o)
			require.NoError(t, err)

			leaks := goleakBaseline()
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() { errc <- p.Run(ctx) }()
			<-started
			cancel()
			select {
			case err := <-errc:
				t.Fatalf("Run returned (%v) with a publish in flight", err)
			case <-time.After(100 * time.Millisecond): // Run must still be waiting for the batch
			}
			cancelled := time.Now()
			close(release)
			require.NoError(t, <-errc)
			require.Less(t, time.Since(cancelled), o.ShutdownTimeout)
			goleak.VerifyNone(t, leaks...)

			require.EqualValues(t, 10, delivered.Load())
			for _, id := range ids {
				require.Equal(t, outbox.StatusDelivered, e.get(t, id).Status)
			}
			require.Equal(t, outbox.PublisherStats{Claimed: 10, Delivered: 10}, p.Stats())
		})

		t.Run(b+"/deadline", func(t *testing.T) {
			e := pubSetup(t, b)
			ids := e.enqueue(t, "shut", 10)
			started := make(chan struct{}, 1)
			var firstRun atomic.Bool
			firstRun.Store(true)
			rec := newRecorder(nil)
			recorded := rec.transport("second")
			tr := outbox.TransportFunc(func(ctx context.Context, batch []outbox.Delivery) []error {
				if firstRun.Load() {
					// A slow broker: holds the batch until the shutdown deadline cancels ctx.
					started <- struct{}{}
					<-ctx.Done()
					return failAllTest(len(batch), ctx.Err())
				}
				return recorded.Publish(ctx, batch)
			})
			o := fastOptions(t, "shut")
			o.Lease = 1500 * time.Millisecond
			o.ShutdownTimeout = 300 * time.Millisecond
			p, err := outbox.NewPublisher(e.store, tr, o)
			require.NoError(t, err)

			leaks := goleakBaseline()
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() { errc <- p.Run(ctx) }()
			<-started
			cancelled := time.Now() // before cancel: Run may start its deadline before this goroutine runs again
			cancel()
			require.NoError(t, <-errc)
			took := time.Since(cancelled)
			require.GreaterOrEqual(t, took, o.ShutdownTimeout)
			require.Less(t, took, o.ShutdownTimeout+time.Second, "Run took %s to shut down", took)
			goleak.VerifyNone(t, leaks...)

			// Nothing half-written: the rows keep the first run's lease.
			for _, id := range ids {
				r := e.get(t, id)
				require.Equal(t, outbox.StatusProcessing, r.Status)
				require.Equal(t, 1, r.Attempts)
			}
			require.Equal(t, outbox.PublisherStats{Claimed: 10}, p.Stats())

			// Restarted, the publisher reclaims them once the lease expires.
			firstRun.Store(false)
			ctx, cancel = context.WithCancel(context.Background())
			go func() { errc <- p.Run(ctx) }()
			e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == 10 })
			cancel()
			require.NoError(t, <-errc)
			goleak.VerifyNone(t, leaks...)
			for _, id := range ids {
				require.Equal(t, []int{2}, rec.seen(id))
			}
		})
	}
}

// goleakBaseline ignores the goroutines that exist now and those that belong to the
// caller's connection pool rather than to the publisher: go-sql-driver/mysql runs one
// watcher per open connection, living as long as the *sql.DB keeps the connection.
func goleakBaseline() []goleak.Option {
	return []goleak.Option{goleak.IgnoreCurrent(),
		goleak.IgnoreTopFunction("github.com/go-sql-driver/mysql.(*mysqlConn).startWatcher.func1")}
}

func failAllTest(n int, err error) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// TestPublisherLeaseRenewal: a publish that outlasts the lease it was claimed with is still
// acked, because the publisher renews the lease; a competing publisher never gets the rows.
func TestPublisherLeaseRenewal(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		// The renewal runs every lease/3 and must land before the lease runs out: 1.5 s leaves
		// it a second, which a renewal on SQLite under the race detector on a loaded 2-core
		// machine once missed at a 500 ms lease.
		const lease = 1500 * time.Millisecond
		ids := e.enqueue(t, "renew", 5)
		rec := newRecorder(nil)
		slow := rec.transport("slow")
		started := make(chan struct{}, 1)
		o := fastOptions(t, "renew")
		o.Lease, o.PollInterval = lease, 50*time.Millisecond
		tr := outbox.TransportFunc(func(ctx context.Context, batch []outbox.Delivery) []error {
			select {
			case started <- struct{}{}:
			default:
			}
			// Publish until half a lease after the lease the rows were claimed with ran out,
			// the rival polling all the while: only the renewals keep the rows from it.
			r, err := e.store.Get(ctx, batch[0].ID)
			if err != nil {
				return failAllTest(len(batch), err)
			}
			select {
			case <-time.After(time.Until(r.LockedUntil) + lease/2):
			case <-ctx.Done():
			}
			return slow.Publish(ctx, batch)
		})
		p, err := outbox.NewPublisher(e.store, tr, o)
		require.NoError(t, err)
		stop := start(t, p)
		<-started

		// A rival on its own pool polls all the while.
		rival, err := outbox.NewPublisher(e.newStore(t, e.openPool(t), pubDialect(e.backend)), rec.transport("rival"), o)
		require.NoError(t, err)
		stopRival := start(t, rival)

		e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == 5 })
		stop()
		stopRival()
		rec.mu.Lock()
		defer rec.mu.Unlock()
		require.Empty(t, rec.overlaps)
		for _, id := range ids {
			require.Equal(t, 1, rec.delivered[id])
			require.Equal(t, []int{1}, rec.attempts[id])
		}
		require.Equal(t, outbox.PublisherStats{Claimed: 5, Delivered: 5}, p.Stats())
		require.Zero(t, rival.Stats().Claimed)
	})
}

// TestPublisherRunTwice: a second concurrent Run fails; Run can be called again afterwards.
func TestPublisherRunTwice(t *testing.T) {
	t.Parallel()
	e := pubSetup(t, "sqlite")
	e.enqueue(t, "twice", 1)
	running := make(chan struct{}, 1)
	tr := outbox.PerMessage(func(context.Context, outbox.Delivery) error {
		running <- struct{}{}
		return nil
	})
	p, err := outbox.NewPublisher(e.store, tr, fastOptions(t, "twice"))
	require.NoError(t, err)
	stop := start(t, p)
	<-running // the first Run is under way
	require.ErrorIs(t, p.Run(context.Background()), outbox.ErrPublisherRunning)
	stop()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, p.Run(ctx))
}

func TestPublisherOptionsValidation(t *testing.T) {
	t.Parallel()
	e := pubSetup(t, "sqlite")
	tr := newRecorder(nil).transport("p")
	ok := outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "ns"}}

	p, err := outbox.NewPublisher(e.store, tr, ok)
	require.NoError(t, err)
	_, err = uuid.Parse(p.WorkerID())
	require.NoError(t, err, "the default worker id is a UUID")

	for _, tc := range []struct {
		field string
		edit  func(o *outbox.PublisherOptions)
	}{
		{"Namespace", func(o *outbox.PublisherOptions) { o.Namespace = "" }},
		{"Topics", func(o *outbox.PublisherOptions) { o.Topics = []string{""} }},
		{"BatchSize", func(o *outbox.PublisherOptions) { o.BatchSize = outbox.MaxBatch + 1 }},
		{"BatchSize", func(o *outbox.PublisherOptions) { o.BatchSize = -1 }},
		{"Lease", func(o *outbox.PublisherOptions) { o.Lease = time.Millisecond }},
		{"PollInterval", func(o *outbox.PublisherOptions) { o.Lease, o.PollInterval = 3*time.Second, 1001*time.Millisecond }},
		{"PollInterval", func(o *outbox.PublisherOptions) { o.PollInterval = -time.Second }},
		{"IdleBackoffMax", func(o *outbox.PublisherOptions) { o.PollInterval, o.IdleBackoffMax = time.Second, time.Millisecond }},
		{"MaxDelay", func(o *outbox.PublisherOptions) {
			o.Retry = outbox.RetryPolicy{BaseDelay: time.Minute, MaxDelay: time.Second}
		}},
		{"MaxAttempts", func(o *outbox.PublisherOptions) { o.Retry.MaxAttempts = -1 }},
		{"WorkerID", func(o *outbox.PublisherOptions) { o.WorkerID = strings.Repeat("w", outbox.MaxWorkerIDBytes+1) }},
		{"Concurrency", func(o *outbox.PublisherOptions) { o.Concurrency = -2 }},
		{"ShutdownTimeout", func(o *outbox.PublisherOptions) { o.ShutdownTimeout = -1 }},
		{"SweepInterval", func(o *outbox.PublisherOptions) { o.SweepInterval = -1 }},
	} {
		o := ok
		tc.edit(&o)
		_, err := outbox.NewPublisher(e.store, tr, o)
		var ve *outbox.ValidationError
		require.ErrorAs(t, err, &ve, tc.field)
		require.ErrorIs(t, err, outbox.ErrInvalid)
		require.Equal(t, tc.field, ve.Field)
	}
	_, err = outbox.NewPublisher(nil, tr, ok)
	require.ErrorIs(t, err, outbox.ErrInvalid)
	_, err = outbox.NewPublisher(e.store, nil, ok)
	require.ErrorIs(t, err, outbox.ErrInvalid)

	// A short lease without a poll interval gets Lease/3, not a refusal.
	_, err = outbox.NewPublisher(e.store, tr, outbox.PublisherOptions{Scope: ok.Scope, Lease: 300 * time.Millisecond})
	require.NoError(t, err)
}

// TestPerMessage: the per-message adapter keeps outcomes at their index and fails what it
// could not start once the context is done.
func TestPerMessage(t *testing.T) {
	t.Parallel()
	batch := []outbox.Delivery{{Attempt: 1}, {Attempt: 2}, {Attempt: 3}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr := outbox.PerMessage(func(ctx context.Context, d outbox.Delivery) error {
		if d.Attempt == 2 {
			cancel()
			return errors.New("boom")
		}
		return nil
	})
	errs := tr.Publish(ctx, batch)
	require.Len(t, errs, 3)
	require.NoError(t, errs[0])
	require.EqualError(t, errs[1], "boom")
	require.ErrorIs(t, errs[2], context.Canceled)

	all := outbox.PerMessage(func(context.Context, outbox.Delivery) error { return nil })
	require.Nil(t, all.Publish(context.Background(), batch))
}

// faultyDialect injects database failures into a real dialect: each counter is the number
// of calls of that method still to fail. Extend can also be made a silent no-op, as if the
// renewals never reached the database.
type faultyDialect struct {
	outbox.Dialect
	claimFails, completeFails atomic.Int64
	// lostReplies is the number of Complete calls still to apply their outcomes and then
	// report an error anyway, as when a commit's reply is lost on the way back.
	lostReplies atomic.Int64
	skipExtend  atomic.Bool
	extendFails atomic.Int64
	// slowExtends is the number of renewals still to answer extendDelay after they renewed;
	// extends counts the renewals that reached the database.
	slowExtends, extends atomic.Int64
	extendDelay          time.Duration
	completes            atomic.Int64
	// lateReply, when set, holds back the answer of the first claim that brings rows:
	// claimed is closed once the rows are leased, and the claim returns them when lateReply
	// is closed, as a claim whose commit waited on a synchronous standby.
	lateReply, claimed chan struct{}
	late               sync.Once
	// gate, when set, holds every claim after the first until it is closed.
	gate   chan struct{}
	claims atomic.Int64
}

var errInjected = errors.New("injected database failure")

func (d *faultyDialect) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]outbox.Record, error) {
	if d.claimFails.Add(-1) >= 0 {
		return nil, errInjected
	}
	if d.gate != nil && d.claims.Add(1) > 1 {
		select {
		case <-d.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	recs, err := d.Dialect.Claim(ctx, db, t, p)
	if len(recs) > 0 && d.lateReply != nil {
		d.late.Do(func() {
			close(d.claimed)
			select {
			case <-d.lateReply:
			case <-ctx.Done():
			}
		})
	}
	return recs, err
}

func (d *faultyDialect) Complete(ctx context.Context, q dialect.DBTX, t dialect.Table, o []outbox.Outcome) ([]uuid.UUID, error) {
	d.completes.Add(1)
	if d.completeFails.Add(-1) >= 0 {
		return nil, errInjected
	}
	if d.lostReplies.Add(-1) >= 0 {
		if _, err := d.Dialect.Complete(ctx, q, t, o); err != nil {
			return nil, err
		}
		return nil, errInjected
	}
	return d.Dialect.Complete(ctx, q, t, o)
}

func (d *faultyDialect) Extend(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ExtendParams) ([]uuid.UUID, error) {
	if d.skipExtend.Load() {
		return nil, nil
	}
	if d.extendFails.Add(-1) >= 0 {
		return nil, errInjected
	}
	d.extends.Add(1)
	lost, err := d.Dialect.Extend(ctx, q, t, p)
	if d.slowExtends.Add(-1) >= 0 {
		time.Sleep(d.extendDelay) // the renewal's answer comes back late
	}
	return lost, err
}

// TestPublisherDatabaseErrors: failing claims are retried after a backoff; a failing
// Complete is retried and then succeeds, settling the batch once.
func TestPublisherDatabaseErrors(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ids := e.enqueue(t, "dberr", 5)
		d := &faultyDialect{Dialect: pubDialect(e.backend)}
		d.claimFails.Store(3)
		d.completeFails.Store(2)
		rec := newRecorder(nil)
		o := fastOptions(t, "dberr")
		o.Logger = slog.New(slog.DiscardHandler) // the injected failures are logged as errors
		p, err := outbox.NewPublisher(e.newStore(t, e.db, d), rec.transport("p"), o)
		require.NoError(t, err)
		stop := start(t, p)
		e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == 5 })
		stop()
		for _, id := range ids {
			require.Equal(t, []int{1}, rec.seen(id))
		}
		require.EqualValues(t, 3, d.completes.Load(), "two failed tries and one that worked")
		require.Equal(t, outbox.PublisherStats{Claimed: 5, Delivered: 5, Errors: 5}, p.Stats())
	})
}

// TestPublisherSettleCommittedButErrored: a Complete that committed but reported an error
// (its reply was lost) is retried; the retry finds the rows already settled under this
// publisher's own token, so they count as delivered and dead, OnDead runs once, and no
// lease is reported lost.
func TestPublisherSettleCommittedButErrored(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ids := e.enqueue(t, "lostreply", 2)
		d := &faultyDialect{Dialect: pubDialect(e.backend)}
		d.lostReplies.Store(1)
		rec := newRecorder(func(dl outbox.Delivery) error {
			if dl.ID == ids[1] {
				return outbox.Permanent(errors.New("rejected"))
			}
			return nil
		})
		var deadMu sync.Mutex
		var dead []uuid.UUID
		o := fastOptions(t, "lostreply")
		o.Logger = slog.New(slog.DiscardHandler)
		o.OnDead = func(_ context.Context, dl outbox.DeadLetter) {
			deadMu.Lock()
			defer deadMu.Unlock()
			dead = append(dead, dl.ID)
		}
		p, err := outbox.NewPublisher(e.newStore(t, e.db, d), rec.transport("p"), o)
		require.NoError(t, err)
		stop := start(t, p)
		e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool {
			return m[outbox.StatusDelivered] == 1 && m[outbox.StatusDead] == 1
		})
		require.Eventually(t, func() bool { return p.Stats().Dead == 1 }, 10*time.Second, 10*time.Millisecond)
		stop()
		require.Equal(t, outbox.PublisherStats{Claimed: 2, Delivered: 1, Dead: 1, Errors: 1}, p.Stats())
		deadMu.Lock()
		defer deadMu.Unlock()
		require.Equal(t, []uuid.UUID{ids[1]}, dead, "OnDead runs once for the dead row")
	})
}

// TestPublisherSettleGivesUp: when Complete keeps failing, the publisher leaves the rows
// leased, and they are delivered again once the lease expires: at least once.
func TestPublisherSettleGivesUp(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ids := e.enqueue(t, "giveup", 3)
		d := &faultyDialect{Dialect: pubDialect(e.backend)}
		d.completeFails.Store(4) // every try of the first batch
		rec := newRecorder(nil)
		o := fastOptions(t, "giveup")
		o.Lease = 600 * time.Millisecond
		o.Logger = slog.New(slog.DiscardHandler)
		p, err := outbox.NewPublisher(e.newStore(t, e.db, d), rec.transport("p"), o)
		require.NoError(t, err)
		stop := start(t, p)
		e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == 3 })
		stop()
		for _, id := range ids {
			require.Equal(t, []int{1, 2}, rec.seen(id), "redelivered after the lease expired")
			require.Equal(t, 2, e.get(t, id).Attempts)
		}
		require.Equal(t, outbox.PublisherStats{Claimed: 6, Delivered: 3, Errors: 4}, p.Stats())
	})
}

// TestPublisherLeaseLost: a publisher whose lease ran out (its renewals never landed) and
// whose rows another publisher delivered meanwhile reports the lease lost and does not
// overwrite the other's outcome with its own failure.
func TestPublisherLeaseLost(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ids := e.enqueue(t, "lost", 4)
		d := &faultyDialect{Dialect: pubDialect(e.backend)}
		d.skipExtend.Store(true)
		taken := make(chan struct{})
		slowStarted := make(chan struct{}, 1)
		slow := outbox.TransportFunc(func(ctx context.Context, batch []outbox.Delivery) []error {
			slowStarted <- struct{}{}
			select { // hold the batch until the rival has delivered it
			case <-taken:
			case <-ctx.Done():
			}
			return failAllTest(len(batch), errors.New("too late"))
		})
		o := fastOptions(t, "lost")
		o.Lease = 300 * time.Millisecond
		o.Logger = slog.New(slog.DiscardHandler) // lost leases are logged as warnings
		stale, err := outbox.NewPublisher(e.newStore(t, e.db, d), slow, o)
		require.NoError(t, err)
		stopStale := start(t, stale)
		<-slowStarted

		rec := newRecorder(func(outbox.Delivery) error { return nil })
		rival, err := outbox.NewPublisher(e.newStore(t, e.openPool(t), pubDialect(e.backend)), rec.transport("rival"), fastOptions(t, "lost"))
		require.NoError(t, err)
		stopRival := start(t, rival)
		e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == 4 })
		close(taken)
		require.Eventually(t, func() bool { return stale.Stats().LeaseLost == 4 }, 10*time.Second, 5*time.Millisecond)
		stopStale()
		stopRival()

		for _, id := range ids {
			r := e.get(t, id)
			require.Equal(t, outbox.StatusDelivered, r.Status, "the stale worker's failure must not overwrite the delivery")
			require.Empty(t, r.LastError)
			require.Equal(t, []int{2}, rec.seen(id))
		}
		require.Equal(t, outbox.PublisherStats{Claimed: 4, LeaseLost: 4}, stale.Stats())
	})
}

// TestPublisherLateClaimAnswer: a claim whose answer came back after its rows' lease had
// run out (its commit waited on a synchronous standby) renews the leases before it
// publishes. Rows another publisher claimed meanwhile are left to it. When the renewal
// fails, the rows are left until their lease runs out, and delivered by a later claim.
func TestPublisherLateClaimAnswer(t *testing.T) {
	t.Parallel()
	// lateStart starts a publisher with a 300 ms lease whose first claim with rows answers
	// only when release is called, and returns it, stop, what its transport saw, and
	// release.
	lateStart := func(t *testing.T, e *pubEnv, d *faultyDialect) (late *outbox.Publisher, stop func(), rec *recorder, release func()) {
		d.lateReply, d.claimed = make(chan struct{}), make(chan struct{})
		var once sync.Once
		release = func() { once.Do(func() { close(d.lateReply) }) }
		o := fastOptions(t, "late")
		o.Lease = 300 * time.Millisecond
		o.Logger = slog.New(slog.DiscardHandler) // lost leases and the failed renewal are logged
		rec = newRecorder(nil)
		late, err := outbox.NewPublisher(e.newStore(t, e.db, d), rec.transport("late"), o)
		require.NoError(t, err)
		stop = start(t, late)
		t.Cleanup(release) // before the publisher is stopped, also when the test fails first
		select {
		case <-d.claimed:
		case <-time.After(30 * time.Second):
			t.Fatal("the late publisher claimed nothing")
		}
		return late, stop, rec, release
	}

	t.Run("taken meanwhile", func(t *testing.T) {
		t.Parallel()
		eachBackend(t, func(t *testing.T, e *pubEnv) {
			ids := e.enqueue(t, "late", 4)
			late, stopLate, lateRec, release := lateStart(t, e, &faultyDialect{Dialect: pubDialect(e.backend)})

			// The rival claims the rows once their lease has run out, and holds them in
			// its transport until the late claim has answered and the late publisher has
			// stopped.
			rivalHas, rivalGo := make(chan struct{}), make(chan struct{})
			var has, goes sync.Once
			letRivalGo := func() { goes.Do(func() { close(rivalGo) }) }
			rec := newRecorder(nil)
			rivalTr := rec.transport("rival")
			rival, err := outbox.NewPublisher(e.newStore(t, e.openPool(t), pubDialect(e.backend)),
				outbox.TransportFunc(func(ctx context.Context, batch []outbox.Delivery) []error {
					has.Do(func() { close(rivalHas) })
					<-rivalGo
					return rivalTr.Publish(ctx, batch)
				}), fastOptions(t, "late"))
			require.NoError(t, err)
			stopRival := start(t, rival)
			t.Cleanup(letRivalGo)
			select {
			case <-rivalHas:
			case <-time.After(30 * time.Second):
				t.Fatal("the rival claimed nothing")
			}
			release()
			require.Eventually(t, func() bool { return late.Stats().LeaseLost == 4 }, 10*time.Second, 5*time.Millisecond)
			stopLate() // a batch it claimed is published before Run returns
			for _, id := range ids {
				require.Empty(t, lateRec.seen(id), "the late publisher published a row the rival held")
			}
			letRivalGo()
			e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == 4 })
			stopRival()
			for _, id := range ids {
				require.Equal(t, []int{2}, rec.seen(id))
			}
			require.Equal(t, outbox.PublisherStats{Claimed: 4, LeaseLost: 4}, late.Stats())
		})
	})

	t.Run("renewal late too", func(t *testing.T) {
		t.Parallel()
		eachBackend(t, func(t *testing.T, e *pubEnv) {
			ids := e.enqueue(t, "late", 4)
			d := &faultyDialect{Dialect: pubDialect(e.backend), extendDelay: 150 * time.Millisecond}
			d.slowExtends.Store(1)
			late, stop, rec, release := lateStart(t, e, d)
			time.Sleep(300 * time.Millisecond) // the claim answers a whole lease late
			release()
			e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == 4 })
			stop()
			for _, id := range ids {
				require.Equal(t, []int{1}, rec.seen(id), "published from the late claim, once renewed")
			}
			require.GreaterOrEqual(t, d.extends.Load(), int64(2), "a renewal that answered a third of the lease late is made again")
			require.Equal(t, outbox.PublisherStats{Claimed: 4, Delivered: 4}, late.Stats())
		})
	})

	t.Run("renewal fails", func(t *testing.T) {
		t.Parallel()
		eachBackend(t, func(t *testing.T, e *pubEnv) {
			ids := e.enqueue(t, "late", 4)
			d := &faultyDialect{Dialect: pubDialect(e.backend)}
			d.extendFails.Store(1)
			late, stop, rec, release := lateStart(t, e, d)
			time.Sleep(300 * time.Millisecond) // the claim answers a whole lease late
			release()
			e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == 4 })
			stop() // the counters are read once the settle that the table shows has returned
			for _, id := range ids {
				require.Equal(t, []int{2}, rec.seen(id), "published only by the claim after the lease ran out")
			}
			st := late.Stats()
			require.EqualValues(t, 8, st.Claimed)
			require.EqualValues(t, 4, st.Delivered)
			require.EqualValues(t, 1, st.Errors)
			require.Zero(t, st.LeaseLost)
		})
	})
}

// TestPublisherAbandonsStuckTransport: a transport that ignores its cancelled context does
// not hold Run hostage: Run gives it a second past the shutdown deadline, then reports it.
func TestPublisherAbandonsStuckTransport(t *testing.T) {
	t.Parallel()
	e := pubSetup(t, "sqlite")
	e.enqueue(t, "stuck", 2)
	started, release := make(chan struct{}, 1), make(chan struct{})
	returned := make(chan struct{})
	stuck := outbox.TransportFunc(func(ctx context.Context, batch []outbox.Delivery) []error {
		defer close(returned)
		started <- struct{}{}
		<-release // ignores ctx
		return nil
	})
	o := fastOptions(t, "stuck")
	o.ShutdownTimeout = 100 * time.Millisecond
	o.Logger = slog.New(slog.DiscardHandler)
	p, err := outbox.NewPublisher(e.store, stuck, o)
	require.NoError(t, err)
	runUntilAbandoned(t, p, started, o.ShutdownTimeout)
	require.EqualValues(t, 1, p.Stats().Errors)
	close(release)
	<-returned
	require.Equal(t, 2, e.counts(t)[outbox.StatusProcessing], "the abandoned batch keeps its lease")
}

// runUntilAbandoned runs p until a user callback has started, stops it, and requires Run to
// report the callback abandoned within the shutdown deadline plus the one-second grace (and
// a second of slack).
func runUntilAbandoned(t *testing.T, p *outbox.Publisher, started <-chan struct{}, shutdown time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx) }()
	<-started
	cancel()
	cancelled := time.Now()
	err := <-errc
	took := time.Since(cancelled)
	require.ErrorContains(t, err, "abandoned")
	require.Less(t, took, shutdown+time.Second+time.Second, "Run took %s", took)
}

// TestPublisherAbandonsStuckOnDead: an OnDead hook that ignores its cancelled context is
// abandoned like a stuck transport, so Run still returns shortly after the deadline.
func TestPublisherAbandonsStuckOnDead(t *testing.T) {
	t.Parallel()
	e := pubSetup(t, "sqlite")
	e.enqueue(t, "stuckhook", 1)
	started, release := make(chan struct{}, 1), make(chan struct{})
	returned := make(chan struct{})
	o := fastOptions(t, "stuckhook")
	o.ShutdownTimeout = 100 * time.Millisecond
	o.Logger = slog.New(slog.DiscardHandler)
	o.OnDead = func(context.Context, outbox.DeadLetter) {
		defer close(returned)
		started <- struct{}{}
		<-release // ignores ctx
	}
	reject := outbox.PerMessage(func(context.Context, outbox.Delivery) error { return outbox.Permanent(nil) })
	p, err := outbox.NewPublisher(e.store, reject, o)
	require.NoError(t, err)
	runUntilAbandoned(t, p, started, o.ShutdownTimeout)
	close(release)
	<-returned
	require.Equal(t, 1, e.counts(t)[outbox.StatusDead], "the row was recorded dead before the hook ran")
}

// buryRecorder records the ExpiredOnly flag of every Bury call and fails the first one.
type buryRecorder struct {
	outbox.Dialect
	mu      sync.Mutex
	expired []bool
}

func (d *buryRecorder) Bury(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.BuryParams) ([]uuid.UUID, error) {
	d.mu.Lock()
	d.expired = append(d.expired, p.ExpiredOnly)
	first := len(d.expired) == 1
	d.mu.Unlock()
	if first {
		return nil, errors.New("injected: database not ready")
	}
	return d.Dialect.Bury(ctx, q, t, p)
}

func (d *buryRecorder) calls() []bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.expired)
}

// TestPublisherSweepsFullThenExpired: the sweep at start is the full one, which also finds
// pending rows at a lowered limit, and it is repeated until it succeeds (the first one fails
// here); the periodic sweeps after it ask only for expired leases, which MySQL finds without
// walking the pending backlog.
func TestPublisherSweepsFullThenExpired(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		d := &buryRecorder{Dialect: pubDialect(e.backend)}
		p, err := outbox.NewPublisher(e.newStore(t, e.db, d), newRecorder(nil).transport("p"), fastOptions(t, "sweeps"))
		require.NoError(t, err)
		stop := start(t, p)
		deadline := time.Now().Add(10 * time.Second)
		for len(d.calls()) < 4 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		stop()
		calls := d.calls()
		require.GreaterOrEqual(t, len(calls), 4, "sweeps every 100ms")
		require.Equal(t, []bool{false, false}, calls[:2], "the failed full sweep is repeated")
		for i, expired := range calls[2:] {
			require.True(t, expired, "sweep %d after the full one asks for expired leases only", i+3)
		}
		require.GreaterOrEqual(t, p.Stats().Errors, int64(1), "the failed sweep is counted")
	})
}

// TestPublisherDoesNotSweepAtStart: the first sweep waits one SweepInterval, so that a
// restarted publisher's first claims do not wait behind a sweep that walks the backlog.
func TestPublisherDoesNotSweepAtStart(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		d := &buryRecorder{Dialect: pubDialect(e.backend)}
		opts := fastOptions(t, "nosweep")
		opts.SweepInterval = time.Hour
		p, err := outbox.NewPublisher(e.newStore(t, e.db, d), newRecorder(nil).transport("p"), opts)
		require.NoError(t, err)
		e.enqueue(t, opts.Scope.Namespace, 3)
		stop := start(t, p)
		deadline := time.Now().Add(10 * time.Second)
		for p.Stats().Delivered < 3 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		stop()
		require.EqualValues(t, 3, p.Stats().Delivered)
		require.Empty(t, d.calls(), "no sweep before the first SweepInterval")
	})
}

// TestBuryExpiredSkipsPendingRows: the built-in dialects' BuryExpired reads processing rows
// only (the conformance suite allows a dialect to bury more); a pending row at a lowered
// limit waits for the full sweep.
func TestBuryExpiredSkipsPendingRows(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ctx := context.Background()
		scope := outbox.Scope{Namespace: "lowered"}
		ids := e.enqueue(t, scope.Namespace, 1)
		recs, err := e.store.Claim(ctx, outbox.ClaimOptions{Scope: scope, Limit: 1, Lease: time.Minute, MaxAttempts: 5, WorkerID: "w"})
		require.NoError(t, err)
		require.Len(t, recs, 1)
		require.NoError(t, e.store.Nack(ctx, outbox.RetryPolicy{MaxAttempts: 5},
			outbox.Failure{Lease: recs[0].Lease(), Attempts: 1, Err: errors.New("boom")}))
		buried, err := e.store.BuryExpired(ctx, scope, 1, 10)
		require.NoError(t, err)
		require.Empty(t, buried)
		buried, err = e.store.Bury(ctx, scope, 1, 10)
		require.NoError(t, err)
		require.Equal(t, ids, buried)
	})
}

// Enqueue takes the caller's transaction, never the pool: an event enqueued on the pool beside
// a business transaction would survive that transaction's rollback.
func TestEnqueueTakesATransaction(t *testing.T) {
	t.Parallel()
	var tx outbox.Tx = (*sql.Tx)(nil) // compiles: *sql.Tx is a Tx
	_, isTx := any(new(sql.DB)).(outbox.Tx)
	require.False(t, isTx, "*sql.DB must not satisfy outbox.Tx")
	_, isTx = any(new(sql.Conn)).(outbox.Tx)
	require.False(t, isTx, "*sql.Conn must not satisfy outbox.Tx: begin a transaction on it")

	db := testdb.SQLite(t)
	s, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	require.NoError(t, err)
	m := outbox.Message{Namespace: "n", Topic: "t", Payload: json.RawMessage(`{}`)}
	_, err = s.Enqueue(context.Background(), tx, m)
	require.ErrorIs(t, err, outbox.ErrInvalid, "a nil *sql.Tx is refused, not a panic")
	_, err = s.EnqueueBatch(context.Background(), nil, []outbox.Message{m})
	require.ErrorIs(t, err, outbox.ErrInvalid)
}
