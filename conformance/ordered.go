package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

// orderedTests check ordered claims per partition key ([outbox.ClaimOptions.Ordered]). A
// dialect without the ability ([dialect.OrderedClaimer]) skips them.
var orderedTests = []test{
	{"HeadOnly", testOrderedHeadOnly},
	{"RetryHoldsKey", testOrderedRetryHoldsKey},
	{"DeadHeadBlocks", testOrderedDeadHeadBlocks},
	{"SkipDead", testOrderedSkipDead},
	{"HeadsBeyondBacklog", testOrderedHeadsBeyondBacklog},
	{"Publishers", testOrderedPublishers},
	{"NeedsOrderedMigrations", testOrderedNeedsMigrations},
	{"RunsInSequence", testRunsInSequence},
	{"RunsLimit", testRunsLimit},
	{"RunsFillBatch", testRunsFillBatch},
	{"RunsShare", testRunsShare},
	{"RunsStopAtInFlight", testRunsStopAtInFlight},
	{"RunsStopAtDead", testRunsStopAtDead},
	{"RunsStopAtNotDue", testRunsStopAtNotDue},
	{"RunsConcurrent", testRunsConcurrent},
	{"RunsSettleAndClaim", testRunsSettleAndClaim},
	{"RunsContinue", testRunsContinue},
	{"RunsContinueOnlyDelivered", testRunsContinueOnlyDelivered},
	{"RunsContinueNotLost", testRunsContinueNotLost},
	{"RunsContinueThenHeads", testRunsContinueThenHeads},
}

// orderedSetup is setup for the ordered section: it skips when the dialect cannot claim in
// order.
func orderedSetup(t *testing.T, h Harness) *env {
	t.Helper()
	e := setup(t, h)
	_, err := e.store.Claim(e.ctx, orderedOpts(1))
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skipf("dialect %s does not claim in order: %v", h.Dialect.Name(), err)
	}
	require.NoError(t, err)
	return e
}

func orderedOpts(limit int) outbox.ClaimOptions {
	o := claimOpts(limit, time.Minute)
	o.Ordered = true
	o.Namespace = "orders"
	return o
}

// keyed returns a message of partition key key whose payload records seq.
func keyed(key string, seq int) outbox.Message {
	m := msg(seq)
	m.PartitionKey = key
	m.Payload = json.RawMessage(fmt.Sprintf(`{"key":%q,"seq":%d}`, key, seq))
	return m
}

// resultIDs returns the ids of enqueue results.
func resultIDs(rs []outbox.Result) []uuid.UUID {
	out := make([]uuid.UUID, len(rs))
	for i, r := range rs {
		out[i] = r.ID
	}
	return out
}

// An ordered claim takes only the first row of each key, and every row without a key; the
// next row of a key waits until the head is delivered.
func testOrderedHeadOnly(t *testing.T, h Harness) {
	e := orderedSetup(t, h)
	a := resultIDs(e.enqueue(t, keyed("a", 0), keyed("a", 1), keyed("a", 2)))
	rest := resultIDs(e.enqueue(t, keyed("b", 0), msg(7), msg(8), keyed("b", 1)))
	b0, free1, free2, b1 := rest[0], rest[1], rest[2], rest[3]

	first := e.claim(t, orderedOpts(100))
	require.Equal(t, []uuid.UUID{a[0], b0, free1, free2}, ids(first), "heads of a and b, and the rows without a key")
	require.Empty(t, e.claim(t, orderedOpts(100)), "the heads are in flight: nothing else of a or b")

	// An unordered claim ignores the order: it is the publisher's choice.
	plain := e.claim(t, claimOpts(1, time.Minute))
	require.Equal(t, []uuid.UUID{a[1]}, ids(plain))
	require.NoError(t, e.store.Ack(e.ctx, plain[0].Lease()))

	require.NoError(t, e.store.Ack(e.ctx, first[0].Lease(), first[1].Lease()))
	require.Equal(t, []uuid.UUID{a[2], b1}, ids(e.claim(t, orderedOpts(100))))

	// Another namespace with the same key is another key, and a claim without a namespace
	// orders too.
	other := keyed("a", 9)
	other.Namespace = "billing"
	oid := e.enqueue(t, other)[0].ID
	all := orderedOpts(100)
	all.Namespace = ""
	require.Equal(t, []uuid.UUID{oid}, ids(e.claim(t, all)))
	require.Empty(t, e.claim(t, all))
}

// A claim finds the heads of other keys however many rows of a key in flight come before
// them.
func testOrderedHeadsBeyondBacklog(t *testing.T, h Harness) {
	e := orderedSetup(t, h)
	hot := make([]outbox.Message, 500)
	for i := range hot {
		hot[i] = keyed("hot", i)
	}
	hotIDs := resultIDs(e.enqueue(t, hot...))
	cold := resultIDs(e.enqueue(t, keyed("cold", 0), msg(1)))
	require.Equal(t, []uuid.UUID{hotIDs[0], cold[0], cold[1]}, ids(e.claim(t, orderedOpts(10))))
	more := resultIDs(e.enqueue(t, keyed("warm", 0), keyed("cold", 1)))
	require.Equal(t, []uuid.UUID{more[0]}, ids(e.claim(t, orderedOpts(10))), "behind 499 held-back rows")
	require.Empty(t, e.claim(t, orderedOpts(10)))
}

// A failed head goes back to pending and holds its key until it is delivered, even when
// the next row is due first; a head at the attempt limit holds it too.
func testOrderedRetryHoldsKey(t *testing.T, h Harness) {
	e := orderedSetup(t, h)
	k := resultIDs(e.enqueue(t, keyed("k", 0), keyed("k", 1)))
	recs := e.claim(t, orderedOpts(10))
	require.Equal(t, []uuid.UUID{k[0]}, ids(recs))

	// Retry in a few seconds: the head is pending but not due, and k[1] still waits.
	require.NoError(t, e.store.Nack(e.ctx, outbox.RetryPolicy{}, outbox.Failure{
		Lease: recs[0].Lease(), Attempts: recs[0].Attempts, Err: outbox.RetryAfter(errors.New("broker down"), 3*time.Second)}))
	require.Empty(t, e.claim(t, orderedOpts(10)), "a row waiting for its retry holds back its key")

	// Once due, the head comes back first.
	eventually(t, 30*time.Second, "the retry to fall due", func() bool {
		recs = e.claim(t, orderedOpts(10))
		return len(recs) > 0
	})
	require.Equal(t, []uuid.UUID{k[0]}, ids(recs))
	require.NoError(t, e.store.Nack(e.ctx, outbox.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}, outbox.Failure{
		Lease: recs[0].Lease(), Attempts: recs[0].Attempts, Err: errors.New("again")}))

	// At the attempt limit the head is no longer claimable, and still holds its key.
	o := orderedOpts(10)
	o.MaxAttempts = 2
	eventually(t, 5*time.Second, "the retry to fall due", func() bool {
		return e.get(t, k[0]).NextAttemptAt.Before(time.Now().Add(-5 * time.Millisecond))
	})
	require.Empty(t, e.claim(t, o), "an exhausted head holds back its key")
	require.Equal(t, []uuid.UUID{k[0]}, ids(e.claim(t, orderedOpts(10))))
}

// A dead head blocks its key and is reported by BlockedKeys; replaying it (back to pending)
// delivers it first, and discarding it (deleting the row) releases the rows behind it.
func testOrderedDeadHeadBlocks(t *testing.T, h Harness) {
	e := orderedSetup(t, h)
	k := resultIDs(e.enqueue(t, keyed("k", 0), keyed("k", 1), keyed("k", 2)))
	j := resultIDs(e.enqueue(t, keyed("j", 0)))
	recs := e.claim(t, orderedOpts(10))
	require.Equal(t, []uuid.UUID{k[0], j[0]}, ids(recs))
	require.NoError(t, e.store.Nack(e.ctx, outbox.RetryPolicy{}, outbox.Failure{
		Lease: recs[0].Lease(), Attempts: 1, Err: outbox.Permanent(errors.New("schema rejected"))}))
	require.NoError(t, e.store.Ack(e.ctx, recs[1].Lease()))
	require.Equal(t, outbox.StatusDead, e.get(t, k[0]).Status)

	require.Empty(t, e.claim(t, orderedOpts(10)), "a dead head blocks its key")
	blocked, err := e.store.BlockedKeys(e.ctx, outbox.Scope{Namespace: "orders"}, 10)
	require.NoError(t, err)
	require.Len(t, blocked, 1)
	require.Equal(t, "orders", blocked[0].Namespace)
	require.Equal(t, "k", blocked[0].PartitionKey)
	require.Equal(t, k[0], blocked[0].HeadID)
	require.Equal(t, "order.created", blocked[0].Topic)
	require.Contains(t, blocked[0].LastError, "schema rejected")
	require.EqualValues(t, 2, blocked[0].Waiting)
	none, err := e.store.BlockedKeys(e.ctx, outbox.Scope{Namespace: "billing"}, 10)
	require.NoError(t, err)
	require.Empty(t, none)

	// Replay, as an operator would: the dead row goes back to pending and due.
	admin := requireAdmin(t, e)
	res, err := admin.Replay(e.ctx, k[0])
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{k[0]}, res.Replayed)
	recs = e.claim(t, orderedOpts(10))
	require.Equal(t, []uuid.UUID{k[0]}, ids(recs), "the replayed head is delivered first")
	blocked, err = e.store.BlockedKeys(e.ctx, outbox.Scope{}, 10)
	require.NoError(t, err)
	require.Empty(t, blocked)

	// It dies again and is discarded: the next row becomes the head.
	require.NoError(t, e.store.Nack(e.ctx, outbox.RetryPolicy{}, outbox.Failure{
		Lease: recs[0].Lease(), Attempts: recs[0].Attempts, Err: outbox.Permanent(errors.New("still rejected"))}))
	require.Empty(t, e.claim(t, orderedOpts(10)))
	_, err = admin.Discard(e.ctx, k[0])
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{k[1]}, ids(e.claim(t, orderedOpts(10))))
}

// requireAdmin returns the store for the replay and discard an operator would run, and
// skips when the dialect has no [dialect.Admin] to run them.
func requireAdmin(t *testing.T, e *env) *outbox.Store {
	t.Helper()
	if _, ok := e.h.Dialect.(dialect.Admin); !ok {
		t.Skipf("dialect %s does not implement dialect.Admin (replay, discard)", e.h.Dialect.Name())
	}
	return e.store
}

// With OrderedSkipDead a dead row no longer holds back the rows after it.
func testOrderedSkipDead(t *testing.T, h Harness) {
	e := orderedSetup(t, h)
	k := resultIDs(e.enqueue(t, keyed("k", 0), keyed("k", 1), keyed("k", 2)))
	recs := e.claim(t, orderedOpts(10))
	require.NoError(t, e.store.Nack(e.ctx, outbox.RetryPolicy{}, outbox.Failure{
		Lease: recs[0].Lease(), Attempts: 1, Err: outbox.Permanent(errors.New("rejected"))}))
	require.Empty(t, e.claim(t, orderedOpts(10)))

	o := orderedOpts(10)
	o.OrderedSkipDead = true
	recs = e.claim(t, o)
	require.Equal(t, []uuid.UUID{k[1]}, ids(recs), "the row after the dead head, and only it")
	require.Empty(t, e.claim(t, o), "the new head is in flight")
	require.NoError(t, e.store.Ack(e.ctx, recs[0].Lease()))
	require.Equal(t, []uuid.UUID{k[2]}, ids(e.claim(t, o)))

	o.Ordered = false
	_, err := e.store.Claim(e.ctx, o)
	require.ErrorIs(t, err, outbox.ErrInvalid, "OrderedSkipDead without Ordered")
}

// orderedRun is what the publishers of testOrderedPublishers record.
type orderedRun struct {
	mu       sync.Mutex
	inFlight map[string]int     // key → messages being published now
	overlap  []string           // keys seen twice in flight at once
	first    map[string][]int   // key → sequence numbers in order of first success
	seen     map[uuid.UUID]bool // ids delivered at least once
	failures int                // failed attempts made
	rng      *rand.Rand         // guarded by mu
	done     chan struct{}      // closed when every message was delivered once
	want     int
}

func (r *orderedRun) publish(ctx context.Context, batch []outbox.Delivery) []error {
	type ev struct {
		Key string `json:"key"`
		Seq int    `json:"seq"`
	}
	errs := make([]error, len(batch))
	r.mu.Lock()
	for _, d := range batch {
		r.inFlight[d.PartitionKey]++
		if r.inFlight[d.PartitionKey] > 1 {
			r.overlap = append(r.overlap, d.PartitionKey)
		}
	}
	r.mu.Unlock()
	// Stay in flight a moment, so that a second claim of the key would overlap.
	time.Sleep(time.Millisecond)
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, d := range batch {
		r.inFlight[d.PartitionKey]--
		if r.rng.IntN(5) == 0 {
			errs[i] = errors.New("injected failure")
			r.failures++
			continue
		}
		var e ev
		if err := json.Unmarshal(d.Payload, &e); err != nil {
			errs[i] = outbox.Permanent(err)
			continue
		}
		if !r.seen[d.ID] {
			r.seen[d.ID] = true
			r.first[e.Key] = append(r.first[e.Key], e.Seq)
			if len(r.seen) == r.want {
				close(r.done)
			}
		}
	}
	return errs
}

// orderedDeadline bounds the eight publishers' run. It takes seconds; the race detector
// slows SQLite's pure-Go engine some thirty times (a minute alone when the run had 4,000
// messages), and CI runs it beside every other test: on a 2-core machine whose database
// server was busy with other work it then delivered 3,963 of 4,000 messages in five minutes. A run that stops making progress for
// orderedStall, or puts two messages of one key in flight at once, fails at once instead.
const (
	orderedDeadline = 8 * time.Minute
	orderedStall    = time.Minute
)

// await waits until every message was delivered once, and fails the test as soon as two
// messages of one key were in flight at once (the claim's row locks or its ordering are
// broken: waiting longer proves nothing more), when no new message was delivered for
// stall, or at the deadline.
func (r *orderedRun) await(t *testing.T, deadline, stall time.Duration) {
	t.Helper()
	start := time.Now()
	last, lastAt := 0, start
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-r.done:
			return
		case <-tick.C:
		}
		r.mu.Lock()
		n, overlap := len(r.seen), slices.Clone(r.overlap)
		r.mu.Unlock()
		now := time.Now()
		switch {
		case len(overlap) > 0:
			t.Errorf("two messages of key %s were in flight at once (%d of %d delivered): ordered claims must never "+
				"return two rows of one key, nor a row another claim holds", overlap[0], n, r.want)
			return
		case n > last:
			last, lastAt = n, now
		case now.Sub(lastAt) > stall:
			t.Errorf("no message delivered for %s: %d of %d delivered in %s", stall, n, r.want, now.Sub(start).Round(time.Second))
			return
		}
		if now.Sub(start) > deadline {
			t.Errorf("only %d of %d messages delivered in %s", n, r.want, deadline)
			return
		}
	}
}

// Eight publishers on separate pools (when the harness can open them) deliver 100 keys × 10
// events with random failures and fast retries: every key's first successful deliveries
// are in enqueue order, and no two messages of one key are ever published at once.
func testOrderedPublishers(t *testing.T, h Harness) {
	const (
		keys       = 100
		perKey     = 10
		publishers = 8
	)
	e := orderedSetup(t, h)
	// Key by key, ten keys per transaction: a claim that ignored the order would take
	// several events of one key at once.
	for k0 := 0; k0 < keys; k0 += 10 {
		var batch []outbox.Message
		for k := k0; k < k0+10; k++ {
			for seq := range perKey {
				batch = append(batch, keyed(fmt.Sprintf("key-%03d", k), seq))
			}
		}
		e.enqueue(t, batch...)
	}
	run := &orderedRun{
		inFlight: map[string]int{}, first: map[string][]int{}, seen: map[uuid.UUID]bool{},
		rng: rand.New(rand.NewPCG(1, 2)), done: make(chan struct{}), want: keys * perKey,
	}
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, publishers)
	for i := range publishers {
		// Separate pools, each with its Store, where the harness can open them; otherwise
		// the publishers share the one pool through one Store, as a single-writer database
		// such as SQLite wants (one Store per pool, so its writers take turns in the process
		// instead of in the database's busy handler).
		store := e.store
		if h.Reopen != nil {
			var err error
			store, err = outbox.New(h.Reopen(t, e.db), h.Dialect, outbox.Options{Table: e.table})
			require.NoError(t, err)
		}
		p, err := outbox.NewPublisher(store, outbox.TransportFunc(run.publish), outbox.PublisherOptions{
			Scope: outbox.Scope{Namespace: "orders"}, Ordered: true, BatchSize: 10,
			Lease: 3 * time.Second, PollInterval: 5 * time.Millisecond, IdleBackoffMax: 20 * time.Millisecond,
			Retry:    outbox.RetryPolicy{BaseDelay: 5 * time.Millisecond, MaxDelay: 20 * time.Millisecond, MaxAttempts: 1000},
			WorkerID: fmt.Sprintf("publisher-%d", i), Logger: slog.New(slog.DiscardHandler),
		})
		require.NoError(t, err)
		wg.Go(func() { errs <- p.Run(ctx) })
	}
	run.await(t, orderedDeadline, orderedStall)
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	run.mu.Lock()
	defer run.mu.Unlock()
	require.Empty(t, run.overlap, "keys with two messages in flight at once")
	require.Positive(t, run.failures, "the run injected failures")
	want := make([]int, perKey)
	for i := range want {
		want[i] = i
	}
	for k := range keys {
		key := fmt.Sprintf("key-%03d", k)
		require.Equal(t, want, run.first[key], "first successful deliveries of %s, in order", key)
	}
}

// On a table that Harness.Up made without Harness.UpOrdered, ordered claims (also with
// settling), BlockedKeys and an ordered publisher's Run fail with a CheckError (with the
// built-in migrations, one that says to apply the ordered set), and nothing is claimed;
// unordered claims work. Once UpOrdered ran, the same Store claims in order.
func testOrderedNeedsMigrations(t *testing.T, h Harness) {
	if _, ok := h.Dialect.(dialect.OrderedClaimer); !ok {
		t.Skipf("dialect %s does not implement dialect.OrderedClaimer", h.Dialect.Name())
	}
	ctx := h.context()
	db := h.OpenDB(t)
	require.NoError(t, h.upBase(ctx, db, outbox.DefaultTable), "migrate up without the ordered set")
	s, err := outbox.New(db, h.Dialect, outbox.Options{})
	require.NoError(t, err)
	e := &env{ctx: ctx, db: db, store: s, table: outbox.DefaultTable, h: h}
	first := resultIDs(e.enqueue(t, keyed("k", 0), keyed("k", 1)))

	misconfigured := func(what string, err error) {
		t.Helper()
		var ce *outbox.CheckError
		require.ErrorAs(t, err, &ce, "%s without the ordered migrations", what)
		require.ErrorIs(t, err, outbox.ErrMisconfigured, what)
		if h.UpOrdered == nil { // the built-in migrations: the fix names their ordered set
			require.Contains(t, err.Error(), "--ordered", "%s: the error says what to run", what)
			require.Contains(t, err.Error(), "Ordered: true", "%s: the error says what to run", what)
		}
	}
	for range 2 { // a failed check is not remembered as passed
		_, err = s.Claim(ctx, orderedOpts(10))
		misconfigured("Claim", err)
	}
	_, err = s.BlockedKeys(ctx, outbox.Scope{}, 10)
	misconfigured("BlockedKeys", err)
	if _, ok := h.Dialect.(dialect.SettleClaimer); ok {
		_, _, err = s.CompleteAndClaim(ctx, nil, orderedOpts(10))
		misconfigured("CompleteAndClaim", err)
	}
	p, err := outbox.NewPublisher(s, outbox.TransportFunc(func(context.Context, []outbox.Delivery) []error { return nil }),
		outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "orders"}, Ordered: true, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	runCtx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	misconfigured("Publisher.Run", p.Run(runCtx))
	require.NoError(t, runCtx.Err(), "Run returned the error at once")
	require.Equal(t, 2, e.count(t, outbox.StatusPending), "nothing was claimed")

	plain := claimOpts(10, time.Minute)
	plain.Namespace = "orders"
	recs := e.claim(t, plain)
	require.Equal(t, first, ids(recs), "unordered claims need no order index")
	require.NoError(t, s.Ack(ctx, recs[0].Lease(), recs[1].Lease()))

	// The upgrade: the ordered set on the existing table; the same Store checks again.
	require.NoError(t, h.upOrdered(ctx, db, outbox.DefaultTable))
	more := resultIDs(e.enqueue(t, keyed("k", 2), keyed("k", 3)))
	require.Equal(t, more[:1], ids(e.claim(t, orderedOpts(10))))
	_, err = s.BlockedKeys(ctx, outbox.Scope{}, 10)
	require.NoError(t, err)
}
