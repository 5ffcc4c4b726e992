package outboxbinlog

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

// recorder is a transport that records what it is handed, in order, and fails the
// messages fail names.
type recorder struct {
	mu   sync.Mutex
	got  []outbox.Delivery
	fail func(d outbox.Delivery) error
}

func (r *recorder) Publish(_ context.Context, batch []outbox.Delivery) []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	errs := make([]error, len(batch))
	for i, d := range batch {
		r.got = append(r.got, d)
		if r.fail != nil {
			errs[i] = r.fail(d)
		}
	}
	return errs
}

func (r *recorder) setFail(f func(outbox.Delivery) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fail = f
}

func (r *recorder) deliveries() []outbox.Delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]outbox.Delivery(nil), r.got...)
}

// times counts the deliveries of each id.
func (r *recorder) times() map[uuid.UUID]int {
	out := map[uuid.UUID]int{}
	for _, d := range r.deliveries() {
		out[d.ID]++
	}
	return out
}

// bundle is what a test works with: a fresh database with the outbox table, a Store that
// inserts rows leased to the log's reader, and a recording transport.
type bundle struct {
	ctx   context.Context
	dsn   string
	db    *sql.DB
	store *outbox.Store
	tr    *recorder
}

func setup(t *testing.T, logLease time.Duration, ordered ...bool) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	dsn := privateServer(t).database(t)
	db, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, migrations.Up(ctx, db, "mysql", migrations.Options{Ordered: len(ordered) > 0 && ordered[0]}))
	store, err := outbox.New(db, outbox.MySQL(), outbox.Options{LogLease: logLease, DisableNotify: true})
	require.NoError(t, err)
	return &bundle{ctx: ctx, dsn: dsn, db: db, store: store, tr: &recorder{}}
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// testLog writes a publisher's log to the test's, shown when it fails.
type testLog struct{ t *testing.T }

func (w testLog) Write(b []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// publisher returns a log Publisher of the bundle's store.
func (b *bundle) publisher(t *testing.T, o Options) *Publisher {
	t.Helper()
	o.ConnString = b.dsn
	if o.Namespace == "" {
		o.Namespace = "orders"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if o.RetryDelay == 0 {
		o.RetryDelay = 50 * time.Millisecond
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = 200 * time.Millisecond
	}
	p, err := New(b.store, b.tr, o)
	require.NoError(t, err)
	return p
}

// start runs p until the test ends (or stop is called) and waits until it reads the
// binlog; stop returns Run's error.
func (b *bundle) start(t *testing.T, p *Publisher) (stop func() error) {
	t.Helper()
	stop = b.run(t, p)
	b.wait(t, "the publisher reads the binlog", func() bool { return p.Stats().Reading })
	return stop
}

// run runs p until the test ends (or stop is called), without waiting.
func (b *bundle) run(t *testing.T, p *Publisher) (stop func() error) {
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() { cancel(); runErr = <-done })
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// wait polls cond until it holds, failing the test after a deadline.
func (b *bundle) wait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func msg(i int) outbox.Message {
	return outbox.Message{Namespace: "orders", Topic: "order.created", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
}

func msgs(from, n int) []outbox.Message {
	out := make([]outbox.Message, n)
	for i := range out {
		out[i] = msg(from + i)
	}
	return out
}

// enqueue commits one transaction per message and returns the ids in commit order.
func (b *bundle) enqueue(t *testing.T, msgs ...outbox.Message) []uuid.UUID {
	t.Helper()
	return b.enqueueOn(t, b.store, msgs...)
}

func (b *bundle) enqueueOn(t *testing.T, store *outbox.Store, msgs ...outbox.Message) []uuid.UUID {
	t.Helper()
	ids := make([]uuid.UUID, len(msgs))
	for i, m := range msgs {
		tx, err := b.db.BeginTx(b.ctx, nil)
		require.NoError(t, err)
		res, err := store.Enqueue(b.ctx, tx, m)
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		ids[i] = res.ID
	}
	return ids
}

// storeWith returns another Store of the bundle's table whose rows are leased to the
// log's reader for lease: a short one for rows that polling must take over.
func (b *bundle) storeWith(t *testing.T, lease time.Duration) *outbox.Store {
	t.Helper()
	s, err := outbox.New(b.db, outbox.MySQL(), outbox.Options{LogLease: lease, DisableNotify: true})
	require.NoError(t, err)
	return s
}

// status returns each row's status by id.
func (b *bundle) status(t *testing.T) map[uuid.UUID]outbox.Status {
	t.Helper()
	rows, err := b.db.QueryContext(b.ctx, `SELECT id, status FROM outbox_events`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[uuid.UUID]outbox.Status{}
	for rows.Next() {
		var id []byte
		var st string
		require.NoError(t, rows.Scan(&id, &st))
		out[uuid.UUID(id)] = outbox.Status(st)
	}
	require.NoError(t, rows.Err())
	return out
}

// waitDelivered waits until every row of ids is delivered, and on timeout names those
// that are not, as the table has them.
func (b *bundle) waitDelivered(t *testing.T, what string, ids []uuid.UUID) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := b.status(t)
		var missing []uuid.UUID
		for _, id := range ids {
			if st[id] != outbox.StatusDelivered {
				missing = append(missing, id)
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, id := range missing[:min(5, len(missing))] {
				r, err := b.store.Get(b.ctx, id)
				require.NoError(t, err)
				t.Logf("row %s: %s, attempts %d, locked_by %q until %s, last error %q", id, r.Status, r.Attempts, r.LockedBy, r.LockedUntil, r.LastError)
			}
			t.Fatalf("timed out waiting until %s: %d of %d not delivered", what, len(missing), len(ids))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// storedPosition reads the reader's row of the position table.
func (b *bundle) storedPosition(t *testing.T, name string) string {
	t.Helper()
	var gtid string
	err := b.db.QueryRowContext(b.ctx, `SELECT gtid FROM outbox_events_binlog_position WHERE reader = ?`, name).Scan(&gtid)
	if errors.Is(err, sql.ErrNoRows) {
		return ""
	}
	require.NoError(t, err)
	return gtid
}

func deliveredIDs(ds []outbox.Delivery) []uuid.UUID {
	out := make([]uuid.UUID, len(ds))
	for i, d := range ds {
		out[i] = d.ID
	}
	return out
}

// poller returns a polling Publisher of the bundle's table.
func (b *bundle) poller(t *testing.T, lease time.Duration) *outbox.Publisher {
	t.Helper()
	p, err := outbox.NewPublisher(b.store, b.tr, outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "orders"},
		PollInterval: 20 * time.Millisecond, Lease: lease, Logger: quiet,
		Retry: outbox.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}})
	require.NoError(t, err)
	return p
}

// runPoller runs a polling Publisher until the returned stop is called.
func (b *bundle) runPoller(t *testing.T, p *outbox.Publisher) (stop func()) {
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); require.NoError(t, <-done) }) }
	t.Cleanup(stop)
	return stop
}

// TestDeliversInCommitOrder: committed rows reach the transport in commit order, once
// each, settled delivered, and the position in the table moves past them (by the stop at
// the latest); a rolled-back row and a delayed row never do.
func TestDeliversInCommitOrder(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	p := b.publisher(t, Options{})
	stop := b.start(t, p)

	tx, err := b.db.BeginTx(b.ctx, nil)
	require.NoError(t, err)
	_, err = b.store.Enqueue(b.ctx, tx, msg(-1))
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())
	delayed := msg(-2)
	delayed.Delay = time.Hour
	late := b.enqueue(t, delayed)[0]

	before := b.storedPosition(t, p.Name())
	ids := b.enqueue(t, msgs(0, 40)...)
	b.waitDelivered(t, "every row is delivered", ids)
	require.Equal(t, ids, deliveredIDs(b.tr.deliveries()), "in commit order, each once, nothing else")
	for i, d := range b.tr.deliveries() {
		require.JSONEq(t, fmt.Sprintf(`{"n":%d}`, i), string(d.Payload))
		require.Equal(t, 1, d.Attempt)
		require.Equal(t, "orders", d.Namespace)
		require.Equal(t, "order.created", d.Topic)
		var stored string
		require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT created_at FROM outbox_events WHERE id = ?`, d.ID[:]).Scan(&stored))
		created, err := time.Parse("2006-01-02 15:04:05.999999", stored)
		require.NoError(t, err)
		require.True(t, created.Equal(d.CreatedAt), "created_at %s read from the binlog as %s", created, d.CreatedAt)
	}
	require.Equal(t, outbox.StatusPending, b.status(t)[late], "a delayed row is left to polling")
	b.wait(t, "the publisher counts its settles", func() bool { return p.Stats().Delivered == int64(len(ids)) })
	require.NoError(t, stop())
	st := p.Stats()
	require.Zero(t, st.LeaseLost+st.Retried+st.Dead+st.Skipped)
	require.NotEqual(t, before, b.storedPosition(t, p.Name()), "the position moved past the settles")
	require.Equal(t, st.Position, b.storedPosition(t, p.Name()))
	var file string
	var off int64
	require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT file, pos FROM outbox_events_binlog_position WHERE reader = ?`, p.Name()).Scan(&file, &off))
	require.NotEmpty(t, file, "the file and offset are kept beside the GTID set")
	require.Greater(t, off, int64(4))
	t.Logf("position %s, commit to publish of the last batch: %s", st.Position, st.CommitToPublish)
}

// TestFailureGoesToRetryPath: a delivery the transport fails goes back to pending under
// the retry policy, and a polling Publisher delivers it; the other rows are not held.
func TestFailureGoesToRetryPath(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	bad := make(chan uuid.UUID, 1)
	var failed sync.Once
	b.tr.setFail(func(d outbox.Delivery) error {
		var err error
		failed.Do(func() { err = errors.New("broker said no"); bad <- d.ID })
		return err
	})
	p := b.publisher(t, Options{RetryPolicy: outbox.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}})
	b.start(t, p)
	all := b.enqueue(t, msgs(0, 5)...)
	id := <-bad
	b.wait(t, "the log publisher settles all five", func() bool { s := p.Stats(); return s.Delivered+s.Retried == 5 })
	require.Equal(t, int64(1), p.Stats().Retried)
	r, err := b.store.Get(b.ctx, id)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, r.Status)
	require.Equal(t, "broker said no", r.LastError)

	poller := b.poller(t, time.Minute)
	stop := b.runPoller(t, poller)
	b.waitDelivered(t, "polling delivers the failed row", all)
	stop()
	require.Equal(t, int64(1), poller.Stats().Delivered, "polling delivered only the failed row")
}

// killed is what killRun found: the rows, those settled when the reader was killed, those
// not delivered once the next reader delivered a row committed after them, and how often
// each was published.
type killed struct {
	ids            []uuid.UUID
	settledBefore  map[uuid.UUID]bool
	lost           []uuid.UUID
	times          map[uuid.UUID]int
	next           *Publisher
	publishedAgain int // of the rows settled before the kill
}

// killRun runs a reader, with the mistake m planted (in the next reader too), that is killed as a crash would kill it at
// the hit-th time it reaches point ("published": before its settle; "settled": right
// after a settle commits, position or not) while 10 rows commit one transaction each,
// two to a batch; then it runs the next reader and waits until a row committed after them
// is delivered. The next reader delivers in commit order, so a row not delivered by then
// was lost to it (polling would take it only once its lease of a minute ran out).
func killRun(t *testing.T, point string, hit int, interval time.Duration, m mistake) killed {
	b := setup(t, time.Minute)
	p := b.publisher(t, Options{BatchSize: 2, PositionInterval: interval})
	p.mistake = m
	var mu sync.Mutex
	hits := 0
	p.kill = func(at string) bool {
		mu.Lock()
		defer mu.Unlock()
		if at == point {
			hits++
		}
		return at == point && hits == hit
	}
	stop := b.start(t, p)
	// Enough rows for the fourth settle however the reader gathers them: a settle covers
	// up to settleBatches batches of two, so 70 rows take five settles at least.
	k := killed{ids: b.enqueue(t, msgs(0, 70)...), settledBefore: map[uuid.UUID]bool{}}
	b.wait(t, "the reader is killed", func() bool { return !p.running.Load() })
	require.ErrorIs(t, stop(), errKilled)
	for id, st := range b.status(t) {
		k.settledBefore[id] = st == outbox.StatusDelivered
	}

	k.next = b.publisher(t, Options{})
	k.next.mistake = m
	b.start(t, k.next)
	marker := b.enqueue(t, msg(10))
	b.waitDelivered(t, "the next reader delivers a row committed after them", marker)
	st := b.status(t)
	k.times = b.tr.times()
	for _, id := range k.ids {
		if st[id] != outbox.StatusDelivered {
			k.lost = append(k.lost, id)
		}
		if k.settledBefore[id] && k.times[id] > 1 {
			k.publishedAgain++
		}
	}
	t.Logf("killed at %s #%d: %d settled before, %d lost, %d settled rows published again, next reader skipped %d",
		point, hit, len(slices.DeleteFunc(slices.Clone(k.ids), func(id uuid.UUID) bool { return !k.settledBefore[id] })),
		len(k.lost), k.publishedAgain, k.next.Stats().Skipped)
	return k
}

// TestResumesAfterKill: a reader killed at any point (before a settle commits, or right
// after, with the position written then or not) loses nothing: the next reader reads from
// the stored position, which may lag the settled outcomes but never leads them, publishes
// again only the rows that were not settled, and skips those that were.
func TestResumesAfterKill(t *testing.T) {
	leakCheck(t)
	for _, point := range []string{"published", "settled"} {
		for _, hit := range []int{1, 2, 4} {
			// An hour: the position is written at the start only, so everything settled is
			// read again; 20ms: it is written with some settles and alone between others.
			for _, interval := range []time.Duration{time.Hour, 20 * time.Millisecond} {
				t.Run(fmt.Sprintf("%s#%d/%s", point, hit, interval), func(t *testing.T) {
					k := killRun(t, point, hit, interval, noMistake)
					require.Empty(t, k.lost, "nothing lost")
					require.Zero(t, k.publishedAgain, "no settled row published again")
					for _, id := range k.ids {
						require.Positive(t, k.times[id], "row %s published", id)
					}
					require.Zero(t, k.next.Stats().LeaseLost, "the killed reader's outcomes and the next one's never met")
				})
			}
		}
	}
}

// TestKillCatchesMistakes: the kills of TestResumesAfterKill tell a correct reader from
// one that writes a batch's position before publishing it (its rows are lost to the next
// reader) and from one that publishes again the rows it reads again (rows published twice).
func TestKillCatchesMistakes(t *testing.T) {
	t.Run("position ahead", func(t *testing.T) {
		k := killRun(t, "published", 1, time.Hour, positionAhead)
		require.NotEmpty(t, k.lost, "rows behind a position written ahead of their outcomes are lost to the reader")
	})
	t.Run("no skip", func(t *testing.T) {
		k := killRun(t, "settled", 2, time.Hour, noSkip)
		require.Positive(t, k.publishedAgain, "rows read again are published again")
	})
}

// TestCleanShutdownStoresThePosition: a reader stopped cleanly writes the position after
// the last rows it settled, though its PositionInterval had not passed, so that the next
// reader reads none of them again. Without the final write (the mistake) it reads them
// all again, skipping them as settled.
func TestCleanShutdownStoresThePosition(t *testing.T) {
	for _, m := range []mistake{noMistake, noFinalPosition} {
		t.Run(fmt.Sprintf("mistake=%d", m), func(t *testing.T) {
			leakCheck(t)
			b := setup(t, time.Minute)
			p := b.publisher(t, Options{PositionInterval: time.Hour})
			p.mistake = m
			stop := b.start(t, p)
			started := b.storedPosition(t, p.Name())
			ids := b.enqueue(t, msgs(0, 5)...)
			b.waitDelivered(t, "the rows are delivered", ids)
			b.wait(t, "the reader counts them", func() bool { return p.Stats().Delivered == 5 })
			require.Equal(t, started, b.storedPosition(t, p.Name()), "no position written within the interval")
			require.NoError(t, stop())
			stopped := b.storedPosition(t, p.Name())
			require.Equal(t, p.Stats().Position, stopped)

			next := b.publisher(t, Options{})
			b.start(t, next)
			more := b.enqueue(t, msg(5))
			b.waitDelivered(t, "the next reader delivers", more)
			b.wait(t, "the next reader counts", func() bool { return next.Stats().Delivered == 1 })
			for id, n := range b.tr.times() {
				require.Equal(t, 1, n, "row %s published once", id)
			}
			if m == noFinalPosition {
				require.Equal(t, started, stopped)
				require.Equal(t, int64(5), next.Stats().Skipped, "without the final write, every row is read again")
				return
			}
			require.NotEqual(t, started, stopped, "the stop wrote the position")
			require.Zero(t, next.Stats().Skipped, "the stop stored the position after the rows: nothing read again")
		})
	}
}

// TestBinlogPurged: a reader whose stored position is purged from the server (PURGE
// BINARY LOGS while it is stopped) reports it once, starts again at the server's current
// position, and the rows of the gap are delivered by polling once their leases run out:
// nothing lost.
func TestBinlogPurged(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	p := b.publisher(t, Options{})
	stop := b.start(t, p)
	first := b.enqueue(t, msgs(0, 3)...)
	b.waitDelivered(t, "the first rows are delivered", first)
	require.NoError(t, stop())

	short := b.storeWith(t, 2*time.Second)
	gap := b.enqueueOn(t, short, msgs(3, 4)...)
	_, err := b.db.ExecContext(b.ctx, `FLUSH BINARY LOGS`)
	require.NoError(t, err)
	b.purge(t)

	next := b.publisher(t, Options{})
	b.start(t, next)
	b.wait(t, "the purge is reported", func() bool { return next.Stats().Resets == 1 })
	after := b.enqueue(t, msgs(7, 2)...)
	b.waitDelivered(t, "rows after the reset are read from the binlog", after)
	require.Equal(t, int64(1), next.Stats().Resets, "reported once")

	poller := b.poller(t, time.Minute)
	b.runPoller(t, poller)
	b.waitDelivered(t, "polling delivers the gap once the leases run out", gap)
	b.wait(t, "polling counts exactly the gap", func() bool { return poller.Stats().Delivered >= int64(len(gap)) })
	require.Equal(t, int64(len(gap)), poller.Stats().Delivered, "polling delivered exactly the gap")
}

// purge purges every binlog file but the newest. A file that a dump thread still reads
// is kept (with a warning), and the thread of a reader that just stopped may read on
// until it notices its client is gone: purge again until only the newest is left.
func (b *bundle) purge(t *testing.T) {
	t.Helper()
	logs := func() []string {
		rows, err := b.db.QueryContext(b.ctx, `SHOW BINARY LOGS`)
		require.NoError(t, err)
		defer rows.Close()
		var names []string
		for rows.Next() {
			var name string
			var size any
			require.NoError(t, rows.Scan(&name, &size))
			names = append(names, name)
		}
		require.NoError(t, rows.Err())
		return names
	}
	b.wait(t, "the old binlogs are purged", func() bool {
		names := logs()
		_, err := b.db.ExecContext(b.ctx, `PURGE BINARY LOGS TO '`+names[len(names)-1]+`'`)
		require.NoError(t, err)
		return len(logs()) == 1
	})
}

// TestTwoReaders: of two readers with one name, one holds the lock and reads, the other
// stands by; when the first stops, the other takes over from the stored position.
func TestTwoReaders(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	a := b.publisher(t, Options{})
	stopA := b.start(t, a)
	c := b.publisher(t, Options{})
	b.run(t, c)
	b.wait(t, "the second reader stands by", func() bool { return c.Stats().Standby })
	require.False(t, c.Stats().Reading)

	first := b.enqueue(t, msgs(0, 5)...)
	b.waitDelivered(t, "the first reader delivers", first)
	b.wait(t, "the first reader counts", func() bool { return a.Stats().Delivered == 5 })
	require.NoError(t, stopA())
	b.wait(t, "the second reader takes over", func() bool { return c.Stats().Reading })
	second := b.enqueue(t, msgs(5, 5)...)
	b.waitDelivered(t, "the second reader delivers", second)
	b.wait(t, "the second reader counts", func() bool { return c.Stats().Delivered == 5 })
	for id, n := range b.tr.times() {
		require.Equal(t, 1, n, "row %s published once", id)
	}
}

// TestPollingAndLogOnOneTable: a polling Publisher and a log Publisher on one table never
// both settle a row: the log publisher settles what it reads under a live insert lease,
// polling the rows whose leases ran out while the reader was stopped, and the reader,
// reading those again, finds them taken over and publishes none of them.
func TestPollingAndLogOnOneTable(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	p := b.publisher(t, Options{})
	stop := b.start(t, p)
	poller := b.poller(t, time.Minute)
	b.runPoller(t, poller)
	ids := b.enqueue(t, msgs(0, 30)...)
	b.waitDelivered(t, "the reader delivers", ids)
	b.wait(t, "the reader counts", func() bool { return p.Stats().Delivered == 30 })
	require.Zero(t, poller.Stats().Delivered, "rows under a live insert lease are the reader's")
	require.NoError(t, stop())

	short := b.storeWith(t, time.Second)
	late := b.enqueueOn(t, short, msgs(30, 10)...)
	b.waitDelivered(t, "polling takes the rows whose leases ran out", late)
	// The poller counts a settle once it has committed, a moment after the rows read delivered.
	b.wait(t, "the poller counts them", func() bool { return poller.Stats().Delivered == 10 })

	next := b.publisher(t, Options{})
	b.start(t, next)
	b.wait(t, "the reader reads them again and skips them", func() bool { return next.Stats().Skipped == 10 })
	require.Zero(t, next.Stats().Delivered+next.Stats().LeaseLost, "no row settled by both")
	for id, n := range b.tr.times() {
		require.Equal(t, 1, n, "row %s published once", id)
	}
	var settled int
	require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT COUNT(*) FROM outbox_events WHERE status = 'delivered'`).Scan(&settled))
	require.Equal(t, 40, settled)
}

// gated is a transport that records, then holds each call until its gate opens.
type gated struct {
	recorder
	gate chan struct{}
}

func (g *gated) Publish(ctx context.Context, batch []outbox.Delivery) []error {
	errs := g.recorder.Publish(ctx, batch)
	<-g.gate
	return errs
}

// TestLateOutcomeIsALostLease: a reader whose publish outlasts the row's insert lease
// finds the row taken over by polling, which delivered it meanwhile; its outcome is
// refused and counted as a lost lease, never applied over polling's.
func TestLateOutcomeIsALostLease(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	tr := &gated{gate: make(chan struct{})}
	p, err := New(b.store, tr, Options{Scope: outbox.Scope{Namespace: "orders"}, ConnString: b.dsn, Logger: quiet, RetryDelay: 50 * time.Millisecond})
	require.NoError(t, err)
	b.start(t, p)
	id := b.enqueueOn(t, b.storeWith(t, outbox.MinLogLease), msg(0))[0]
	b.wait(t, "the reader publishes the row", func() bool { return len(tr.deliveries()) == 1 })

	poller := b.poller(t, time.Minute)
	stop := b.runPoller(t, poller)
	b.waitDelivered(t, "polling takes the row over once its lease runs out", []uuid.UUID{id})
	stop()
	close(tr.gate)
	b.wait(t, "the reader's outcome is refused", func() bool { return p.Stats().LeaseLost == 1 })
	require.Zero(t, p.Stats().Delivered)
	require.Equal(t, int64(1), poller.Stats().Delivered)
}

// TestServerRestart: the reader survives a clean restart of the server and a crash
// (SIGKILL): it reconnects, resumes from the position committed with its last settle, and
// every row is delivered, none published twice.
func TestServerRestart(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	p := b.publisher(t, Options{})
	b.start(t, p)
	var all []uuid.UUID
	for i, crash := range []bool{false, true} {
		ids := b.enqueue(t, msgs(10*i, 5)...)
		b.waitDelivered(t, "rows before the restart are delivered", ids)
		all = append(all, ids...)
		b.wait(t, "the reader counts them", func() bool { return p.Stats().Delivered == int64(len(all)) })
		privateServer(t).restart(t, crash)
		b.wait(t, "the reader reads again", func() bool { return p.Stats().Reading })
		ids = b.enqueue(t, msgs(10*i+5, 5)...)
		b.waitDelivered(t, "rows after the restart are delivered", ids)
		all = append(all, ids...)
	}
	for _, id := range all {
		require.Equal(t, 1, b.tr.times()[id], "row %s published once", id)
	}
}

// TestLargeTransactions: a payload of several megabytes, a transaction of 1,000 rows
// (published in batches, its position written with the last), and a long transaction
// that enqueued first and commits last, delivered after the ones that committed before it.
func TestLargeTransactions(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	p := b.publisher(t, Options{})
	b.start(t, p)

	big := msg(0)
	big.Payload = json.RawMessage(`{"blob":"` + strings.Repeat("x", 6<<20) + `"}`)
	roomy, err := outbox.New(b.db, outbox.MySQL(), outbox.Options{LogLease: time.Minute, DisableNotify: true, MaxPayloadBytes: 8 << 20})
	require.NoError(t, err)
	bigID := b.enqueueOn(t, roomy, big)[0]

	long, err := b.db.BeginTx(b.ctx, nil)
	require.NoError(t, err)
	early, err := b.store.Enqueue(b.ctx, long, msg(1))
	require.NoError(t, err)

	tx, err := b.db.BeginTx(b.ctx, nil)
	require.NoError(t, err)
	res, err := b.store.EnqueueBatch(b.ctx, tx, msgs(2, 1000))
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	batch := make([]uuid.UUID, len(res))
	for i, r := range res {
		batch[i] = r.ID
	}
	b.waitDelivered(t, "the big row and the 1,000 rows are delivered", append([]uuid.UUID{bigID}, batch...))
	require.NotContains(t, b.tr.times(), early.ID, "an uncommitted row is not published")
	require.NoError(t, long.Commit())
	b.waitDelivered(t, "the long transaction's row is delivered", []uuid.UUID{early.ID})

	got := deliveredIDs(b.tr.deliveries())
	want := append(append([]uuid.UUID{bigID}, batch...), early.ID)
	require.Equal(t, want, got, "in commit order, each once")
	require.Equal(t, len(big.Payload), len(b.tr.deliveries()[0].Payload))
	require.JSONEq(t, string(big.Payload), string(b.tr.deliveries()[0].Payload))
}

func leakCheck(t *testing.T) {
	privateServer(t) // its goroutine lives as long as the package's tests
	opts := []goleak.Option{goleak.IgnoreCurrent(), goleak.IgnoreAnyFunction("github.com/outboxgo/outbox/outboxtest/mariadbserver.(*Server).start.func1")}
	t.Cleanup(func() { goleak.VerifyNone(t, opts...) })
}

// TestBadOptions: bad options are refused at New with ErrInvalid, and a server whose
// binlog is not in ROW format is a SetupError from Run, before anything is read.
func TestBadOptions(t *testing.T) {
	b := setup(t, time.Minute)
	for _, o := range []Options{
		{Scope: outbox.Scope{Namespace: "orders"}},
		{ConnString: b.dsn},
		{ConnString: b.dsn, Scope: outbox.Scope{Namespace: "orders"}, Name: "bad-name"},
		{ConnString: b.dsn, Scope: outbox.Scope{Namespace: "orders"}, BatchSize: outbox.MaxBatch + 1},
		{ConnString: "not a dsn", Scope: outbox.Scope{Namespace: "orders"}},
		{ConnString: b.dsn, Scope: outbox.Scope{Namespace: "orders"}, HeartbeatInterval: time.Millisecond},
	} {
		_, err := New(b.store, b.tr, o)
		require.ErrorIs(t, err, ErrInvalid, "%+v", o)
	}
	_, err := New(nil, b.tr, Options{})
	require.ErrorIs(t, err, ErrInvalid)
	sqlite, err := sql.Open("mysql", b.dsn) // any pool: the dialect is what is refused
	require.NoError(t, err)
	defer sqlite.Close()
	pg, err := outbox.New(sqlite, outbox.Postgres(), outbox.Options{})
	require.NoError(t, err)
	_, err = New(pg, b.tr, Options{ConnString: b.dsn, Scope: outbox.Scope{Namespace: "orders"}})
	require.ErrorIs(t, err, ErrInvalid, "a PostgreSQL store is refused")

	_, err = b.db.ExecContext(b.ctx, `SET GLOBAL binlog_format = 'MIXED'`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = b.db.ExecContext(context.Background(), `SET GLOBAL binlog_format = 'ROW'`) })
	p := b.publisher(t, Options{})
	var se *SetupError
	require.ErrorAs(t, p.Run(b.ctx), &se)
	require.Contains(t, se.Error(), "binlog_format is MIXED")
}

// TestIdleOutboxPositionMoves: while only other tables commit, the reader writes its
// position every PositionInterval, so a restart reads little again and purges of a busy
// server do not overtake it. Once the server is idle it writes nothing more: its own
// position writes, which it reads in the binlog too, move no position.
func TestIdleOutboxPositionMoves(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	const interval = 50 * time.Millisecond
	p := b.publisher(t, Options{PositionInterval: interval})
	b.start(t, p)
	before := b.storedPosition(t, p.Name())
	// One connection, so that @@last_gtid is the last insert's: the server's position may
	// already be past it, by a position write of the reader's own, which it never stores.
	conn, err := b.db.Conn(b.ctx)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(b.ctx, `CREATE TABLE other (n INT PRIMARY KEY)`)
	require.NoError(t, err)
	for i := range 5 {
		_, err := conn.ExecContext(b.ctx, `INSERT INTO other VALUES (?)`, i)
		require.NoError(t, err)
	}
	var now string
	require.NoError(t, conn.QueryRowContext(b.ctx, `SELECT @@last_gtid`).Scan(&now))
	b.wait(t, "the stored position reaches the last insert", func() bool { return b.storedPosition(t, p.Name()) == now })
	require.NotEqual(t, before, now)
	require.Empty(t, b.tr.deliveries())

	var idle string
	require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT @@gtid_binlog_pos`).Scan(&idle))
	for until := time.Now().Add(10 * interval); time.Now().Before(until); time.Sleep(5 * time.Millisecond) {
		var pos string
		require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT @@gtid_binlog_pos`).Scan(&pos))
		require.Equal(t, idle, pos, "an idle server's binlog stays still: no position written after the reader's own")
	}
}

// TestLockLost: a reader whose lock connection is killed stops reading within a heartbeat,
// takes the lock again, and delivers on from its stored position.
func TestLockLost(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	p := b.publisher(t, Options{})
	b.start(t, p)
	first := b.enqueue(t, msgs(0, 3)...)
	b.waitDelivered(t, "rows are delivered", first)
	var holder int64
	require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT IS_USED_LOCK(CONCAT('outbox_binlog.', DATABASE(), '.', ?))`, p.Name()).Scan(&holder))
	_, err := b.db.ExecContext(b.ctx, `KILL ?`, holder)
	require.NoError(t, err)
	b.wait(t, "the reader notices", func() bool { return !p.Stats().Reading })
	b.wait(t, "the reader reads again", func() bool { return p.Stats().Reading })
	var again int64
	require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT IS_USED_LOCK(CONCAT('outbox_binlog.', DATABASE(), '.', ?))`, p.Name()).Scan(&again))
	require.NotEqual(t, holder, again, "a new connection holds the lock")
	second := b.enqueue(t, msgs(3, 3)...)
	b.waitDelivered(t, "rows after are delivered", second)
}

// TestOrderedHandsBackBehindAFailure: with Ordered, a failed row's later rows of the same
// key are not published but handed back to polling, whose ordered claim delivers them
// after it, whether they came in the failed row's transaction (one Publish call holds at
// most one row of a key, to a transport that does not keep key order) or later; the first
// deliveries of each key are in enqueue order, and other keys go on.
func TestOrderedHandsBackBehindAFailure(t *testing.T) {
	// With a batch of one, the rows behind the failure are in later batches of the same
	// settle: the failure must stop their key there too.
	for _, size := range []int{100, 1} {
		t.Run(fmt.Sprintf("batch %d", size), func(t *testing.T) { orderedHandsBack(t, size) })
	}
}

func orderedHandsBack(t *testing.T, batchSize int) {
	leakCheck(t)
	b := setup(t, time.Minute, true)
	var once sync.Once
	b.tr.setFail(func(d outbox.Delivery) error {
		var err error
		if d.PartitionKey == "a" && string(d.Payload) == `{"n":2}` {
			once.Do(func() { err = errors.New("broker said no") })
		}
		return err
	})
	lp := b.publisher(t, Options{Ordered: true, BatchSize: batchSize, RetryPolicy: outbox.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}})
	b.start(t, lp)
	// Keys a and b interleaved, in one transaction and in more: a's second row fails.
	var batch []outbox.Message
	for i := range 8 {
		m := msg(i)
		m.PartitionKey = []string{"a", "b"}[i%2]
		batch = append(batch, m)
	}
	tx, err := b.db.BeginTx(b.ctx, nil)
	require.NoError(t, err)
	res, err := b.store.EnqueueBatch(b.ctx, tx, batch[:6])
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	var ids []uuid.UUID
	for _, r := range res {
		ids = append(ids, r.ID)
	}
	ids = append(ids, b.enqueue(t, batch[6:]...)...)
	b.wait(t, "the log publisher settles all eight", func() bool {
		s := lp.Stats()
		return s.Delivered+s.Retried == 8
	})
	require.Equal(t, int64(5), lp.Stats().Delivered, "key b, and a's first row")
	require.Equal(t, int64(3), lp.Stats().Retried, "a's failed row and the two behind it")
	r, err := b.store.Get(b.ctx, ids[2])
	require.NoError(t, err)
	require.Equal(t, "broker said no", r.LastError)
	for _, id := range []uuid.UUID{ids[4], ids[6]} {
		r, err := b.store.Get(b.ctx, id)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusPending, r.Status)
		require.Zero(t, r.Attempts, "handed back, never tried")
		require.Equal(t, heldBack, r.LastError)
	}

	poller, err := outbox.NewPublisher(b.store, b.tr, outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "orders"},
		Ordered: true, PollInterval: 20 * time.Millisecond, Lease: time.Minute, Logger: quiet})
	require.NoError(t, err)
	stop := b.runPoller(t, poller)
	b.waitDelivered(t, "every row is delivered", ids)
	stop()

	// The first successful delivery of each row, per key, is in enqueue order.
	var firsts = map[string][]string{}
	failed := true
	for _, d := range b.tr.deliveries() {
		if d.PartitionKey == "a" && string(d.Payload) == `{"n":2}` && failed {
			failed = false // the failed attempt of a's second row
			continue
		}
		firsts[d.PartitionKey] = append(firsts[d.PartitionKey], string(d.Payload))
	}
	require.Equal(t, []string{`{"n":0}`, `{"n":2}`, `{"n":4}`, `{"n":6}`}, firsts["a"])
	require.Equal(t, []string{`{"n":1}`, `{"n":3}`, `{"n":5}`, `{"n":7}`}, firsts["b"])
}

// TestSettleWaitsForVisibility: a row read from the binlog may not be visible to other
// sessions yet, or still locked by its inserting transaction; the settle neither counts it
// as a lost lease nor moves the position past it, but settles it once it is committed.
func TestSettleWaitsForVisibility(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	p := b.publisher(t, Options{})
	tx, err := b.db.BeginTx(b.ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	res, err := b.store.Enqueue(b.ctx, tx, msg(1))
	require.NoError(t, err)
	owner := uuid.New()
	require.NoError(t, p.ensureTable(b.ctx))
	require.NoError(t, p.writeOwner(b.ctx, owner, position{}))
	done := make(chan error, 1)
	go func() {
		done <- p.settle(b.ctx, owner, []outbox.Outcome{{Lease: outbox.LogLeaseOf(res.ID), Status: outbox.StatusDelivered}}, nil)
	}()
	b.wait(t, "the settle misses the row or waits for its lock", func() bool {
		var waiting int // the settle's UPDATE waits for the inserting transaction's row lock
		require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT COUNT(*) FROM information_schema.PROCESSLIST`+
			` WHERE DB = DATABASE() AND COMMAND = 'Query' AND INFO LIKE 'UPDATE %outbox_events%'`).Scan(&waiting))
		return p.unseenRetries.Load() > 0 || waiting > 0
	})
	require.NoError(t, tx.Commit())
	require.NoError(t, <-done)
	require.Equal(t, int64(1), p.Stats().Delivered)
	require.Zero(t, p.Stats().LeaseLost)
	require.Equal(t, outbox.StatusDelivered, b.status(t)[res.ID])
}

// TestOneWritePerEvent counts, with a trigger, the UPDATEs of outbox rows beyond their
// INSERT: one per event delivered from the binlog (its settle), two per event polled (the
// claim and the settle).
func TestOneWritePerEvent(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	for _, q := range []string{
		`CREATE TABLE row_updates (n BIGINT NOT NULL)`,
		`INSERT INTO row_updates VALUES (0)`,
		`CREATE TRIGGER count_update AFTER UPDATE ON outbox_events FOR EACH ROW UPDATE row_updates SET n = n + 1`,
	} {
		_, err := b.db.ExecContext(b.ctx, q)
		require.NoError(t, err, q)
	}
	updates := func() int64 {
		var n int64
		require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT n FROM row_updates`).Scan(&n))
		return n
	}
	const n = 50
	lp := b.publisher(t, Options{})
	stop := b.start(t, lp)
	logged := b.enqueue(t, msgs(0, n)...)
	b.waitDelivered(t, "the log delivers", logged)
	b.wait(t, "the log publisher counts its settles", func() bool { return lp.Stats().Delivered == n })
	require.NoError(t, stop())
	fromLog := updates()

	plain := b.storeWith(t, 0)
	polled := b.enqueueOn(t, plain, msgs(100, n)...)
	pp := b.poller(t, time.Minute)
	b.runPoller(t, pp)
	b.waitDelivered(t, "polling delivers", polled)
	b.wait(t, "the poller counts its settles", func() bool { return pp.Stats().Delivered == n })
	fromPolling := updates() - fromLog
	t.Logf("row UPDATEs per event beyond the INSERT: log %.2f, polling %.2f", float64(fromLog)/n, float64(fromPolling)/n)
	require.Equal(t, int64(n), fromLog, "one settle per event from the binlog")
	require.Equal(t, int64(2*n), fromPolling, "a claim and a settle per polled event")
}

// TestPositionWritesPerInterval counts, with a trigger, the position row's UPDATEs while
// events arrive at a steady trickle, each a batch of its own: at most one per
// PositionInterval and one at the stop, far fewer than the events. Written with every
// settle (the mistake), they are one per event.
func TestPositionWritesPerInterval(t *testing.T) {
	for _, m := range []mistake{noMistake, positionEverySettle} {
		t.Run(fmt.Sprintf("mistake=%d", m), func(t *testing.T) {
			leakCheck(t)
			b := setup(t, time.Minute)
			const interval = 100 * time.Millisecond
			p := b.publisher(t, Options{PositionInterval: interval})
			p.mistake = m
			stop := b.start(t, p)
			for _, q := range []string{
				`CREATE TABLE position_updates (n BIGINT NOT NULL)`,
				`INSERT INTO position_updates VALUES (0)`,
				`CREATE TRIGGER count_position AFTER UPDATE ON outbox_events_binlog_position FOR EACH ROW UPDATE position_updates SET n = n + 1`,
			} {
				_, err := b.db.ExecContext(b.ctx, q)
				require.NoError(t, err, q)
			}
			began := time.Now()
			const n = 40
			for i := range n {
				b.waitDelivered(t, "the event is delivered", b.enqueue(t, msg(i)))
			}
			b.wait(t, "the reader counts its settles", func() bool { return p.Stats().Delivered == n })
			require.NoError(t, stop())
			elapsed := time.Since(began)
			var writes int64
			require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT n FROM position_updates`).Scan(&writes))
			bound := int64(elapsed/interval) + 2 // one per interval, and the stop's
			t.Logf("%d events in %s: %d position writes (%.2f per event), at most %d allowed", n, elapsed.Round(time.Millisecond), writes, float64(writes)/n, bound)
			if m == positionEverySettle {
				require.Greater(t, writes, bound, "a write per settle")
				return
			}
			require.LessOrEqual(t, writes, bound)
			require.Positive(t, writes, "the stop wrote the position at least")
		})
	}
}

// TestOrderedTransactionOfManyKeys: one transaction of more keys than a statement has
// placeholders for (three a key in the ordered check), on a pool that sends placeholders
// to the server (the driver's default): the reader's reads of the rows' keys and leases go
// in parts, and every row is delivered from the log.
func TestOrderedTransactionOfManyKeys(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute, true)
	cfg, err := mysql.ParseDSN(b.dsn)
	require.NoError(t, err)
	cfg.InterpolateParams = false
	db, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	store, err := outbox.New(db, outbox.MySQL(), outbox.Options{LogLease: time.Minute, DisableNotify: true})
	require.NoError(t, err)
	lp, err := New(store, b.tr, Options{ConnString: b.dsn, Scope: outbox.Scope{Namespace: "orders"}, Ordered: true, Logger: slog.New(slog.NewTextHandler(testLog{t}, nil))})
	require.NoError(t, err)
	b.start(t, lp)

	const n = 22_000
	tx, err := b.db.BeginTx(b.ctx, nil)
	require.NoError(t, err)
	for from := 0; from < n; from += outbox.MaxBatch {
		batch := msgs(from, outbox.MaxBatch)
		for i := range batch {
			batch[i].PartitionKey = fmt.Sprintf("k%d", from+i)
		}
		_, err := b.store.EnqueueBatch(b.ctx, tx, batch)
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit())
	b.wait(t, "every row is delivered from the log", func() bool { return lp.Stats().Delivered == n })
	require.Len(t, b.tr.deliveries(), n, "each once")
}

// TestSavepointEndsNothing: a SAVEPOINT inside a transaction is a statement of its own in
// the binlog; the transaction's rows are handed over at its commit, all of them together,
// so that no settle, and no position written with it, falls in the middle of it (a
// position there would make the next session skip, or misread, the rest).
func TestSavepointEndsNothing(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	p := b.publisher(t, Options{BatchSize: 1})
	var (
		mu     sync.Mutex
		handed [][]uuid.UUID
	)
	p.handed = func(rows []outbox.Record) {
		mu.Lock()
		defer mu.Unlock()
		ids := make([]uuid.UUID, len(rows))
		for i, r := range rows {
			ids[i] = r.ID
		}
		handed = append(handed, ids)
	}
	b.start(t, p)
	tx, err := b.db.BeginTx(b.ctx, nil)
	require.NoError(t, err)
	first, err := b.store.Enqueue(b.ctx, tx, msg(0))
	require.NoError(t, err)
	_, err = tx.ExecContext(b.ctx, `SAVEPOINT s1`)
	require.NoError(t, err)
	second, err := b.store.Enqueue(b.ctx, tx, msg(1))
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	b.waitDelivered(t, "both rows are delivered from the binlog", []uuid.UUID{first.ID, second.ID})
	require.Equal(t, []uuid.UUID{first.ID, second.ID}, deliveredIDs(b.tr.deliveries()))
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, [][]uuid.UUID{{first.ID, second.ID}}, handed, "the transaction is handed over whole, at its commit")
}

// TestFencedSettleWritesNothing: a reader whose row in the position table was taken over
// (another owner: a reader that got the lock after this one lost it) commits nothing, no
// outcome and no position: its settle rolls back and its session ends. Taking the lock
// again, it reads the rows again from the stored position and settles them then.
func TestFencedSettleWritesNothing(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	p := b.publisher(t, Options{})
	b.start(t, p)
	_, err := b.db.ExecContext(b.ctx, `UPDATE outbox_events_binlog_position SET owner = ? WHERE reader = ?`, uuid.NewString(), p.Name())
	require.NoError(t, err)
	ids := b.enqueue(t, msgs(0, 3)...)
	b.waitDelivered(t, "the rows are delivered by the next session", ids)
	// The fenced session's batch was published, its settle rolled back, and published
	// again by the next session, which settled it: no outcome was applied twice.
	require.Equal(t, 2, b.tr.times()[ids[0]])
	for _, id := range ids {
		require.Positive(t, b.tr.times()[id])
	}
	b.wait(t, "the reader counts", func() bool { return p.Stats().Delivered == 3 })
	require.Zero(t, p.Stats().LeaseLost, "the fenced settle applied no outcome")
}

// TestReadersOfTwoDatabases: readers of the same table name in two databases of one server
// register with different server ids by default, so neither's binlog connection makes the
// server drop the other's: both read on in their first session.
func TestReadersOfTwoDatabases(t *testing.T) {
	leakCheck(t)
	one, two := setup(t, time.Minute), setup(t, time.Minute)
	p1, p2 := one.publisher(t, Options{}), two.publisher(t, Options{})
	require.Equal(t, p1.Name(), p2.Name())
	one.start(t, p1)
	two.start(t, p2)
	for round := range 3 {
		a, b := one.enqueue(t, msgs(2*round, 2)...), two.enqueue(t, msgs(2*round, 2)...)
		one.waitDelivered(t, "the first database's rows are delivered", a)
		two.waitDelivered(t, "the second database's rows are delivered", b)
	}
	require.Equal(t, int64(1), p1.sessions.Load(), "the first reader was never cut off")
	require.Equal(t, int64(1), p2.sessions.Load(), "the second reader was never cut off")
}

// keyOrderRecorder is a recorder that keeps key order: once a row of a key fails, it
// sends none of the key's later rows of the batch.
type keyOrderRecorder struct {
	*recorder
	mu    sync.Mutex
	calls [][]outbox.Delivery
}

func (*keyOrderRecorder) KeepsKeyOrder() bool { return true }

func (r *keyOrderRecorder) Publish(ctx context.Context, batch []outbox.Delivery) []error {
	r.mu.Lock()
	r.calls = append(r.calls, slices.Clone(batch))
	r.mu.Unlock()
	r.recorder.mu.Lock()
	defer r.recorder.mu.Unlock()
	errs := make([]error, len(batch))
	failed := map[string]bool{}
	for i, d := range batch {
		if d.PartitionKey != "" && failed[d.PartitionKey] {
			errs[i] = errors.New("not sent: an earlier message of its key failed")
			continue
		}
		if r.recorder.fail != nil {
			errs[i] = r.recorder.fail(d)
		}
		if errs[i] != nil {
			failed[d.PartitionKey] = d.PartitionKey != ""
			continue
		}
		r.recorder.got = append(r.recorder.got, d)
	}
	return errs
}

// TestOrderedRunsToAKeyOrderTransport: with Ordered and a transport that keeps key order,
// a transaction's rows of one key go in one Publish call, in commit order; when one fails,
// the key's later rows are handed back with their attempts given back, and polling
// delivers them after it.
func TestOrderedRunsToAKeyOrderTransport(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute, true)
	tr := &keyOrderRecorder{recorder: b.tr}
	var once sync.Once
	b.tr.setFail(func(d outbox.Delivery) error {
		var err error
		if d.PartitionKey == "a" && string(d.Payload) == `{"n":2}` {
			once.Do(func() { err = errors.New("broker said no") })
		}
		return err
	})
	lp := b.publisher(t, Options{Ordered: true})
	lp.tr, lp.keyOrder = tr, true
	b.start(t, lp)
	var batch []outbox.Message
	for i := range 8 {
		m := msg(i)
		m.PartitionKey = []string{"a", "b"}[i%2]
		batch = append(batch, m)
	}
	tx, err := b.db.BeginTx(b.ctx, nil)
	require.NoError(t, err)
	res, err := b.store.EnqueueBatch(b.ctx, tx, batch)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	var ids []uuid.UUID
	for _, r := range res {
		ids = append(ids, r.ID)
	}
	b.wait(t, "the log publisher settles all eight", func() bool {
		s := lp.Stats()
		return s.Delivered+s.Retried == 8
	})
	tr.mu.Lock()
	first := tr.calls[0]
	tr.mu.Unlock()
	require.Len(t, first, 8, "the transaction's rows in one call, each key's together")
	require.Equal(t, int64(5), lp.Stats().Delivered, "key b, and a's first row")
	for _, i := range []int{4, 6} {
		r, err := b.store.Get(b.ctx, ids[i])
		require.NoError(t, err)
		require.Equal(t, outbox.StatusPending, r.Status)
		require.Zero(t, r.Attempts, "handed back, never tried")
		require.Equal(t, heldBack, r.LastError)
	}
	poller, err := outbox.NewPublisher(b.store, tr, outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "orders"},
		Ordered: true, PollInterval: 20 * time.Millisecond, Lease: time.Minute, Logger: quiet,
		Retry: outbox.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}})
	require.NoError(t, err)
	stop := b.runPoller(t, poller)
	b.waitDelivered(t, "every row is delivered", ids)
	stop()
	got := map[string][]string{}
	for _, d := range b.tr.deliveries() {
		got[d.PartitionKey] = append(got[d.PartitionKey], string(d.Payload))
	}
	require.Equal(t, []string{`{"n":0}`, `{"n":2}`, `{"n":4}`, `{"n":6}`}, got["a"], "each row once, in order")
	require.Equal(t, []string{`{"n":1}`, `{"n":3}`, `{"n":5}`, `{"n":7}`}, got["b"])
}

// TestUnorderedWaivesKeyOrder: an unordered log publisher hands a transport that keeps key
// order its batches as needing none, so a key's failed row holds back none of the key's
// other rows (they would fail unsent and spend an attempt each).
func TestUnorderedWaivesKeyOrder(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	var failed sync.Once
	b.tr.setFail(func(d outbox.Delivery) error {
		var err error
		if string(d.Payload) == `{"n":0}` {
			failed.Do(func() { err = errors.New("broker said no") })
		}
		return err
	})
	p := b.publisher(t, Options{RetryPolicy: outbox.RetryPolicy{BaseDelay: time.Minute, MaxDelay: time.Minute}})
	p.tr = outbox.PerMessage(func(ctx context.Context, d outbox.Delivery) error { return b.tr.Publish(ctx, []outbox.Delivery{d})[0] })
	b.start(t, p)
	batch := msgs(0, 3)
	for i := range batch {
		batch[i].PartitionKey = "a"
	}
	tx, err := b.db.BeginTx(b.ctx, nil)
	require.NoError(t, err)
	res, err := b.store.EnqueueBatch(b.ctx, tx, batch)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	b.wait(t, "the log publisher settles all three", func() bool { s := p.Stats(); return s.Delivered+s.Retried == 3 })
	require.Equal(t, int64(2), p.Stats().Delivered, "the key's rows after the failed one are sent")
	for _, r := range res[1:] {
		got, err := b.store.Get(b.ctx, r.ID)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusDelivered, got.Status)
	}
}
