package conformance

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
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

// listen starts n.Listen on db for table and waits until it reports ready. It skips the
// test when Listen says the driver cannot listen. At cleanup it cancels Listen and
// requires it to return.
func listen(t *testing.T, e *env, n dialect.Notifier, db *sql.DB, table string) *listener {
	t.Helper()
	tbl, err := dialect.NewTable(table)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(e.ctx)
	l := &listener{ready: make(chan struct{}), done: make(chan error, 1), cancel: cancel}
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

	// While the transaction is open, another one commits: it wakes the listener first.
	commitIn(t, e, e.db, e.store, meanwhile)
	require.Equal(t, meanwhile, l.first(t, a, b, meanwhile),
		"an open transaction woke the listener: Signal must act only when its transaction commits")

	require.NoError(t, tx.Commit())
	l.await(t, a)
	l.await(t, b)
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
	require.Eventually(t, func() bool { return e.db.Stats().InUse >= 1 }, notifyWithin, 20*time.Millisecond,
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
		return e.db.Stats().InUse == 0
	})
}

// A Publisher that polls once a minute delivers, within seconds, an event enqueued through
// another Store on another pool (Harness.Reopen, when set), as another process would: only
// the dialect's signal can have woken it.
func testNotifyPublisher(t *testing.T, h Harness) {
	n := needNotifier(t, h)
	e := setup(t, h)
	listen(t, e, n, e.db, e.table).cancel() // skips when the driver cannot listen

	// The publisher's Store sees through the dialect only when its listener is ready and
	// when it claims, so that the event is enqueued once the publisher is idle: after the
	// claims that start it and that its listener's first ready starts.
	obs := &observedNotifier{Dialect: h.Dialect, n: n, ready: make(chan struct{})}
	store, err := outbox.New(e.db, obs, outbox.Options{Table: e.table})
	require.NoError(t, err)
	ns := namespace("published")
	var delivered sync.Map // uuid.UUID → time.Time
	p, err := outbox.NewPublisher(store, outbox.PerMessage(func(_ context.Context, d outbox.Delivery) error {
		delivered.LoadOrStore(d.ID, time.Now())
		return nil
	}), outbox.PublisherOptions{
		Scope: outbox.Scope{Namespace: ns}, PollInterval: time.Minute, IdleBackoffMax: time.Minute,
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
	case <-obs.ready:
	case err := <-errc:
		t.Fatalf("Publisher.Run returned before its listener was ready: %v", err)
	case <-time.After(notifyWithin):
		t.Fatalf("the publisher's listener did not call ready within %s", notifyWithin)
	}
	atReady := obs.claims.Load()
	eventually(t, notifyWithin, "the publisher to go idle (no claim for 500ms)", func() bool {
		return obs.claims.Load() > atReady && time.Since(time.Unix(0, obs.lastClaim.Load())) > 500*time.Millisecond
	})

	db := e.db
	if h.Reopen != nil {
		db = h.Reopen(t, e.db)
	}
	producer, err := outbox.New(db, h.Dialect, outbox.Options{Table: e.table})
	require.NoError(t, err)
	claims := obs.claims.Load()
	committed := time.Now()
	id := commitIn(t, e, db, producer, ns)
	eventually(t, notifyWithin, "the publisher, polling once a minute, to deliver an event enqueued through another pool", func() bool {
		_, ok := delivered.Load(id)
		return ok
	})
	at, _ := delivered.Load(id)
	t.Logf("commit to publish: %s, %d claims", at.(time.Time).Sub(committed), obs.claims.Load()-claims)
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
	db.SetMaxIdleConns(0) // closes the idle connections
	db.SetMaxIdleConns(4)
	require.Zero(t, db.Stats().OpenConnections, "no connection is open before Listen")
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
		st := db.Stats()
		return st.OpenConnections == 0 && st.InUse == 0
	})
}
