package conformance

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

// notifyTests check [dialect.Notifier], the wake-ups that cross processes; each is skipped,
// saying so, for a dialect without the ability, or whose driver cannot listen.
//
// A signal that must not come is proved absent by ordering, never by waiting a while: after
// the step that must signal nothing, a second enqueue in another namespace commits, and the
// first of the two namespaces to wake the listener must be the second one. The database
// delivers signals in commit order, so a stray one would have come first.
var notifyTests = []test{
	{"CommitWakes", testNotifyCommitWakes},
	{"RollbackWakesNobody", testNotifyRollback},
	{"BatchWakesAfterCommit", testNotifyBatch},
	{"OtherTableWakesNobody", testNotifyOtherTable},
	{"OtherDatabaseWakesNobody", testNotifyOtherDatabase},
	{"ListenReturnsOnCancel", testNotifyCancel},
	{"ListenClosesItsConnection", testNotifyCloses},
	{"PublisherWokenAcrossPools", testNotifyPublisher},
	{"PublisherWokenAcrossProcesses", testNotifyProcess},
}

// notifyWithin is how long a signal may take to arrive, and Listen to become ready or to
// return, on a loaded test machine.
const notifyWithin = 10 * time.Second

// needNotifier skips when the dialect has no Notifier, and returns it otherwise.
func needNotifier(t *testing.T, h Harness) dialect.Notifier {
	t.Helper()
	n, ok := h.Dialect.(dialect.Notifier)
	if !ok {
		t.Skipf("dialect %s does not implement dialect.Notifier", h.Dialect.Name())
	}
	return n
}

// namespace returns a namespace no other test uses, so that signals of the tests running
// beside this one (or a listener that hears too much) cannot pass for the ones expected.
func namespace(what string) string { return what + "-" + uuid.NewString()[:8] }

// listener is one call of Listen running in the background, with what it reported.
type listener struct {
	readies atomic.Int32
	ready   chan struct{} // closed by the first call of ready
	done    chan error    // Listen's result
	cancel  context.CancelFunc

	mu    sync.Mutex
	wakes []string // namespaces, in the order wake was called
}

// listen starts n.Listen on the listeners' pool for db (Harness.ListenDB) for table and
// waits until it reports ready. It skips the
// test when Listen says the driver cannot listen. At cleanup it cancels Listen and
// requires it to return.
func listen(t *testing.T, e *env, n dialect.Notifier, db *sql.DB, table string) *listener {
	t.Helper()
	tbl, err := dialect.NewTable(table)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(e.ctx)
	l := &listener{ready: make(chan struct{}), done: make(chan error, 1), cancel: cancel}
	db = e.h.listenDB(t, db)
	go func() {
		l.done <- n.Listen(ctx, db, tbl, func() {
			if l.readies.Add(1) == 1 {
				close(l.ready)
			}
		}, func(ns string) {
			l.mu.Lock()
			l.wakes = append(l.wakes, ns)
			l.mu.Unlock()
		})
	}()
	select {
	case <-l.ready:
	case err := <-l.done:
		cancel()
		if errors.Is(err, errors.ErrUnsupported) {
			t.Skipf("dialect %s cannot listen with this driver: %v", e.h.Dialect.Name(), err)
		}
		t.Fatalf("Listen returned before it called ready: %v", err)
	case <-time.After(notifyWithin):
		cancel()
		t.Fatalf("Listen did not call ready within %s", notifyWithin)
	}
	t.Cleanup(func() {
		l.cancel()
		select {
		case <-l.done:
		case <-time.After(notifyWithin):
			t.Errorf("Listen did not return within %s of its context ending", notifyWithin)
		}
	})
	return l
}

// seen returns the namespaces the listener was woken with, in order.
func (l *listener) seen() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.wakes)
}

// await waits until the listener was woken with ns.
func (l *listener) await(t *testing.T, ns string) {
	t.Helper()
	eventually(t, notifyWithin, "a wake-up with namespace "+ns, func() bool { return slices.Contains(l.seen(), ns) })
}

// first waits until the listener was woken with one of the namespaces and returns the
// first of them it was woken with.
func (l *listener) first(t *testing.T, nss ...string) string {
	t.Helper()
	var got string
	eventually(t, notifyWithin, "a wake-up with one of the namespaces", func() bool {
		for _, ns := range l.seen() {
			if slices.Contains(nss, ns) {
				got = ns
				return true
			}
		}
		return false
	})
	return got
}

// commitIn enqueues one message of namespace ns on s in a transaction on db and commits
// it.
func commitIn(t *testing.T, e *env, db *sql.DB, s *outbox.Store, ns string) uuid.UUID {
	t.Helper()
	tx, err := db.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	res, err := s.Enqueue(e.ctx, tx, nsMsg(ns))
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	return res.ID
}

func nsMsg(ns string) outbox.Message {
	return outbox.Message{Namespace: ns, Topic: "notify", Payload: json.RawMessage(`{}`)}
}

// A listener reports ready once, and a committed enqueue wakes it with the message's
// namespace.
func testNotifyCommitWakes(t *testing.T, h Harness) {
	n := needNotifier(t, h)
	e := setup(t, h)
	l := listen(t, e, n, e.db, e.table)
	ns := namespace("committed")
	commitIn(t, e, e.db, e.store, ns)
	l.await(t, ns)
	require.EqualValues(t, 1, l.readies.Load(), "ready is called once")
}

// A rolled-back enqueue wakes nobody: an enqueue committed after the rollback is the first
// to wake the listener.
func testNotifyRollback(t *testing.T, h Harness) {
	n := needNotifier(t, h)
	e := setup(t, h)
	l := listen(t, e, n, e.db, e.table)
	rolledBack, committed := namespace("rolled-back"), namespace("committed")

	tx, err := e.db.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	_, err = e.store.Enqueue(e.ctx, tx, nsMsg(rolledBack))
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())

	commitIn(t, e, e.db, e.store, committed)
	require.Equal(t, committed, l.first(t, rolledBack, committed),
		"the rolled-back enqueue woke the listener: Signal must act only when its transaction commits")
	require.NotContains(t, l.seen(), rolledBack, "the rolled-back enqueue woke the listener")
}

// Several enqueues in one transaction, in two namespaces, wake the listener for each
// namespace at least once, and only once the transaction commits.
//
// While the transaction is open another one commits, and must be the first to wake the
// listener. A database with one writer (SQLite) makes that commit wait for the open
// transaction: when it has not committed within oneWriterAfter, the test says so and
// requires instead that the listener heard nothing of the open transaction meanwhile (a
// signal sent before the commit would have come by then); an eager signal is caught for
// certain by RollbackWakesNobody.
func testNotifyBatch(t *testing.T, h Harness) {
	n := needNotifier(t, h)
	e := setup(t, h)
	l := listen(t, e, n, e.db, e.table)
	a, b, meanwhile := namespace("batch-a"), namespace("batch-b"), namespace("meanwhile")

	tx, err := e.db.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	_, err = e.store.EnqueueBatch(e.ctx, tx, []outbox.Message{nsMsg(a), nsMsg(a), nsMsg(b)})
	require.NoError(t, err)
	_, err = e.store.Enqueue(e.ctx, tx, nsMsg(a))
	require.NoError(t, err)

	committed := make(chan error, 1)
	go func() { committed <- commitNS(e, e.db, e.store, meanwhile) }()
	select {
	case err := <-committed:
		require.NoError(t, err)
		require.Equal(t, meanwhile, l.first(t, a, b, meanwhile),
			"an open transaction woke the listener: Signal must act only when its transaction commits")
		require.NoError(t, tx.Commit())
	case <-time.After(oneWriterAfter):
		t.Logf("a second transaction did not commit within %s while the first was open: one writer at a time", oneWriterAfter)
		require.NotContains(t, l.seen(), a, "an open transaction woke the listener: Signal must act only when its transaction commits")
		require.NotContains(t, l.seen(), b, "an open transaction woke the listener: Signal must act only when its transaction commits")
		require.NoError(t, tx.Commit())
		require.NoError(t, <-committed)
		l.await(t, meanwhile)
	}
	l.await(t, a)
	l.await(t, b)
}

// oneWriterAfter is how long a commit may wait beside an open transaction before the
// database is taken for one that has one writer at a time.
const oneWriterAfter = 3 * time.Second

// commitNS is commitIn for a goroutine: it returns its error.
func commitNS(e *env, db *sql.DB, s *outbox.Store, ns string) error {
	tx, err := db.BeginTx(e.ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := s.Enqueue(e.ctx, tx, nsMsg(ns)); err != nil {
		return err
	}
	return tx.Commit()
}

// A signal for one table does not wake the listener of another table of the same
// database.
func testNotifyOtherTable(t *testing.T, h Harness) {
	n := needNotifier(t, h)
	e := setup(t, h) // the default table
	const other = "conformance_notify_other"
	require.NoError(t, h.up(e.ctx, e.db, other), "Harness.Up with a custom table name")
	otherStore, err := outbox.New(e.db, h.Dialect, outbox.Options{Table: other})
	require.NoError(t, err)
	l := listen(t, e, n, e.db, other)
	onDefault, onOther := namespace("default-table"), namespace("other-table")

	commitIn(t, e, e.db, e.store, onDefault)
	commitIn(t, e, e.db, otherStore, onOther)
	require.Equal(t, onOther, l.first(t, onDefault, onOther),
		"a signal for table %s woke the listener of table %s", e.table, other)
	require.NotContains(t, l.seen(), onDefault, "a signal for table %s woke the listener of table %s", e.table, other)
}

// A signal for a table of the same name in another database (or schema: whatever
// Harness.OpenDB isolates) does not wake the listener.
func testNotifyOtherDatabase(t *testing.T, h Harness) {
	n := needNotifier(t, h)
	e := setup(t, h)
	elsewhere := setup(t, h)
	l := listen(t, e, n, e.db, e.table)
	there, here := namespace("other-database"), namespace("this-database")

	commitIn(t, elsewhere, elsewhere.db, elsewhere.store, there)
	commitIn(t, e, e.db, e.store, here)
	require.Equal(t, here, l.first(t, there, here),
		"a signal for a table of the same name in another database woke the listener")
	require.NotContains(t, l.seen(), there, "a signal for a table of the same name in another database woke the listener")
}

// Listen returns once its context ends, and gives back (or closes) the connection it
// held.
func testNotifyCancel(t *testing.T, h Harness) {
	n := needNotifier(t, h)
	e := setup(t, h)
	l := listen(t, e, n, e.db, e.table)
	ldb := h.listenDB(t, e.db)
	require.Eventually(t, func() bool { return ldb.Stats().InUse >= 1 }, notifyWithin, 20*time.Millisecond,
		"Listen waits on a connection of db")
	l.cancel()
	select {
	case err := <-l.done:
		l.done <- err // for the cleanup of listen
		t.Logf("Listen returned: %v", err)
	case <-time.After(notifyWithin):
		t.Fatalf("Listen did not return within %s of its context ending", notifyWithin)
	}
	eventually(t, notifyWithin, "Listen's connection to be released (db.Stats().InUse == 0)", func() bool {
		return ldb.Stats().InUse == 0
	})
}

// A Publisher that polls once a minute delivers, within seconds, an event enqueued through
// another Store on another pool (Harness.Reopen, when set): only the dialect's signal can
// have woken it.
func testNotifyPublisher(t *testing.T, h Harness) {
	w := idlePublisher(t, h)
	db := w.e.db
	if h.Reopen != nil {
		db = h.Reopen(t, w.e.db)
	}
	producer, err := outbox.New(db, h.Dialect, outbox.Options{Table: w.e.table})
	require.NoError(t, err)
	claims := w.obs.claims.Load()
	committed := time.Now()
	id := commitIn(t, w.e, db, producer, w.ns)
	w.awaitDelivered(t, id, committed, claims, "an event enqueued through another pool")
}

// producerEnv, when set in a test binary's environment, makes the cross-process test of
// that binary the producer: it holds the JSON of a producerOrder.
const producerEnv = "OUTBOX_CONFORMANCE_PRODUCER"

// producerOrder is what the producer process enqueues, and where.
type producerOrder struct {
	Driver, DSN, Table, Namespace string
}

// producedPrefix starts the line on which the producer process prints the id it enqueued.
const producedPrefix = "outbox-conformance-produced "

// The same as PublisherWokenAcrossPools with the producer in another process: the test
// binary runs again (os.Args[0]), only this test, which finds the order in its environment,
// opens the database with Harness.DSN, enqueues one event with a Store of its own, and
// exits. Skipped, saying so, when Harness.DSN is not set.
func testNotifyProcess(t *testing.T, h Harness) {
	if raw := os.Getenv(producerEnv); raw != "" {
		produce(t, h, raw)
		return
	}
	if h.DSN == nil {
		needNotifier(t, h)
		t.Skip("Harness.DSN is not set: the test cannot open the database in another process")
	}
	w := idlePublisher(t, h)
	driverName, dsn := h.DSN(t, w.e.db)
	order, err := json.Marshal(producerOrder{Driver: driverName, DSN: dsn, Table: w.e.table, Namespace: w.ns})
	require.NoError(t, err)
	cmd := exec.CommandContext(w.e.ctx, os.Args[0], "-test.run="+runPattern(t.Name()), "-test.count=1", "-test.v", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), producerEnv+"="+string(order))
	claims := w.obs.claims.Load()
	committed := time.Now()
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the producer process failed:\n%s", out)
	var id uuid.UUID
	for line := range strings.Lines(string(out)) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), producedPrefix); ok {
			id, err = uuid.Parse(rest)
			require.NoError(t, err)
		}
	}
	require.NotEqual(t, uuid.Nil, id, "the producer process printed no id:\n%s", out)
	w.awaitDelivered(t, id, committed, claims, "an event enqueued by another process")
}

// produce is the producer process's side of testNotifyProcess.
func produce(t *testing.T, h Harness, raw string) {
	var o producerOrder
	require.NoError(t, json.Unmarshal([]byte(raw), &o))
	db, err := sql.Open(o.Driver, o.DSN)
	require.NoError(t, err)
	defer db.Close()
	s, err := outbox.New(db, h.Dialect, outbox.Options{Table: o.Table})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := &env{ctx: ctx, db: db, store: s, table: o.Table, h: h}
	id := commitIn(t, e, db, s, o.Namespace)
	fmt.Println(producedPrefix + id.String())
}

// runPattern is the -test.run pattern that selects the test named name, and no other.
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// woken is a Publisher that polls once a minute, running and idle, with what it delivered.
type woken struct {
	e         *env
	obs       *observedNotifier
	ns        string
	delivered sync.Map // uuid.UUID → time.Time
}

// idlePublisher starts a Publisher that polls once a minute and waits until its listener
// is ready and it has gone idle, so that an event enqueued next can only be found through
// the dialect's signal.
func idlePublisher(t *testing.T, h Harness) *woken {
	n := needNotifier(t, h)
	e := setup(t, h)
	listen(t, e, n, e.db, e.table).cancel() // skips when the driver cannot listen

	// The publisher's Store sees through the dialect only when its listener is ready and
	// when it claims, so that the event is enqueued once the publisher is idle: after the
	// claims that start it and that its listener's first ready starts.
	w := &woken{e: e, obs: &observedNotifier{Dialect: h.Dialect, n: n, ready: make(chan struct{})}, ns: namespace("published")}
	var listenDB *sql.DB
	if h.ListenDB != nil {
		listenDB = h.ListenDB(t, e.db)
	}
	store, err := outbox.New(e.db, w.obs, outbox.Options{Table: e.table, ListenDB: listenDB})
	require.NoError(t, err)
	p, err := outbox.NewPublisher(store, outbox.PerMessage(func(_ context.Context, d outbox.Delivery) error {
		w.delivered.LoadOrStore(d.ID, time.Now())
		return nil
	}), outbox.PublisherOptions{
		Scope: outbox.Scope{Namespace: w.ns}, PollInterval: time.Minute, IdleBackoffMax: time.Minute,
		Lease: 3 * time.Minute, SweepInterval: time.Hour, ShutdownTimeout: time.Second,
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(e.ctx)
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("Publisher.Run: %v", err)
			}
		case <-time.After(notifyWithin):
			t.Errorf("Publisher.Run did not return within %s of its context ending (does Listen return on cancel?)", notifyWithin)
		}
	})
	select {
	case <-w.obs.ready:
	case err := <-errc:
		t.Fatalf("Publisher.Run returned before its listener was ready: %v", err)
	case <-time.After(notifyWithin):
		t.Fatalf("the publisher's listener did not call ready within %s", notifyWithin)
	}
	atReady := w.obs.claims.Load()
	eventually(t, notifyWithin, "the publisher to go idle (no claim for 500ms)", func() bool {
		return w.obs.claims.Load() > atReady && time.Since(time.Unix(0, w.obs.lastClaim.Load())) > 500*time.Millisecond
	})
	return w
}

// awaitDelivered waits until the publisher delivered id, committed at committed, and logs
// how long that took and in how many claims since claims.
func (w *woken) awaitDelivered(t *testing.T, id uuid.UUID, committed time.Time, claims int64, what string) {
	t.Helper()
	eventually(t, notifyWithin, "the publisher, polling once a minute, to deliver "+what, func() bool {
		_, ok := w.delivered.Load(id)
		return ok
	})
	at, _ := w.delivered.Load(id)
	t.Logf("commit to publish: %s, %d claims", at.(time.Time).Sub(committed), w.obs.claims.Load()-claims)
}

// observedNotifier is the dialect under test with its Notifier, reporting when its listener
// is first ready and when it claims. It hides the dialect's other optional abilities,
// which the publisher does without.
type observedNotifier struct {
	outbox.Dialect
	n         dialect.Notifier
	ready     chan struct{}
	readyOnce sync.Once
	claims    atomic.Int64
	lastClaim atomic.Int64 // unix nanoseconds of the end of the last claim
}

func (o *observedNotifier) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]outbox.Record, error) {
	defer func() {
		o.lastClaim.Store(time.Now().UnixNano())
		o.claims.Add(1)
	}()
	return o.Dialect.Claim(ctx, db, t, p)
}

func (o *observedNotifier) Signal(ctx context.Context, q dialect.DBTX, t dialect.Table, namespace string) error {
	return o.n.Signal(ctx, q, t, namespace)
}

func (o *observedNotifier) Listen(ctx context.Context, db *sql.DB, t dialect.Table, ready func(), wake func(namespace string)) error {
	return o.n.Listen(ctx, db, t, func() {
		ready()
		o.readyOnce.Do(func() { close(o.ready) })
	}, wake)
}

// testNotifyCloses: the connection Listen held is closed when it returns, never given back
// to the pool (rule 3 of dialect.Notifier): still listening, it would take the signals of
// the table into whatever the pool lends it to next, and a later Listen on it would hear
// them twice. The pool starts with no idle connection and may keep some, so a connection
// given back would stay open in it.
func testNotifyCloses(t *testing.T, h Harness) {
	n := needNotifier(t, h)
	e := setup(t, h)
	db := e.db
	if h.Reopen != nil {
		db = h.Reopen(t, e.db) // a pool this test alone uses
	}
	ldb := h.listenDB(t, db)
	ldb.SetMaxIdleConns(0) // closes the idle connections
	ldb.SetMaxIdleConns(4)
	require.Zero(t, ldb.Stats().OpenConnections, "no connection is open before Listen")
	l := listen(t, e, n, db, e.table)
	l.cancel()
	select {
	case err := <-l.done:
		l.done <- err // for the cleanup of listen
	case <-time.After(notifyWithin):
		t.Fatalf("Listen did not return within %s of its context ending", notifyWithin)
	}
	eventually(t, notifyWithin, "Listen's connection to be closed, not given back to the pool while it listens "+
		"(rule 3 of dialect.Notifier)", func() bool {
		st := ldb.Stats()
		return st.OpenConnections == 0 && st.InUse == 0
	})
}
