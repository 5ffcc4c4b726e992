package outboxpglog

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

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

// recorder is a transport that records what it is handed, in order, and fails the
// messages fail names.
type recorder struct {
	mu     sync.Mutex
	got    []outbox.Delivery
	fail   func(d outbox.Delivery) error
	notify chan struct{}
}

func newRecorder() *recorder { return &recorder{notify: make(chan struct{}, 1)} }

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
	select {
	case r.notify <- struct{}{}:
	default:
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
	return setupOn(t, server(t), logLease, ordered...)
}

// setupOn is setup on a server of the test's choice.
func setupOn(t *testing.T, srv *pgServer, logLease time.Duration, ordered ...bool) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	t.Cleanup(cancel)
	dsn := srv.database(t)
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, migrations.Up(ctx, db, "postgres", migrations.Options{Ordered: len(ordered) > 0 && ordered[0]}))
	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{LogLease: logLease, DisableNotify: true})
	require.NoError(t, err)
	return &bundle{ctx: ctx, dsn: dsn, db: db, store: store, tr: newRecorder()}
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
	p, err := New(b.store, b.tr, o)
	require.NoError(t, err)
	return p
}

// start runs p until the test ends (or stop is called) and waits until it reads its slot;
// stop returns Run's error.
func (b *bundle) start(t *testing.T, p *Publisher) (stop func() error) {
	t.Helper()
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
	b.wait(t, "the publisher reads its slot", func() bool { return p.Stats().Reading })
	return stop
}

// wait polls cond until it holds, failing the test after a deadline.
func (b *bundle) wait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
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

// enqueue commits one transaction per message and returns the ids in commit order.
func (b *bundle) enqueue(t *testing.T, msgs ...outbox.Message) []uuid.UUID {
	t.Helper()
	return b.enqueueOn(t, b.store, msgs...)
}

// enqueueOn is enqueue through another Store of the bundle's table.
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

func msgs(from, n int) []outbox.Message {
	out := make([]outbox.Message, n)
	for i := range out {
		out[i] = msg(from + i)
	}
	return out
}

// storeWith returns another Store of the bundle's table, whose rows are leased to the
// log's reader for lease: a short one for rows that polling must take over, while the
// bundle's store keeps the rows the log delivers out of polling's reach however slow
// the machine.
func (b *bundle) storeWith(t *testing.T, lease time.Duration) *outbox.Store {
	t.Helper()
	s, err := outbox.New(b.db, outbox.Postgres(), outbox.Options{LogLease: lease, DisableNotify: true})
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
		var id uuid.UUID
		var st string
		require.NoError(t, rows.Scan(&id, &st))
		out[id] = outbox.Status(st)
	}
	require.NoError(t, rows.Err())
	return out
}

// allDelivered reports whether every row of ids is delivered.
func (b *bundle) allDelivered(t *testing.T, ids []uuid.UUID) bool {
	st := b.status(t)
	for _, id := range ids {
		if st[id] != outbox.StatusDelivered {
			return false
		}
	}
	return true
}

// waitDelivered waits until every row of ids is delivered, and on timeout names those
// that are not, as the table has them.
func (b *bundle) waitDelivered(t *testing.T, what string, ids []uuid.UUID) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !b.allDelivered(t, ids) {
		if time.Now().After(deadline) {
			st := b.status(t)
			for _, id := range ids {
				if st[id] != outbox.StatusDelivered {
					r, err := b.store.Get(b.ctx, id)
					require.NoError(t, err)
					t.Logf("row %s: %s, attempts %d, locked_by %q until %s, next attempt %s, last error %q, created %s",
						id, r.Status, r.Attempts, r.LockedBy, r.LockedUntil, r.NextAttemptAt, r.LastError, r.CreatedAt)
				}
			}
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func deliveredIDs(ds []outbox.Delivery) []uuid.UUID {
	out := make([]uuid.UUID, len(ds))
	for i, d := range ds {
		out[i] = d.ID
	}
	return out
}

// TestDeliversInCommitOrder: committed rows reach the transport in commit order, once
// each, settled delivered with one write; a rolled-back row and a delayed row never do.
func TestDeliversInCommitOrder(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	p := b.publisher(t, Options{Slot: "order_slot", StatusInterval: 50 * time.Millisecond})
	b.start(t, p)

	tx, err := b.db.BeginTx(b.ctx, nil)
	require.NoError(t, err)
	_, err = b.store.Enqueue(b.ctx, tx, msg(-1))
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())
	delayed := msg(-2)
	delayed.Delay = time.Hour
	late := b.enqueue(t, delayed)[0]

	ids := b.enqueue(t, msgs(0, 40)...)
	b.waitDelivered(t, "every row is delivered", ids)
	require.Equal(t, ids, deliveredIDs(b.tr.deliveries()), "in commit order, each once, nothing else")
	for i, d := range b.tr.deliveries() {
		require.JSONEq(t, fmt.Sprintf(`{"n":%d}`, i), string(d.Payload))
		require.Equal(t, 1, d.Attempt)
		var created time.Time
		require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT created_at FROM outbox_events WHERE id = $1`, d.ID).Scan(&created))
		require.True(t, created.Equal(d.CreatedAt), "created_at %s read from the log as %s", created, d.CreatedAt)
	}
	require.Equal(t, outbox.StatusPending, b.status(t)[late], "a delayed row is left to polling")
	// A settle's commit is seen before its publisher counts it.
	b.wait(t, "the publisher counts its settles", func() bool { return p.Stats().Delivered == int64(len(ids)) })
	st := p.Stats()
	require.Equal(t, int64(len(ids)), st.Delivered)
	require.Zero(t, st.LeaseLost+st.Retried+st.Dead)
	t.Logf("commit to publish of the last batch: %s", st.CommitToPublish)

	// The slot's position passes the settled rows once the server is told.
	var after string
	require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&after))
	b.wait(t, "the slot confirms past the rows", func() bool {
		var past bool
		err := b.db.QueryRowContext(b.ctx, `SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = 'order_slot'`, after).Scan(&past)
		return err == nil && past
	})
}

// TestFailureGoesToRetryPath: a delivery the transport fails goes back to pending under
// the retry policy, and a polling Publisher delivers it; the other rows are not held.
func TestFailureGoesToRetryPath(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	ids := make(chan uuid.UUID, 1)
	var failed sync.Once
	b.tr.setFail(func(d outbox.Delivery) error {
		var err error
		failed.Do(func() { err = errors.New("broker said no"); ids <- d.ID })
		return err
	})
	p := b.publisher(t, Options{Slot: "retry_slot", RetryPolicy: outbox.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}})
	b.start(t, p)
	all := b.enqueue(t, msgs(0, 5)...)
	bad := <-ids
	b.wait(t, "the log publisher settles all five", func() bool { s := p.Stats(); return s.Delivered+s.Retried == 5 })
	require.Equal(t, int64(1), p.Stats().Retried)
	r, err := b.store.Get(b.ctx, bad)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, r.Status)
	require.Equal(t, 1, r.Attempts)
	require.Equal(t, "broker said no", r.LastError)

	poller, err := outbox.NewPublisher(b.store, b.tr, outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "orders"}, PollInterval: 20 * time.Millisecond, Lease: time.Minute, Logger: quiet})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- poller.Run(ctx) }()
	b.waitDelivered(t, "polling delivers the failed row", all)
	cancel()
	require.NoError(t, <-done)
	require.Equal(t, int64(1), poller.Stats().Delivered, "polling delivered only the failed row")
	r, err = b.store.Get(b.ctx, bad)
	require.NoError(t, err)
	require.Equal(t, 2, r.Attempts)
}

// TestResumesAfterKill: a publisher killed after publishing a batch and before settling
// it, or after settling and before confirming the slot's position, leaves nothing lost:
// the next one reads the same transactions again from the slot and every row ends
// delivered (some twice, at least once).
func TestResumesAfterKill(t *testing.T) {
	for _, point := range []string{"published", "confirm"} {
		t.Run(point, func(t *testing.T) {
			leakCheck(t)
			b := setup(t, time.Minute)
			slot := "kill_" + point
			first := b.publisher(t, Options{Slot: slot, StatusInterval: 10 * time.Millisecond})
			killed := killAt(t, b, first, point, func() bool { return len(b.tr.deliveries()) > 0 })
			ctx, cancel := context.WithCancel(b.ctx)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- first.Run(ctx) }()
			b.wait(t, "the first publisher reads its slot", func() bool { return first.Stats().Reading })
			ids := b.enqueue(t, msgs(0, 20)...)
			<-killed
			require.ErrorIs(t, <-done, errKilled)
			got := deliveredIDs(b.tr.deliveries())
			require.NotEmpty(t, got)
			if point == "published" {
				require.Zero(t, first.Stats().Delivered, "killed before settling")
				for _, id := range got {
					require.Equal(t, outbox.StatusProcessing, b.status(t)[id], "published, not settled")
				}
			}

			second := b.publisher(t, Options{Slot: slot})
			b.start(t, second)
			b.waitDelivered(t, "every row is delivered", ids)
			seen := map[uuid.UUID]int{}
			for _, id := range deliveredIDs(b.tr.deliveries()) {
				seen[id]++
			}
			for _, id := range ids {
				require.GreaterOrEqual(t, seen[id], 1, "row %s delivered", id)
			}
			if point == "confirm" { // every row was delivered before the kill: wait for the replay
				// Both counts: a settle's rows show delivered in the table a moment before the
				// reader counts them.
				b.wait(t, "the second reads the settled rows again and counts the rest", func() bool {
					st := second.Stats()
					return st.LeaseLost >= first.Stats().Delivered && first.Stats().Delivered+st.Delivered >= int64(len(ids))
				})
			} else {
				b.wait(t, "the second counts its settles", func() bool { return second.Stats().Delivered >= int64(len(ids)) })
			}
			st := second.Stats()
			if point == "published" {
				require.Equal(t, int64(len(ids)), st.Delivered, "the second settles every row, the killed batch included")
			} else {
				require.Equal(t, int64(len(ids)), first.Stats().Delivered+st.Delivered)
				require.Equal(t, first.Stats().Delivered, st.LeaseLost, "the replayed rows were settled already: refused, not applied twice")
			}
		})
	}
}

// TestSharesTableWithPolling: a polling Publisher and the log Publisher on one table
// deliver every row, and no row is settled by both; once the log Publisher stops, polling
// takes its rows over when their leases run out.
func TestSharesTableWithPolling(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	lp := b.publisher(t, Options{Slot: "shared_slot"})
	stopLog := b.start(t, lp)
	poller, err := outbox.NewPublisher(b.store, b.tr, outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "orders"}, PollInterval: 20 * time.Millisecond, Lease: time.Minute, Logger: quiet})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- poller.Run(ctx) }()

	// Rows the log owns, and rows polling owns (inserted by a Store without LogLease).
	plain, err := outbox.New(b.db, outbox.Postgres(), outbox.Options{DisableNotify: true})
	require.NoError(t, err)
	var ids []uuid.UUID
	for i := range 30 {
		ids = append(ids, b.enqueue(t, msg(i))...)
		tx, err := b.db.BeginTx(b.ctx, nil)
		require.NoError(t, err)
		res, err := plain.Enqueue(b.ctx, tx, msg(100+i))
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		ids = append(ids, res.ID)
	}
	b.waitDelivered(t, "every row is delivered", ids)
	b.wait(t, "both publishers counted their settles", func() bool {
		return lp.Stats().Delivered+poller.Stats().Delivered == int64(len(ids))
	})
	require.Equal(t, int64(30), lp.Stats().Delivered, "the log publisher settled its rows")
	require.Equal(t, int64(30), poller.Stats().Delivered, "polling settled the others")
	require.Zero(t, lp.Stats().LeaseLost+poller.Stats().LeaseLost, "no row settled by both")
	require.Len(t, b.tr.deliveries(), len(ids), "each row published once")

	// The log publisher stops; its rows wait out their lease and polling delivers them.
	require.NoError(t, stopLog())
	orphans := b.enqueueOn(t, b.storeWith(t, outbox.MinLogLease), msgs(200, 10)...)
	for _, id := range orphans {
		require.Equal(t, outbox.StatusProcessing, b.status(t)[id], "leased to the stopped log publisher")
	}
	b.waitDelivered(t, "polling takes the orphans over", orphans)
	for _, id := range orphans {
		r, err := b.store.Get(b.ctx, id)
		require.NoError(t, err)
		require.Equal(t, 2, r.Attempts, "claimed once by polling after the insert's lease")
	}
	cancel()
	require.NoError(t, <-done)
	require.Zero(t, poller.Stats().LeaseLost)
}

// leakCheck fails the test if a goroutine it started outlives it; registered first, it
// runs after every other cleanup (which stop the publishers).
func leakCheck(t *testing.T) {
	server(t) // its goroutine lives as long as the package's tests
	opts := []goleak.Option{goleak.IgnoreCurrent(), goleak.IgnoreAnyFunction("github.com/outboxgo/outbox/outboxtest/pgserver.(*Server).start.func1")}
	t.Cleanup(func() { goleak.VerifyNone(t, opts...) })
}

// TestOrderedHandsBackBehindAFailure: with Ordered, a failed row's later rows of the same
// key are not published but handed back to polling, whose ordered claim delivers them
// after it, whether they came in the failed row's transaction (one Publish call holds at
// most one row of a key, to a transport that does not keep key order) or later; the first
// deliveries of each key are in enqueue order, and other keys go on.
func TestOrderedHandsBackBehindAFailure(t *testing.T) {
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
	lp := b.publisher(t, Options{Slot: "ordered_slot", Ordered: true, RetryPolicy: outbox.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}})
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
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- poller.Run(ctx) }()
	b.waitDelivered(t, "every row is delivered", ids)
	cancel()
	require.NoError(t, <-done)

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

// TestSettleCarriesUnseenRow: the server sends a commit once its WAL is flushed, a moment
// before other sessions see the rows; a settle that does not find a row yet, while it is
// still leased to the log, carries its outcome to the next settle instead of counting the
// row as taken over.
func TestSettleCarriesUnseenRow(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	p := b.publisher(t, Options{})
	tx, err := b.db.BeginTx(b.ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	res, err := b.store.Enqueue(b.ctx, tx, msg(1))
	require.NoError(t, err)
	c := &carry{}
	c.add([]outbox.Record{{ID: res.ID}}, []outbox.Outcome{{Lease: outbox.LogLeaseOf(res.ID), Status: outbox.StatusDelivered}}, 7)
	require.NoError(t, p.settle(b.ctx, c))
	require.Len(t, c.held, 1, "carried while the row is not visible")
	require.Equal(t, int64(1), p.unseenRetries.Load())
	require.Equal(t, pglogrepl.LSN(7), c.bound(100), "the position waits for it")
	require.Equal(t, Stats{}, p.Stats(), "nothing counted yet")
	require.NoError(t, tx.Commit())
	require.NoError(t, p.settle(b.ctx, c))
	require.Empty(t, c.held)
	require.Equal(t, pglogrepl.LSN(100), c.bound(100))
	require.Equal(t, int64(1), p.Stats().Delivered)
	require.Zero(t, p.Stats().LeaseLost)
	require.Equal(t, outbox.StatusDelivered, b.status(t)[res.ID])
}

// TestOneWritePerEvent counts, with a trigger, the UPDATEs of outbox rows beyond their
// INSERT: one per event delivered from the log (its settle), two per event polled (the
// claim and the settle).
func TestOneWritePerEvent(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	for _, q := range []string{
		`CREATE TABLE row_updates (n bigint NOT NULL)`,
		`INSERT INTO row_updates VALUES (0)`,
		`CREATE FUNCTION count_update() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN UPDATE row_updates SET n = n + 1; RETURN NEW; END $$`,
		`CREATE TRIGGER count_update AFTER UPDATE ON outbox_events FOR EACH ROW EXECUTE FUNCTION count_update()`,
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
	lp := b.publisher(t, Options{Slot: "writes_slot"})
	stop := b.start(t, lp)
	logged := b.enqueue(t, msgs(0, n)...)
	b.waitDelivered(t, "the log delivers", logged)
	b.wait(t, "the log publisher counts its settles", func() bool { return lp.Stats().Delivered == n })
	require.NoError(t, stop())
	fromLog := updates()

	plain := b.storeWith(t, 0)
	polled := b.enqueueOn(t, plain, msgs(100, n)...)
	pp := b.poll(t)
	b.waitDelivered(t, "polling delivers", polled)
	b.wait(t, "the poller counts its settles", func() bool { return pp.Stats().Delivered == n })
	fromPolling := updates() - fromLog
	t.Logf("row UPDATEs per event beyond the INSERT: log %.2f, polling %.2f", float64(fromLog)/n, float64(fromPolling)/n)
	require.Equal(t, int64(n), fromLog, "one settle per event from the log")
	require.Equal(t, int64(2*n), fromPolling, "a claim and a settle per polled event")
}

func migrateUp(ctx context.Context, db *sql.DB) error {
	return migrations.Up(ctx, db, "postgres", migrations.Options{})
}

// gate is a transport that holds each batch until released, or until its context ends.
type gate struct {
	entered chan struct{}
	release chan struct{}
}

func (g *gate) Publish(ctx context.Context, batch []outbox.Delivery) []error {
	g.entered <- struct{}{}
	errs := make([]error, len(batch))
	select {
	case <-g.release:
	case <-ctx.Done():
		for i := range errs {
			errs[i] = ctx.Err()
		}
	}
	return errs
}

// TestShutdownFinishesBatch: a shutdown lets the batch being published finish and settles
// it delivered, rather than failing it.
func TestShutdownFinishesBatch(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	g := &gate{entered: make(chan struct{}, 1), release: make(chan struct{})}
	p, err := New(b.store, g, Options{ConnString: b.dsn, Scope: outbox.Scope{Namespace: "orders"}, Slot: "shutdown_slot", Logger: quiet})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	b.wait(t, "the publisher reads its slot", func() bool { return p.Stats().Reading })
	id := b.enqueue(t, msg(1))[0]
	<-g.entered
	cancel()
	close(g.release)
	require.NoError(t, <-done)
	require.Equal(t, outbox.StatusDelivered, b.status(t)[id])
	require.Equal(t, int64(1), p.Stats().Delivered)
}

// keyOrderRecorder is a recorder that keeps key order: once a row of a key fails, it
// sends none of the key's later rows of the batch.
type keyOrderRecorder struct {
	*recorder
	calls [][]outbox.Delivery
}

func (*keyOrderRecorder) KeepsKeyOrder() bool { return true }

func (r *keyOrderRecorder) Publish(ctx context.Context, batch []outbox.Delivery) []error {
	r.mu.Lock()
	r.calls = append(r.calls, slices.Clone(batch))
	fail := r.fail
	r.mu.Unlock()
	errs := make([]error, len(batch))
	failed := map[string]bool{}
	var sent []outbox.Delivery
	for i, d := range batch {
		switch {
		case d.PartitionKey != "" && failed[d.PartitionKey]:
			errs[i] = errors.New("not sent: an earlier message of its key failed")
			continue
		case fail != nil:
			errs[i] = fail(d)
		}
		if errs[i] != nil {
			if d.PartitionKey != "" {
				failed[d.PartitionKey] = true
			}
			continue
		}
		sent = append(sent, d)
	}
	r.recorder.mu.Lock()
	r.recorder.fail = nil // applied above
	r.recorder.mu.Unlock()
	r.recorder.Publish(ctx, sent)
	r.recorder.setFail(fail)
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
	lp, err := New(b.store, tr, Options{ConnString: b.dsn, Scope: outbox.Scope{Namespace: "orders"}, Slot: "runs_slot", Ordered: true, Logger: quiet})
	require.NoError(t, err)
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
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- poller.Run(ctx) }()
	b.waitDelivered(t, "every row is delivered", ids)
	cancel()
	require.NoError(t, <-done)

	// What reached the broker, per key, is in enqueue order, each row once.
	got := map[string][]string{}
	for _, d := range b.tr.deliveries() {
		got[d.PartitionKey] = append(got[d.PartitionKey], string(d.Payload))
	}
	require.Equal(t, []string{`{"n":0}`, `{"n":2}`, `{"n":4}`, `{"n":6}`}, got["a"])
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
	p := b.publisher(t, Options{Slot: "waive_slot", RetryPolicy: outbox.RetryPolicy{BaseDelay: time.Minute, MaxDelay: time.Minute}})
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

// killAt makes p's session end as a crash would at point, the first time it reaches point
// once ready holds, and returns a channel closed then. Before the crash it lets the server
// hear of whatever position is confirmed at that point: it must not pass what is unsettled.
func killAt(t *testing.T, b *bundle, p *Publisher, point string, ready func() bool) <-chan struct{} {
	var once sync.Once
	killed := make(chan struct{})
	p.kill = func(at string) bool {
		hit := false
		if at == point && ready() {
			once.Do(func() {
				n := p.statuses.Load()
				b.wait(t, "two status updates", func() bool { return p.statuses.Load() >= n+2 })
				hit = true
				close(killed)
			})
		}
		return hit
	}
	return killed
}
