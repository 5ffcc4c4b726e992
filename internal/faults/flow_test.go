package faults

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

// The flow: producers commit business transactions (a row in orders and its event in the
// outbox, one in five rolled back on purpose) while publishers deliver, and a fault is
// injected in the middle. Each commit's outcome is tracked; a commit whose call failed is
// resolved against the tables afterwards.

const flowNamespace = "faults"

// flowOptions shape a flow.
type flowOptions struct {
	producers  int
	publishers int
	// publisher options; Scope, WorkerID and Logger are set by the flow.
	pub outbox.PublisherOptions
	// failRate is the share of transport deliveries that fail (0..1).
	failRate float64
	// logs receives the publishers' logs when set; they are discarded otherwise.
	logs *logCapture
	// producerPools is how many pools the producers share out (roles producer0, producer1,
	// ...); 0 or 1 is one pool (role producer).
	producerPools int
}

func defaultFlowOptions() flowOptions {
	return flowOptions{
		producers:  3,
		publishers: 2,
		pub: outbox.PublisherOptions{
			BatchSize:      20,
			Concurrency:    2,
			PollInterval:   20 * time.Millisecond,
			IdleBackoffMax: time.Second,
			Lease:          2 * time.Second,
			Retry:          outbox.RetryPolicy{BaseDelay: 10 * time.Millisecond, MaxDelay: 200 * time.Millisecond, MaxAttempts: 100},
			SweepInterval:  time.Second,
		},
	}
}

// outcome is what a producer knows about one business transaction.
type outcome int

const (
	committed  outcome = iota // Commit returned nil
	rolledBack                // rolled back on purpose after the event was enqueued
	aborted                   // failed before Commit was called: never committed
	unknown                   // Commit returned an error: committed or not
)

type produced struct {
	id  uuid.UUID // uuid.Nil when Enqueue did not return
	out outcome
}

// flow is one running scenario on one database.
type flow struct {
	t       *testing.T
	backend string                      // "postgres" or "mysql"
	dsn     func(db, app string) string // a DSN for database db with application name app
	dbName  string
	app     string // application_name prefix of every pool the flow opens (PostgreSQL)
	opts    flowOptions
	rec     *recorder
	pubs    []*outbox.Publisher
	pools   []*sql.DB // producers' pool first, then one per publisher
	runErrs chan error

	// lossy accepts committed events that the database lost (a promoted asynchronous
	// standby): they are counted, not failed on.
	lossy bool

	mu      sync.Mutex
	keys    map[string]produced
	commits []time.Time       // when each successful Commit returned, in order
	aborts  map[string]string // step -> the first error that aborted a transaction there

	stopProducers context.CancelFunc
	producersDone sync.WaitGroup
	stopPubs      context.CancelFunc
	pubsDone      sync.WaitGroup
	commitErrors  atomic.Int64
	// conflicts counts the business transactions the database rolled back with MySQL
	// error 1213: at the business row's INSERT, at Enqueue (outbox.ErrRetryTransaction) and
	// at Commit.
	insertConflicts, enqueueConflicts, commitConflicts atomic.Int64
}

// newFlow migrates a fresh database on srv and creates the business table.
func newFlow(t *testing.T, srv *server, opts flowOptions) *flow {
	t.Helper()
	return newFlowOn(t, srv.backend, srv.createDatabase(t), srv.dsn, opts)
}

// newFlowOn migrates database dbName, reached through dsn, and creates the business table.
func newFlowOn(t *testing.T, backend, dbName string, dsn func(db, app string) string, opts flowOptions) *flow {
	t.Helper()
	f := &flow{
		t: t, backend: backend, dsn: dsn, opts: opts, rec: newRecorder(opts.failRate),
		dbName: dbName, keys: map[string]produced{},
		app: fmt.Sprintf("outbox_faults_%d", rand.Uint32()),
	}
	db := f.open("setup")
	defer db.Close()
	ctx := context.Background()
	require.NoError(t, migrations.Up(ctx, db, backend, migrations.Options{}))
	_, err := db.ExecContext(ctx, `CREATE TABLE orders (order_key VARCHAR(64) PRIMARY KEY)`)
	require.NoError(t, err)
	return f
}

// open opens a pool on the flow's database whose PostgreSQL application_name is
// f.app + "_" + role.
func (f *flow) open(role string) *sql.DB {
	driver := "mysql"
	if f.backend == "postgres" {
		driver = "pgx"
	}
	db, err := sql.Open(driver, f.dsn(f.dbName, f.app+"_"+role))
	require.NoError(f.t, err)
	return db
}

func (f *flow) dialect() outbox.Dialect {
	if f.backend == "postgres" {
		return outbox.Postgres()
	}
	return outbox.MySQL()
}

// start starts the producers and the publishers.
func (f *flow) start() {
	t := f.t
	var prodDBs []*sql.DB
	var stores []*outbox.Store
	for i := range max(f.opts.producerPools, 1) {
		role := "producer"
		if f.opts.producerPools > 1 {
			role = fmt.Sprintf("producer%d", i)
		}
		db := f.open(role)
		db.SetMaxOpenConns(f.opts.producers + 1)
		f.pools = append(f.pools, db)
		store, err := outbox.New(db, f.dialect(), outbox.Options{})
		require.NoError(t, err)
		prodDBs, stores = append(prodDBs, db), append(stores, store)
	}

	pctx, stop := context.WithCancel(context.Background())
	f.stopProducers = stop
	for i := range f.opts.producers {
		f.producersDone.Add(1)
		go f.produce(pctx, stores[i%len(stores)], prodDBs[i%len(prodDBs)], i)
	}

	ctx, stopPubs := context.WithCancel(context.Background())
	f.stopPubs = stopPubs
	f.runErrs = make(chan error, f.opts.publishers)
	for i := range f.opts.publishers {
		db := f.open(fmt.Sprintf("pub%d", i))
		f.pools = append(f.pools, db)
		s, err := outbox.New(db, f.dialect(), outbox.Options{})
		require.NoError(t, err)
		o := f.opts.pub
		o.Scope = outbox.Scope{Namespace: flowNamespace}
		o.WorkerID = fmt.Sprintf("pub%d", i)
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		if f.opts.logs != nil {
			o.Logger = slog.New(f.opts.logs)
		}
		p, err := outbox.NewPublisher(s, f.rec.transport(o.WorkerID), o)
		require.NoError(t, err)
		f.pubs = append(f.pubs, p)
		f.pubsDone.Add(1)
		go func() {
			defer f.pubsDone.Done()
			defer func() {
				if r := recover(); r != nil {
					f.runErrs <- fmt.Errorf("%s: Run panicked: %v", o.WorkerID, r)
				}
			}()
			err := p.Run(ctx)
			if ctx.Err() == nil {
				err = fmt.Errorf("%s: Run returned before it was stopped: %v", o.WorkerID, err)
			}
			if err != nil {
				f.runErrs <- err
			}
		}()
	}
	t.Cleanup(f.stop)
}

// produce commits business transactions until ctx ends.
func (f *flow) produce(ctx context.Context, store *outbox.Store, db *sql.DB, n int) {
	defer f.producersDone.Done()
	insert := `INSERT INTO orders (order_key) VALUES (?)`
	if f.backend == "postgres" {
		insert = `INSERT INTO orders (order_key) VALUES ($1)`
	}
	for seq := 0; ctx.Err() == nil; seq++ {
		key := fmt.Sprintf("p%d-%d", n, seq)
		p := f.transaction(store, db, insert, key, seq%5 == 4)
		f.mu.Lock()
		f.keys[key] = p
		if p.out == committed {
			f.commits = append(f.commits, time.Now())
		}
		f.mu.Unlock()
		pause := time.Duration(2+rand.IntN(4)) * time.Millisecond
		if p.out == aborted || p.out == unknown {
			pause = 50 * time.Millisecond // the database is away: do not spin
		}
		time.Sleep(pause)
	}
}

// transaction runs one business transaction: an order and its event. It uses a context
// that is never cancelled, so that every outcome comes from the database.
func (f *flow) transaction(store *outbox.Store, db *sql.DB, insert, key string, rollback bool) produced {
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		f.noteAbort("begin", err)
		return produced{out: aborted}
	}
	if _, err := tx.ExecContext(ctx, insert, key); err != nil {
		f.noteAbort("insert", err)
		if me := (*mysql.MySQLError)(nil); errors.As(err, &me) && me.Number == 1213 {
			f.insertConflicts.Add(1)
		}
		_ = tx.Rollback()
		return produced{out: aborted}
	}
	res, err := store.Enqueue(ctx, tx, outbox.Message{
		Namespace: flowNamespace, Topic: "order.created", PartitionKey: key,
		Headers: outbox.Headers{"key": key},
		Payload: []byte(fmt.Sprintf(`{"order":%q}`, key)),
	})
	if err != nil {
		f.noteAbort("enqueue", err)
		if errors.Is(err, outbox.ErrRetryTransaction) {
			f.enqueueConflicts.Add(1)
		}
		_ = tx.Rollback()
		return produced{out: aborted}
	}
	if rollback {
		if err := tx.Rollback(); err != nil {
			f.noteAbort("rollback", err)
			// A failed rollback still commits nothing: the server drops the transaction
			// with the connection.
			return produced{id: res.ID, out: aborted}
		}
		return produced{id: res.ID, out: rolledBack}
	}
	if err := tx.Commit(); err != nil {
		f.commitErrors.Add(1)
		if me := (*mysql.MySQLError)(nil); errors.As(err, &me) && me.Number == 1213 {
			f.commitConflicts.Add(1)
		}
		return produced{id: res.ID, out: unknown}
	}
	return produced{id: res.ID, out: committed}
}

// noteAbort remembers the first error that aborted a business transaction at step, for
// the test's log.
func (f *flow) noteAbort(step string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.aborts == nil {
		f.aborts = map[string]string{}
	}
	if _, ok := f.aborts[step]; !ok {
		f.aborts[step] = err.Error()
	}
}

// delivered returns how many messages the transport delivered.
func (f *flow) delivered() int {
	f.rec.mu.Lock()
	defer f.rec.mu.Unlock()
	return len(f.rec.delivered)
}

// waitDelivered waits until n distinct messages have been delivered.
func (f *flow) waitDelivered(n int, within time.Duration) {
	f.t.Helper()
	deadline := time.Now().Add(within)
	for f.delivered() < n {
		f.checkRunning()
		if time.Now().After(deadline) {
			f.t.Fatalf("only %d messages delivered after %s, want %d", f.delivered(), within, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkRunning fails the test if a publisher's Run returned or panicked.
func (f *flow) checkRunning() {
	f.t.Helper()
	select {
	case err := <-f.runErrs:
		f.t.Fatal(err)
	default:
	}
}

// stop stops producers and publishers and closes the pools; it is safe to call twice.
func (f *flow) stop() {
	if f.stopProducers == nil {
		return
	}
	f.stopProducers()
	f.producersDone.Wait()
	f.stopPubs()
	done := make(chan struct{})
	go func() { f.pubsDone.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		f.t.Error("publishers did not stop within 60s")
	}
	for _, db := range f.pools {
		_ = db.Close()
	}
	f.stopProducers = nil
}

// report is what a flow measured.
type report struct {
	transactions, committed, rolledBack, aborted, unknown, unknownCommitted int
	messages, deliveries, redeliveries                                      int
	// lost counts committed events the database no longer has, and phantoms the events
	// delivered that it no longer has; both stay 0 unless the flow is lossy.
	lost, phantoms int
	// lostClaims counts claims whose rows never reached the transport (the claim committed
	// but its answer was lost, or the owner failed before publishing); they are claimed
	// again once their lease expires.
	lostClaims          int
	overlaps, sameClaim int
	stats               outbox.PublisherStats
}

func (r report) String() string {
	return fmt.Sprintf("transactions=%d committed=%d rolled_back=%d aborted=%d commit_unknown=%d (committed after all: %d) "+
		"messages=%d deliveries=%d redeliveries=%d lost=%d phantoms=%d lost_claims=%d double_ownership=%d same_claim_twice=%d publisher_errors=%d lease_lost=%d",
		r.transactions, r.committed, r.rolledBack, r.aborted, r.unknown, r.unknownCommitted,
		r.messages, r.deliveries, r.redeliveries, r.lost, r.phantoms, r.lostClaims, r.overlaps, r.sameClaim, r.stats.Errors, r.stats.LeaseLost)
}

// finish stops the producers, waits for every committed event to be delivered, stops the
// publishers, and checks the guarantees: every committed event delivered, nothing else
// delivered, no message in flight at two owners at once, and the business rows and events
// committed together.
func (f *flow) finish(within time.Duration) report {
	t := f.t
	t.Helper()
	f.stopProducers()
	f.producersDone.Wait()
	f.checkRunning()

	check := f.open("check")
	defer check.Close()
	store, err := outbox.New(check, f.dialect(), outbox.Options{})
	require.NoError(t, err)
	ctx := context.Background()

	// Resolve the commits whose outcome is unknown, and cross-check every outcome against
	// both tables.
	f.mu.Lock()
	keys := make(map[string]produced, len(f.keys))
	for k, p := range f.keys {
		keys[k] = p
	}
	f.mu.Unlock()
	var rep report
	expected := map[uuid.UUID]string{}
	orderQ := `SELECT COUNT(*) FROM orders WHERE order_key = ?`
	if f.backend == "postgres" {
		orderQ = `SELECT COUNT(*) FROM orders WHERE order_key = $1`
	}
	for key, p := range keys {
		rep.transactions++
		var orders int
		require.NoError(t, check.QueryRowContext(ctx, orderQ, key).Scan(&orders))
		stored := false
		if p.id != uuid.Nil {
			_, err := store.Get(ctx, p.id)
			if err != nil && !errors.Is(err, outbox.ErrNotFound) {
				t.Fatalf("get %s: %v", p.id, err)
			}
			stored = err == nil
		}
		require.Equal(t, stored, orders == 1, "%s: order row and event disagree (event stored %v, orders %d)", key, stored, orders)
		switch p.out {
		case committed:
			rep.committed++
			if !stored && f.lossy {
				rep.lost++
				continue
			}
			require.True(t, stored, "%s: committed but its event is not in the table", key)
			expected[p.id] = key
		case rolledBack:
			rep.rolledBack++
			require.False(t, stored, "%s: rolled back but its event is in the table", key)
		case aborted:
			rep.aborted++
			require.False(t, stored, "%s: never committed but its event is in the table", key)
		case unknown:
			rep.unknown++
			if stored {
				rep.unknownCommitted++
				expected[p.id] = key
			}
		}
	}

	// Wait for every committed event.
	deadline := time.Now().Add(within)
	for {
		f.checkRunning()
		missing := 0
		f.rec.mu.Lock()
		for id := range expected {
			if f.rec.delivered[id] == 0 {
				missing++
			}
		}
		f.rec.mu.Unlock()
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d committed events not delivered within %s", missing, len(expected), within)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Every row settled as delivered: none dead, none left pending.
	deadline = time.Now().Add(within)
	for {
		var notDelivered int
		require.NoError(t, check.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox_events WHERE namespace = '`+flowNamespace+`' AND status <> 'delivered'`).Scan(&notDelivered))
		if notDelivered == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows not delivered in the table within %s", notDelivered, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var rows int
	require.NoError(t, check.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox_events WHERE namespace = '`+flowNamespace+`'`).Scan(&rows))
	require.Equal(t, len(expected), rows, "rows in the outbox table")
	f.checkRunning()
	f.stop()
	select {
	case err := <-f.runErrs:
		t.Fatal(err)
	default:
	}

	f.rec.mu.Lock()
	defer f.rec.mu.Unlock()
	for id, n := range f.rec.delivered {
		key, ok := expected[id]
		if !ok && f.lossy {
			rep.phantoms++
			continue
		}
		require.True(t, ok, "delivered %s (%s), which was never committed", id, f.rec.keys[id])
		require.Equal(t, key, f.rec.keys[id])
		rep.deliveries += n
		rep.redeliveries += n - 1
	}
	for _, attempts := range f.rec.claims {
		highest := 0
		for a := range attempts {
			highest = max(highest, a)
		}
		rep.lostClaims += highest - len(attempts)
	}
	rep.messages = len(expected)
	rep.overlaps = len(f.rec.overlaps)
	rep.sameClaim = len(f.rec.sameClaim)
	for _, p := range f.pubs {
		s := p.Stats()
		rep.stats.Errors += s.Errors
		rep.stats.LeaseLost += s.LeaseLost
		rep.stats.Delivered += s.Delivered
	}
	if f.lossy {
		// A claim the database lost is handed out again, with the same attempt number.
		return rep
	}
	require.Empty(t, f.rec.overlaps[:min(len(f.rec.overlaps), 10)], "a message was in flight at two owners at once (%d times)", len(f.rec.overlaps))
	require.Empty(t, f.rec.sameClaim[:min(len(f.rec.sameClaim), 10)], "one claim (id, attempt) was handed out twice (%d times)", len(f.rec.sameClaim))
	return rep
}

// resumeAfter returns how long after since the first publish (by any publisher) and the
// last publisher's first publish came; ok is false when some publisher did not publish.
func (f *flow) resumeAfter(since time.Time) (first, all time.Duration, ok bool) {
	f.rec.mu.Lock()
	defer f.rec.mu.Unlock()
	first = -1
	for _, p := range f.pubs {
		times := f.rec.publishes[p.WorkerID()]
		i := sort.Search(len(times), func(i int) bool { return !times[i].Before(since) })
		if i == len(times) {
			return 0, 0, false
		}
		d := times[i].Sub(since)
		if first < 0 || d < first {
			first = d
		}
		all = max(all, d)
	}
	return first, all, true
}

// waitResumed waits until every publisher has published after since, and returns how long
// after since the first and the last of them did.
func (f *flow) waitResumed(since time.Time, within time.Duration) (first, all time.Duration) {
	f.t.Helper()
	deadline := time.Now().Add(within)
	for {
		f.checkRunning()
		if first, all, ok := f.resumeAfter(since); ok {
			return first, all
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("delivery did not resume at every publisher within %s", within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// recorder is the flows' transport: it records every delivery and checks that no message
// is in flight at two publishers at once and that no claim, (id, attempt), is handed out
// twice.
type recorder struct {
	failRate float64

	mu        sync.Mutex
	inflight  map[uuid.UUID]string       // id -> publisher holding it in a publish call
	claims    map[uuid.UUID]map[int]bool // id -> attempts seen
	delivered map[uuid.UUID]int          // successful publishes per id
	keys      map[uuid.UUID]string
	publishes map[string][]time.Time // publisher -> start of each publish call, in order
	overlaps  []string
	sameClaim []string
}

func newRecorder(failRate float64) *recorder {
	return &recorder{failRate: failRate, inflight: map[uuid.UUID]string{}, claims: map[uuid.UUID]map[int]bool{},
		delivered: map[uuid.UUID]int{}, keys: map[uuid.UUID]string{}, publishes: map[string][]time.Time{}}
}

func (r *recorder) transport(name string) outbox.Transport {
	return outbox.TransportFunc(func(ctx context.Context, batch []outbox.Delivery) []error {
		r.mu.Lock()
		r.publishes[name] = append(r.publishes[name], time.Now())
		for _, d := range batch {
			if other, ok := r.inflight[d.ID]; ok {
				r.overlaps = append(r.overlaps, fmt.Sprintf("%s in flight at %s and %s", d.ID, other, name))
			}
			r.inflight[d.ID] = name
			if r.claims[d.ID] == nil {
				r.claims[d.ID] = map[int]bool{}
			}
			if r.claims[d.ID][d.Attempt] {
				r.sameClaim = append(r.sameClaim, fmt.Sprintf("%s attempt %d delivered twice (%s)", d.ID, d.Attempt, name))
			}
			r.claims[d.ID][d.Attempt] = true
			r.keys[d.ID] = d.Headers["key"]
		}
		r.mu.Unlock()
		// Hold the batch briefly so that other publishers claim meanwhile.
		time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
		errs := make([]error, len(batch))
		r.mu.Lock()
		defer r.mu.Unlock()
		for i, d := range batch {
			delete(r.inflight, d.ID)
			if r.failRate > 0 && rand.Float64() < r.failRate {
				errs[i] = errors.New("injected transport failure")
				continue
			}
			r.delivered[d.ID]++
		}
		return errs
	})
}
