package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
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

// relayStore is one migrated database of a relay test and its store.
type relayStore struct {
	name    string
	backend string
	db      *sql.DB
	store   *outbox.Store
	dialect *countingDialect // counts claims, when asked for
}

// newRelayStore opens a fresh database of backend, migrates it and returns its store.
func newRelayStore(t *testing.T, name, backend string, counting bool) *relayStore {
	t.Helper()
	db := testdb.Open(t, backend)
	if backend == "sqlite" {
		db.SetMaxOpenConns(4)
	}
	require.NoError(t, migrations.Up(context.Background(), db, backend, migrations.Options{}))
	rs := &relayStore{name: name, backend: backend, db: db}
	var d outbox.Dialect = pubDialect(backend)
	if counting {
		rs.dialect = &countingDialect{Dialect: d}
		d = rs.dialect
	}
	s, err := outbox.New(db, d, outbox.Options{})
	require.NoError(t, err)
	rs.store = s
	return rs
}

// enqueue commits n events of topic rs.name in one transaction and returns their ids.
func (rs *relayStore) enqueue(t require.TestingT, ns string, n int) []uuid.UUID {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Namespace: ns, Topic: rs.name, Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))}
	}
	res, err := rs.store.EnqueueStandalone(context.Background(), msgs...)
	require.NoError(t, err)
	ids := make([]uuid.UUID, n)
	for i, r := range res {
		ids[i] = r.ID
	}
	return ids
}

// relayRecorder is one transport shared by every store of a relay. It records deliveries
// per id, fails a share of messages as a transient broker error would, and records any id
// handed to it while an earlier publish of the same id had not returned (two owners).
type relayRecorder struct {
	mu        sync.Mutex
	inflight  map[uuid.UUID]bool
	delivered map[uuid.UUID]time.Time // first delivery
	published map[string]time.Time    // last publish start per topic (store)
	overlaps  []uuid.UUID
	failRate  float64
	delay     time.Duration
	count     atomic.Int64
}

func newRelayRecorder(failRate float64, delay time.Duration) *relayRecorder {
	return &relayRecorder{inflight: map[uuid.UUID]bool{}, delivered: map[uuid.UUID]time.Time{},
		published: map[string]time.Time{}, failRate: failRate, delay: delay}
}

func (r *relayRecorder) Publish(ctx context.Context, batch []outbox.Delivery) []error {
	now := time.Now()
	r.mu.Lock()
	for _, d := range batch {
		if r.inflight[d.ID] {
			r.overlaps = append(r.overlaps, d.ID)
		}
		r.inflight[d.ID] = true
		r.published[d.Topic] = now
	}
	r.mu.Unlock()
	if r.delay > 0 {
		time.Sleep(r.delay)
	} else {
		time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
	}
	errs := make([]error, len(batch))
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, d := range batch {
		delete(r.inflight, d.ID)
		if r.failRate > 0 && rand.Float64() < r.failRate {
			errs[i] = errors.New("broker hiccup")
			continue
		}
		if _, ok := r.delivered[d.ID]; !ok {
			r.delivered[d.ID] = time.Now()
		}
		r.count.Add(1)
	}
	return errs
}

// missing returns the ids of want not delivered yet.
func (r *relayRecorder) missing(want []uuid.UUID) []uuid.UUID {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []uuid.UUID
	for _, id := range want {
		if _, ok := r.delivered[id]; !ok {
			out = append(out, id)
		}
	}
	return out
}

func (r *relayRecorder) lastPublish(topic string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.published[topic]
}

func (r *relayRecorder) twoOwners() []uuid.UUID {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.overlaps)
}

// waitDelivered polls until every id of want was delivered.
func (r *relayRecorder) waitDelivered(t *testing.T, want []uuid.UUID, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		miss := r.missing(want)
		if len(miss) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events not delivered within %s (first %s)", len(miss), len(want), within, miss[0])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// relayOptions are quick relay settings for tests.
func relayOptions(t *testing.T, ns string) outbox.RelayOptions {
	o := fastOptions(t, ns)
	o.SweepInterval = time.Second
	// Failed deliveries are the point of some tests; only errors reach the test log.
	o.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
	return outbox.RelayOptions{Publisher: o, MaxInFlight: 8, IdleProbesPerSecond: 200, DownBackoffMax: time.Second}
}

// runRelay runs r until the test ends (or stop is called) and checks that Run returned nil.
func runRelay(t *testing.T, r *outbox.Relay) (stop func()) {
	t.Helper()
	return runUntilStopped(t, "Relay.Run", r.Run)
}

// countStatus returns how many rows of rs's table have status.
func (rs *relayStore) countStatus(t require.TestingT, status outbox.Status) int {
	var n int
	require.NoError(t, rs.db.QueryRow(testdb.Rebind(rs.backend, `SELECT COUNT(*) FROM outbox_events WHERE status = ?`), string(status)).Scan(&n))
	return n
}

// TestRelayAddRemove: stores added and removed while the relay runs lose nothing. A
// removed store's rows are not published once Remove has returned, and are delivered after
// the store is added back.
func TestRelayAddRemove(t *testing.T) {
	t.Parallel()
	backends := []string{"sqlite", "sqlite", "sqlite", "sqlite", "postgres", "mysql"}
	stores := make([]*relayStore, len(backends))
	var wg sync.WaitGroup
	for i, b := range backends {
		wg.Go(func() { stores[i] = newRelayStore(t, fmt.Sprintf("s%d-%s", i, b), b, false) })
	}
	wg.Wait()

	rec := newRelayRecorder(0.1, 2*time.Millisecond)
	relay, err := outbox.NewRelay(rec, relayOptions(t, "addrm"))
	require.NoError(t, err)
	for _, rs := range stores[:3] {
		require.NoError(t, relay.Add(rs.name, rs.store))
	}
	runRelay(t, relay)

	var ids []uuid.UUID
	for _, rs := range stores {
		ids = append(ids, rs.enqueue(t, "addrm", 300)...)
	}
	// Add the others while the first three drain.
	for _, rs := range stores[3:] {
		require.NoError(t, relay.Add(rs.name, rs.store))
	}
	// Remove two stores mid-drain; nothing of theirs is published after Remove returns.
	for _, rs := range []*relayStore{stores[0], stores[4]} {
		deadline := time.Now().Add(30 * time.Second)
		for rec.lastPublish(rs.name).IsZero() {
			require.True(t, time.Now().Before(deadline), "store %s never published", rs.name)
			time.Sleep(5 * time.Millisecond)
		}
		require.NoError(t, relay.Remove(rs.name))
		removed := time.Now()
		rs.enqueue(t, "addrm", 5) // while removed: stays pending
		time.Sleep(300 * time.Millisecond)
		require.True(t, rec.lastPublish(rs.name).Before(removed), "store %s published after Remove returned", rs.name)
		require.Zero(t, rs.countStatus(t, outbox.StatusProcessing), "Remove returned with batches of %s in flight", rs.name)
		_, ok := relay.Stats().Stores[rs.name]
		require.False(t, ok)
	}
	// Back, under their names: everything is delivered.
	require.NoError(t, relay.Add(stores[0].name, stores[0].store))
	require.NoError(t, relay.Add(stores[4].name, stores[4].store))
	rec.waitDelivered(t, ids, time.Minute)
	for _, rs := range stores {
		deadline := time.Now().Add(30 * time.Second)
		for rs.countStatus(t, outbox.StatusDelivered) != 300+map[bool]int{true: 5}[rs == stores[0] || rs == stores[4]] {
			require.True(t, time.Now().Before(deadline), "store %s: not every row delivered", rs.name)
			time.Sleep(20 * time.Millisecond)
		}
	}
	require.Empty(t, rec.twoOwners())
	// Each store's figures tell its wake-up listener's state: PostgreSQL's LISTEN is connected.
	testdb.Poll(t, 10*time.Second, "the PostgreSQL store's listener connected", func() bool {
		return relay.Stats().Stores[stores[4].name].Listener == outbox.ListenerConnected
	})
}

// TestRelayAPI: the relay's errors, and no goroutine outlives Run. Not parallel: goleak
// inspects every goroutine of the process.
func TestRelayAPI(t *testing.T) {
	rec := newRelayRecorder(0, 0)

	for _, bad := range []outbox.RelayOptions{
		{}, // no namespace
		{Publisher: outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "x"}}, MaxInFlight: -1},
		{Publisher: outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "x"}}, IdleProbesPerSecond: -2},
		{Publisher: outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "x"}}, DownBackoffMax: -time.Second},
		{Publisher: outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "x"}, BatchSize: -1}},
	} {
		_, err := outbox.NewRelay(rec, bad)
		var ve *outbox.ValidationError
		require.ErrorAs(t, err, &ve, "%+v", bad)
	}
	_, err := outbox.NewRelay(nil, relayOptions(t, "api"))
	var ve *outbox.ValidationError
	require.ErrorAs(t, err, &ve)

	a := newRelayStore(t, "a", "sqlite", false)
	b := newRelayStore(t, "b", "sqlite", false)
	leaks := goleakBaseline() // the pools' goroutines are not the relay's
	relay, err := outbox.NewRelay(rec, relayOptions(t, "api"))
	require.NoError(t, err)
	require.NoError(t, relay.Add("a", a.store))
	require.ErrorIs(t, relay.Add("a", b.store), outbox.ErrStoreExists)
	require.ErrorAs(t, relay.Add("", b.store), &ve)
	require.ErrorAs(t, relay.Add("b", nil), &ve)
	require.ErrorAs(t, relay.Add("b", b.store, outbox.PublisherOptions{}), &ve) // no namespace
	require.ErrorIs(t, relay.Remove("nope"), outbox.ErrUnknownStore)

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- relay.Run(ctx) }()
	ids := a.enqueue(t, "api", 3)
	rec.waitDelivered(t, ids, 10*time.Second)
	require.NoError(t, relay.Add("b", b.store, fastOptions(t, "api-b")))
	ids = b.enqueue(t, "api-b", 3)
	rec.waitDelivered(t, ids, 10*time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for relay.Run(ctx) != outbox.ErrRelayRunning { // Run has started
		require.True(t, time.Now().Before(deadline))
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, relay.Remove("b"))
	require.ErrorIs(t, relay.Remove("b"), outbox.ErrUnknownStore)
	cancel()
	select {
	case err := <-errc:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
	st := relay.Stats() // once Run returned, so that every settle is counted
	require.EqualValues(t, 6, st.Total.Delivered, "the removed store's counts stay in Total")
	require.EqualValues(t, 3, st.Stores["a"].Delivered)
	goleak.VerifyNone(t, leaks...)
}

// sharedCountingDialect counts the claims of many stores in one counter.
type sharedCountingDialect struct {
	outbox.Dialect
	claims *atomic.Int64
}

func (d *sharedCountingDialect) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]outbox.Record, error) {
	d.claims.Add(1)
	return d.Dialect.Claim(ctx, db, t, p)
}

// TestRelayMisconfiguredStore: a store whose table was never migrated fails its check; the
// relay reports it misconfigured while the other store delivers, and serves it once the
// table exists.
func TestRelayMisconfiguredStore(t *testing.T) {
	t.Parallel()
	good := newRelayStore(t, "good", "sqlite", false)
	db := testdb.SQLite(t) // no migrations
	bad, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	require.NoError(t, err)
	rec := newRelayRecorder(0, 0)
	o := relayOptions(t, "misc")
	o.DownBackoffMax = 200 * time.Millisecond
	relay, err := outbox.NewRelay(rec, o)
	require.NoError(t, err)
	require.NoError(t, relay.Add("good", good.store))
	require.NoError(t, relay.Add("bad", bad))
	runRelay(t, relay)
	rec.waitDelivered(t, good.enqueue(t, "misc", 5), 10*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for relay.Stats().Stores["bad"].State != outbox.StoreMisconfigured {
		require.True(t, time.Now().Before(deadline), "state %s", relay.Stats().Stores["bad"].State)
		time.Sleep(10 * time.Millisecond)
	}
	require.NotEmpty(t, relay.Stats().Stores["bad"].LastError)

	require.NoError(t, migrations.Up(context.Background(), db, "sqlite", migrations.Options{}))
	fixed := &relayStore{name: "bad", store: bad}
	rec.waitDelivered(t, fixed.enqueue(t, "misc", 3), 10*time.Second)
	require.Equal(t, outbox.StoreHealthy, relay.Stats().Stores["bad"].State)
}

// TestRelaySharedCircuit: the stores of a relay share its transport, so they share one
// circuit breaker. While the destination is down the whole relay makes about one probe
// claim per probe interval, not one per store; once it is back every event is delivered,
// none dead and none charged an attempt for the outage.
func TestRelaySharedCircuit(t *testing.T) {
	t.Parallel()
	const stores, per = 5, 40
	var down atomic.Bool
	down.Store(true)
	var delivered atomic.Int64
	tr := outbox.TransportFunc(func(ctx context.Context, batch []outbox.Delivery) []error {
		errs := make([]error, len(batch))
		for i := range batch {
			if down.Load() {
				errs[i] = outbox.Unavailable(errors.New("broker away"))
			} else {
				delivered.Add(1)
			}
		}
		return errs
	})
	o := relayOptions(t, "circ")
	o.Publisher.Circuit = outbox.CircuitOptions{ProbeMin: 200 * time.Millisecond, ProbeMax: 200 * time.Millisecond}
	o.Publisher.Retry = outbox.RetryPolicy{BaseDelay: 10 * time.Millisecond, MaxDelay: 10 * time.Millisecond, MaxAttempts: 3}
	relay, err := outbox.NewRelay(tr, o)
	require.NoError(t, err)
	var claims atomic.Int64
	var all []*relayStore
	for i := range stores {
		db := testdb.Open(t, "sqlite")
		require.NoError(t, migrations.Up(context.Background(), db, "sqlite", migrations.Options{}))
		s, err := outbox.New(db, &sharedCountingDialect{Dialect: outbox.SQLite(), claims: &claims}, outbox.Options{})
		require.NoError(t, err)
		rs := &relayStore{name: fmt.Sprintf("s%d", i), backend: "sqlite", db: db, store: s}
		rs.enqueue(t, "circ", per)
		all = append(all, rs)
		require.NoError(t, relay.Add(rs.name, s))
	}
	runRelay(t, relay)
	deadline := time.Now().Add(30 * time.Second)
	for !relay.Stats().Total.CircuitOpen {
		require.True(t, time.Now().Before(deadline), "the circuit did not open")
		time.Sleep(10 * time.Millisecond)
	}
	const window = 2 * time.Second
	before, t0 := claims.Load(), time.Now()
	time.Sleep(window) // a measurement window: claims are counted over it
	n, took := claims.Load()-before, time.Since(t0)
	t.Logf("%d stores, destination down: %d claims in %s (probe interval 200 ms)", stores, n, took.Round(time.Millisecond))
	require.LessOrEqual(t, n, int64(took/(200*time.Millisecond))+2, "one probe per interval for the whole relay")

	down.Store(false)
	deadline = time.Now().Add(30 * time.Second)
	for delivered.Load() < stores*per {
		require.True(t, time.Now().Before(deadline), "delivered %d of %d after the destination returned", delivered.Load(), stores*per)
		time.Sleep(10 * time.Millisecond)
	}
	for _, rs := range all {
		require.Zero(t, rs.countStatus(t, outbox.StatusDead), "store %s", rs.name)
		var maxAttempts int
		require.NoError(t, rs.db.QueryRow(`SELECT COALESCE(MAX(attempts), 0) FROM outbox_events`).Scan(&maxAttempts))
		require.LessOrEqual(t, maxAttempts, 1, "store %s: attempts charged for the outage", rs.name)
	}
}
