//go:build timing

// The tests of this file measure rates, latency or how soon something happens, which the
// race detector's slowdown and a loaded machine distort: make test-timing runs them,
// without the race detector (CI does too).

package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
	"github.com/stretchr/testify/require"
)

// TestRelayManyDatabases: one relay over 100 SQLite files, 10 PostgreSQL schemas and 5
// MariaDB databases, through one transport that fails 20 % of deliveries. Producers commit
// events into every store while the relay runs: every committed event is delivered, no id is
// ever in the transport twice at once, and every row ends delivered.
func TestRelayManyDatabases(t *testing.T) {
	t.Parallel()
	var stores []*relayStore
	var mu sync.Mutex
	var wg sync.WaitGroup
	add := func(backend string, n int) {
		for i := range n {
			wg.Go(func() {
				rs := newRelayStore(t, fmt.Sprintf("%s-%d", backend, i), backend, false)
				mu.Lock()
				stores = append(stores, rs)
				mu.Unlock()
			})
		}
	}
	add("sqlite", 100)
	add("postgres", 10)
	add("mysql", 5)
	wg.Wait()
	require.Len(t, stores, 115)

	rec := newRelayRecorder(0.2, 0)
	relay, err := outbox.NewRelay(rec, relayOptions(t, "many"))
	require.NoError(t, err)
	for _, rs := range stores {
		require.NoError(t, relay.Add(rs.name, rs.store))
	}
	began := time.Now()
	stop := runRelay(t, relay)

	// Producers: three rounds of 1..30 events per store, while the relay runs.
	var ids []uuid.UUID
	var pmu sync.Mutex
	var pwg sync.WaitGroup
	for _, rs := range stores {
		pwg.Go(func() {
			for range 3 {
				got := rs.enqueue(t, "many", 1+rand.IntN(30))
				pmu.Lock()
				ids = append(ids, got...)
				pmu.Unlock()
				time.Sleep(time.Duration(rand.IntN(50)) * time.Millisecond)
			}
		})
	}
	pwg.Wait()
	rec.waitDelivered(t, ids, 2*time.Minute)
	t.Logf("%d events over %d stores delivered in %s; stats total %+v", len(ids), len(stores),
		time.Since(began).Round(time.Millisecond), relay.Stats().Total)
	require.Empty(t, rec.twoOwners(), "ids in flight at two owners at once")
	for _, rs := range stores {
		deadline := time.Now().Add(30 * time.Second)
		for rs.countStatus(t, outbox.StatusPending)+rs.countStatus(t, outbox.StatusProcessing) > 0 {
			require.True(t, time.Now().Before(deadline), "store %s still has rows to settle", rs.name)
			time.Sleep(20 * time.Millisecond)
		}
		require.Zero(t, rs.countStatus(t, outbox.StatusDead), rs.name)
	}
	stop() // a settle the table shows is counted once it returns
	st := relay.Stats()
	require.Len(t, st.Stores, 115)
	require.EqualValues(t, len(ids), st.Total.Delivered)
	require.Positive(t, st.Total.Retried)
	for name, s := range st.Stores {
		require.Equal(t, outbox.StoreHealthy, s.State, name)
	}
}

// TestRelayFairness: while one store drains 100,000 rows, single events committed in ten
// idle stores of the same relay are published within a few batch times, because the
// budget's slots go first come, first served: the busy store queues behind them after each
// batch. OUTBOX_TEST_RELAY_GREEDY=1 runs the same test on a scheduler broken on purpose
// (the busy store keeps its slots), which fails it.
func TestRelayFairness(t *testing.T) {
	if testing.Short() {
		t.Skip("drains 100,000 rows; skipped with -short")
	}
	// Not parallel: it measures latency, and beside the package's other tests on two cores
	// its p99 reached 706 ms (max 1.7 s) where it measures 12-30 ms alone, also with both
	// cores busy with a CPU hog. Sequential tests run before the parallel ones start.
	const backlog = 100_000
	big := newRelayStore(t, "big", "sqlite", false)
	var idle []*relayStore
	for i := range 10 {
		idle = append(idle, newRelayStore(t, fmt.Sprintf("idle-%d", i), "sqlite", false))
	}
	for done := 0; done < backlog; done += 5000 {
		big.enqueue(t, "fair", 5000)
	}

	// A broker that takes 2ms a batch; a batch of 100 then takes a few milliseconds.
	rec := newRelayRecorder(0, 2*time.Millisecond)
	o := relayOptions(t, "fair")
	o.Publisher.BatchSize = 100
	o.MaxInFlight = 2 // the busy store alone could fill it: claim ahead keeps two batches
	relay, err := outbox.NewRelay(rec, o)
	require.NoError(t, err)
	if os.Getenv("OUTBOX_TEST_RELAY_GREEDY") == "1" {
		outbox.MakeRelayGreedy(relay)
	}
	require.NoError(t, relay.Add(big.name, big.store))
	for _, rs := range idle {
		require.NoError(t, relay.Add(rs.name, rs.store))
	}
	began := time.Now()
	runRelay(t, relay)

	// While the backlog drains, commit single events into the idle stores, one at a time.
	type sample struct {
		id        uuid.UUID
		committed time.Time
	}
	var samples []sample
	for i := 0; relay.Stats().Stores["big"].Delivered < backlog*9/10; i++ {
		require.Less(t, time.Since(began), 2*time.Minute, "the backlog did not drain")
		ids := idle[i%len(idle)].enqueue(t, "fair", 1)
		samples = append(samples, sample{ids[0], time.Now()})
		time.Sleep(time.Duration(10+rand.IntN(20)) * time.Millisecond)
	}
	drained := relay.Stats().Stores["big"].Delivered
	elapsed := time.Since(began)
	batchTime := elapsed / time.Duration(drained/100)
	ids := make([]uuid.UUID, len(samples))
	for i, s := range samples {
		ids[i] = s.id
	}
	rec.waitDelivered(t, ids, time.Minute)
	lat := make([]time.Duration, len(samples))
	for i, s := range samples {
		at, _ := rec.deliveredAt(s.id)
		lat[i] = at.Sub(s.committed)
	}
	p50, p99 := percentile(lat, 50), percentile(lat, 99)
	t.Logf("busy store: %d rows in %s (%s a batch of 100); %d single events in idle stores: commit-to-publish p50 %s, p99 %s, max %s",
		drained, elapsed.Round(time.Millisecond), batchTime.Round(time.Microsecond), len(samples),
		p50.Round(time.Microsecond), p99.Round(time.Microsecond), percentile(lat, 100).Round(time.Microsecond))
	require.GreaterOrEqual(t, len(samples), 50, "too few samples to judge")
	// A claim waits for at most one batch of the busy store; the rest is the chase of the
	// commit (a wake-up comes before it, and each retry of the chase queues for a slot) and
	// scheduling on a machine that runs every other test beside this one: measured p99 46 to
	// 51 ms alone, up to 196 ms beside other suites. A greedy scheduler (the busy store keeps
	// its slot while others wait) measured p99 5.18 s, which the bound still fails by ten times.
	bound := max(20*batchTime, 500*time.Millisecond)
	require.LessOrEqual(t, p99, bound, "p99 commit-to-publish in an idle store while another drains")
}

// TestRelayIdleCost: 1,000 idle stores cost at most IdleProbesPerSecond claims a second
// (plus a small slack), not stores × poll rate: as separate publishers, with
// IdleBackoffMax 200ms, they would claim 5,000 times a second. Each store is a SQLite file
// copied from one migrated file. Skipped with -short.
func TestRelayIdleCost(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 1,000 SQLite files; skipped with -short")
	}
	t.Parallel()
	const stores = 1000
	const rate = 50.0
	dir := t.TempDir()
	tmpl := filepath.Join(dir, "template.db")
	db, err := sql.Open("sqlite", testdb.SQLiteDSN(tmpl))
	require.NoError(t, err)
	require.NoError(t, migrations.Up(context.Background(), db, "sqlite", migrations.Options{}))
	_, err = db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	raw, err := os.ReadFile(tmpl)
	require.NoError(t, err)

	var claims atomic.Int64
	o := relayOptions(t, "idle")
	o.Publisher.PollInterval, o.Publisher.IdleBackoffMax = 200*time.Millisecond, 200*time.Millisecond
	o.Publisher.SweepInterval = time.Minute
	o.IdleProbesPerSecond = rate
	rec := newRelayRecorder(0, 0)
	relay, err := outbox.NewRelay(rec, o)
	require.NoError(t, err)
	var first *outbox.Store
	for i := range stores {
		path := filepath.Join(dir, fmt.Sprintf("s%d.db", i))
		require.NoError(t, os.WriteFile(path, raw, 0o600))
		db, err := sql.Open("sqlite", testdb.SQLiteDSN(path))
		require.NoError(t, err)
		db.SetMaxOpenConns(1)
		t.Cleanup(func() { _ = db.Close() })
		s, err := outbox.New(db, &sharedCountingDialect{Dialect: outbox.SQLite(), claims: &claims}, outbox.Options{})
		require.NoError(t, err)
		require.NoError(t, relay.Add(fmt.Sprintf("s%d", i), s))
		if first == nil {
			first = s
		}
	}
	runRelay(t, relay)
	// Every store claims once at start, unpaced; then only probes.
	deadline := time.Now().Add(time.Minute)
	for claims.Load() < stores {
		require.True(t, time.Now().Before(deadline), "stores did not start: %d claims", claims.Load())
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second) // let the first round's backoff pass
	const window = 5 * time.Second
	before, t0 := claims.Load(), time.Now()
	time.Sleep(window)
	n, took := claims.Load()-before, time.Since(t0)
	perSec := float64(n) / took.Seconds()
	t.Logf("%d idle SQLite stores: %d claims in %s = %.1f queries/s (bound %.0f/s; as separate publishers about %d/s)",
		stores, n, took.Round(time.Millisecond), perSec, rate, int(stores/0.2))
	require.LessOrEqual(t, perSec, rate*1.1+1, "idle claims a second")

	// An enqueue on an idle store's own Store still wakes it at once.
	ids := (&relayStore{name: "s0", store: first}).enqueue(t, "idle", 1)
	start := time.Now()
	rec.waitDelivered(t, ids, 10*time.Second)
	t.Logf("an enqueue in one of them published after %s", time.Since(start).Round(time.Millisecond))
	require.Less(t, time.Since(start), 2*time.Second)
}

// TestPublisherClaimsAhead: while a full batch is in a transport that takes a while, the
// loop claims the next one, settling the batch before with that claim: every settle-and-claim
// but the first and the last runs while a batch is in the transport (two batches
// processing). Every message is delivered once.
func TestPublisherClaimsAhead(t *testing.T) {
	t.Parallel()
	const batch, batches = 5, 6
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ids := e.enqueue(t, "ahead", batch*batches)
		d := &aheadProbe{foldingDialect: newFoldingDialect(e.backend), e: e, bg: &goroutineT{}}
		rec := newRecorder(nil)
		inner := rec.transport("p")
		tr := outbox.TransportFunc(func(ctx context.Context, ds []outbox.Delivery) []error {
			time.Sleep(100 * time.Millisecond)
			return inner.Publish(ctx, ds)
		})
		o := fastOptions(t, "ahead")
		o.BatchSize = batch
		p, err := outbox.NewPublisher(e.newStore(t, e.db, d), tr, o)
		require.NoError(t, err)
		stop := start(t, p)
		e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == batch*batches })
		require.Eventually(t, func() bool { return p.Stats().Delivered == batch*batches }, 10*time.Second, 5*time.Millisecond)
		stop()
		d.bg.check(t)
		for _, id := range ids {
			require.Equal(t, []int{1}, rec.seen(id))
		}
		d.mu.Lock()
		seen := slices.Clone(d.seen)
		d.mu.Unlock()
		require.GreaterOrEqual(t, len(seen), batches-1, "the batches were settled with the claims after them")
		overlapped := 0
		for _, n := range seen {
			require.LessOrEqual(t, n, 2*batch, "at most the settled batch and the one in the transport: %v", seen)
			if n == 2*batch {
				overlapped++
			}
		}
		require.GreaterOrEqual(t, overlapped, batches-2, "claims ran during the publishes: %v", seen)
	})
}

// With IdleBackoffMax left to its default, an idle publisher keeps polling at PollInterval
// where nothing else can wake it for rows from other processes (SQLite, MySQL), and backs
// off while a PostgreSQL listener brings wake-ups.
func TestIdleDefaultFollowsTheListener(t *testing.T) {
	t.Parallel()
	for backend, steady := range map[string]bool{"sqlite": true, "mysql": true, "postgres": false} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			e := pubSetup(t, backend)
			d := &countingDialect{Dialect: pubDialect(backend)}
			var store *outbox.Store
			if backend == "postgres" {
				store = e.newStore(t, e.db, notifyingCounter{d}) // keep the Notifier ability
			} else {
				store = e.newStore(t, e.db, d)
			}
			o := fastOptions(t, "idle")
			o.PollInterval, o.IdleBackoffMax, o.Lease = 50*time.Millisecond, 0, 10*time.Second
			p, err := outbox.NewPublisher(store, newRecorder(nil).transport("p"), o)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			require.NoError(t, p.Run(ctx))
			claims := d.claims.Load()
			t.Logf("%s: %d idle claims in 3s", backend, claims)
			if steady {
				require.GreaterOrEqual(t, claims, int64(25), "polling at PollInterval gives about 60")
			} else {
				// Backing off to 1s gives about 8, and the wake-up when the listener connects
				// a chase of 7 more.
				require.LessOrEqual(t, claims, int64(18))
			}
		})
	}
}

// TestPublisherLeasesRunOut: four publishers drain with a lease so short that it often runs
// out before a batch's outcome is recorded (the transport stalls now and then for two
// thirds of it), so rows are claimed again, by another publisher or by the same one. The
// counters still tell what the table holds: each row counted delivered once, each claim
// accounted for, and a message published twice only with a lost lease to show for it. A
// publisher that claimed a row again while it still carried the row's stale outcome
// settled both by id, and counted the delivery twice with no lease lost.
func TestPublisherLeasesRunOut(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		const n = 2000
		ids, rec, m, total := e.drainByFour(t, "expire", n, func(o *outbox.PublisherOptions, tr outbox.Transport) outbox.Transport {
			o.Lease, o.PollInterval = 60*time.Millisecond, 10*time.Millisecond
			o.Retry.MaxAttempts = 1000               // a lost lease spends an attempt: none may die of it
			o.Logger = slog.New(slog.DiscardHandler) // hundreds of lost leases
			return outbox.TransportFunc(func(ctx context.Context, b []outbox.Delivery) []error {
				if rand.IntN(10) == 0 {
					time.Sleep(40 * time.Millisecond)
				}
				return tr.Publish(ctx, b)
			})
		})
		rec.mu.Lock()
		defer rec.mu.Unlock()
		duplicates := 0
		for _, id := range ids {
			duplicates += max(rec.delivered[id]-1, 0)
		}
		t.Logf("%s: %v, stats %+v, published twice %d", e.backend, m, total, duplicates)
		require.Equal(t, n, m[outbox.StatusDelivered])
		require.EqualValues(t, n, total.Delivered, "deliveries counted")
		require.Equal(t, total.Claimed, total.Delivered+total.Retried+total.LeaseLost)
		require.LessOrEqual(t, int64(duplicates), total.LeaseLost+total.Errors)
	})
}

// aheadProbe is a foldingDialect that records, as each settle-and-claim begins, how many
// rows are processing: the batch it settles, plus the batch in the transport when the loop
// claims ahead.
type aheadProbe struct {
	*foldingDialect
	e    *pubEnv
	bg   *goroutineT
	mu   sync.Mutex
	seen []int
}

func (d *aheadProbe) CompleteAndClaim(ctx context.Context, db *sql.DB, t dialect.Table, o []outbox.Outcome, p dialect.ClaimParams) ([]outbox.Record, []uuid.UUID, error) {
	n := d.e.counts(d.bg)[outbox.StatusProcessing]
	d.mu.Lock()
	d.seen = append(d.seen, n)
	d.mu.Unlock()
	return d.foldingDialect.CompleteAndClaim(ctx, db, t, o, p)
}

func (r *relayRecorder) deliveredAt(id uuid.UUID) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.delivered[id]
	return at, ok
}

// percentile returns the p-th percentile (0..100) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}

// notifyingCounter is a countingDialect that keeps PostgreSQL's Notifier ability.
type notifyingCounter struct{ *countingDialect }

func (n notifyingCounter) Signal(ctx context.Context, q dialect.DBTX, t dialect.Table, ns string) error {
	return n.Dialect.(dialect.Notifier).Signal(ctx, q, t, ns)
}

func (n notifyingCounter) Listen(ctx context.Context, db *sql.DB, t dialect.Table, ready func(), wake func(string)) error {
	return n.Dialect.(dialect.Notifier).Listen(ctx, db, t, ready, wake)
}
