package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
)

// keyOrderTransport keeps key order as [outbox.TransportKeyOrder] says (when keeps is set):
// it delivers a batch in order and, once a key's message fails, fails the key's later
// messages of the batch without delivering them. It records what a consumer would see.
type keyOrderTransport struct {
	keeps bool
	fail  func(d outbox.Delivery) error // nil: deliver everything

	mu         sync.Mutex
	batches    [][]outbox.Delivery
	next       map[string]int                // key → the sequence number the consumer expects next
	outOfOrder int                           // deliveries of a key not in sequence
	delivered  map[uuid.UUID]outbox.Delivery // the successful delivery of each message
	seqOf      map[uuid.UUID]int
}

func newKeyOrderTransport(keeps bool, seqOf map[uuid.UUID]int, fail func(d outbox.Delivery) error) *keyOrderTransport {
	return &keyOrderTransport{keeps: keeps, fail: fail, next: map[string]int{}, delivered: map[uuid.UUID]outbox.Delivery{}, seqOf: seqOf}
}

func (tr *keyOrderTransport) KeepsKeyOrder() bool { return tr.keeps }

func (tr *keyOrderTransport) Publish(_ context.Context, batch []outbox.Delivery) []error {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.batches = append(tr.batches, batch)
	errs := make([]error, len(batch))
	failed := map[string]uuid.UUID{}
	for i, d := range batch {
		if behind, ok := failed[d.PartitionKey]; ok && tr.keeps {
			errs[i] = fmt.Errorf("not sent: %s failed before it", behind)
			continue
		}
		if tr.fail != nil {
			errs[i] = tr.fail(d)
		}
		if errs[i] != nil {
			failed[d.PartitionKey] = d.ID
			continue
		}
		if tr.seqOf[d.ID] != tr.next[d.PartitionKey] {
			tr.outOfOrder++
		}
		tr.next[d.PartitionKey] = tr.seqOf[d.ID] + 1
		tr.delivered[d.ID] = d
	}
	return errs
}

// maxPerKey is the most messages of one key in one batch so far.
func (tr *keyOrderTransport) maxPerKey() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	most := 0
	for _, b := range tr.batches {
		n := map[string]int{}
		for _, d := range b {
			n[d.PartitionKey]++
			most = max(most, n[d.PartitionKey])
		}
	}
	return most
}

func (tr *keyOrderTransport) count() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return len(tr.delivered)
}

// runsEnv migrates the ordered set and enqueues per[k] messages of each key k in turn, in
// one transaction, returning their ids by key and each id's sequence number in its key.
func runsEnv(t *testing.T, e *pubEnv, ns string, per map[string]int) (map[string][]uuid.UUID, map[uuid.UUID]int) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, migrations.Up(ctx, e.db, e.backend, migrations.Options{Ordered: true}))
	var msgs []outbox.Message
	for i := 0; ; i++ {
		added := false
		for k, n := range per {
			if i < n {
				msgs = append(msgs, outbox.Message{Namespace: ns, Topic: "t", PartitionKey: k, Payload: json.RawMessage(fmt.Sprintf(`{"seq":%d}`, i))})
				added = true
			}
		}
		if !added {
			break
		}
	}
	tx, err := e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	res, err := e.store.EnqueueBatch(ctx, tx, msgs)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	byKey := map[string][]uuid.UUID{}
	seq := map[uuid.UUID]int{}
	for i, r := range res {
		k := msgs[i].PartitionKey
		seq[r.ID] = len(byKey[k])
		byKey[k] = append(byKey[k], r.ID)
	}
	return byKey, seq
}

func runsOptions(t *testing.T, ns string) outbox.PublisherOptions {
	o := fastOptions(t, ns)
	o.Ordered = true
	o.BatchSize = 20
	return o
}

// TestOrderedRunsHotKey: with a transport that keeps key order, an ordered publisher hands
// it a key's waiting messages together, in sequence, and every key is delivered in order,
// each message once, on its first attempt.
func TestOrderedRunsHotKey(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		_, seq := runsEnv(t, e, "runs", map[string]int{"hot": 120, "a": 10, "b": 10})
		tr := newKeyOrderTransport(true, seq, nil)
		pub, err := outbox.NewPublisher(e.store, tr, runsOptions(t, "runs"))
		require.NoError(t, err)
		start(t, pub)
		testdb.Poll(t, 30*time.Second, "every message delivered", func() bool { return tr.count() == len(seq) })
		require.Greater(t, tr.maxPerKey(), 1, "a batch carries several messages of one key")
		tr.mu.Lock()
		defer tr.mu.Unlock()
		require.Zero(t, tr.outOfOrder, "nothing delivered out of order")
		for id, d := range tr.delivered {
			require.Equal(t, 1, d.Attempt, "message %s on its first attempt", id)
		}
		st := pub.Stats()
		require.Zero(t, st.Retried+st.Unavailable+st.Dead)
	})
}

// TestOrderedRunsWithoutKeyOrder: a transport that does not say it keeps key order (or says
// it does not) receives at most one message of a key in a batch, as before runs.
func TestOrderedRunsWithoutKeyOrder(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		_, seq := runsEnv(t, e, "runs", map[string]int{"hot": 8, "a": 4})
		tr := newKeyOrderTransport(false, seq, nil)
		var plain outbox.Transport = outbox.TransportFunc(tr.Publish) // no KeepsKeyOrder at all
		for _, which := range []outbox.Transport{tr, plain} {
			pub, err := outbox.NewPublisher(e.store, which, runsOptions(t, "runs"))
			require.NoError(t, err)
			stop := start(t, pub)
			testdb.Poll(t, 30*time.Second, "half the messages delivered", func() bool { return tr.count() >= len(seq)/2 })
			stop()
		}
		pub, err := outbox.NewPublisher(e.store, plain, runsOptions(t, "runs"))
		require.NoError(t, err)
		start(t, pub)
		testdb.Poll(t, 30*time.Second, "every message delivered", func() bool { return tr.count() == len(seq) })
		require.Equal(t, 1, tr.maxPerKey(), "one message of a key per batch")
		tr.mu.Lock()
		defer tr.mu.Unlock()
		require.Zero(t, tr.outOfOrder)
	})
}

// TestOrderedRunsFailureReleases: when a key's message fails in the middle of its run, the
// messages after it in the batch go back without spending an attempt and are delivered
// after it; nothing is delivered out of order, and only the failure counts as one.
func TestOrderedRunsFailureReleases(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		keys, seq := runsEnv(t, e, "runs", map[string]int{"k": 15})
		k := keys["k"]
		var once sync.Once
		tr := newKeyOrderTransport(true, seq, func(d outbox.Delivery) (err error) {
			if d.ID == k[5] {
				once.Do(func() { err = errors.New("broker refused it once") })
			}
			return err
		})
		pub, err := outbox.NewPublisher(e.store, tr, runsOptions(t, "runs"))
		require.NoError(t, err)
		start(t, pub)
		testdb.Poll(t, 30*time.Second, "every message delivered and settled", func() bool {
			return tr.count() == len(seq) && pub.Stats().Delivered == int64(len(seq))
		})
		tr.mu.Lock()
		defer tr.mu.Unlock()
		require.Zero(t, tr.outOfOrder, "nothing delivered out of order")
		require.Greater(t, len(tr.batches[0]), 6, "the first batch carried the key's run past the failure")
		for i, id := range k {
			want := 1
			if i == 5 {
				want = 2
			}
			require.Equal(t, want, tr.delivered[id].Attempt, "message %d: the rows released behind the failure spent no attempt", i)
			require.Equal(t, want, e.get(t, id).Attempts)
		}
		st := pub.Stats()
		require.EqualValues(t, 1, st.Retried, "the failure, and not the rows released behind it")
		require.Zero(t, st.Unavailable+st.Dead)
		require.EqualValues(t, len(k), st.Delivered)
	})
}

// TestOrderedRunsPermanent: a message dead-lettered in the middle of its key's run holds
// the key back (head of line): the messages after it are released, untried, and wait; with
// OrderedSkipDead they are delivered next.
func TestOrderedRunsPermanent(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		keys, seq := runsEnv(t, e, "runs", map[string]int{"k": 10})
		k := keys["k"]
		tr := newKeyOrderTransport(true, seq, func(d outbox.Delivery) error {
			if d.ID == k[3] {
				return outbox.Permanent(errors.New("schema rejected"))
			}
			return nil
		})
		var dead deadLetters
		o := runsOptions(t, "runs")
		o.OnDead = dead.hook
		pub, err := outbox.NewPublisher(e.store, tr, o)
		require.NoError(t, err)
		stop := start(t, pub)
		testdb.Poll(t, 30*time.Second, "the key blocked behind its dead message", func() bool {
			keys, err := e.store.BlockedKeys(context.Background(), outbox.Scope{Namespace: "runs"}, 10)
			require.NoError(t, err)
			return len(keys) == 1 && keys[0].HeadID == k[3] && keys[0].Waiting == 6 && e.get(t, k[9]).Status == outbox.StatusPending
		})
		stop()
		require.Equal(t, 3, tr.count(), "the messages before the dead one, and none after it")
		for _, id := range k[4:] {
			r := e.get(t, id)
			require.Equal(t, outbox.StatusPending, r.Status)
			require.Zero(t, r.Attempts, "released untried")
			require.Contains(t, r.LastError, k[3].String())
		}
		require.Len(t, dead.all(), 1)
		st := pub.Stats()
		require.EqualValues(t, 1, st.Dead)
		require.Zero(t, st.Retried+st.Unavailable)

		o.OrderedSkipDead = true
		pub, err = outbox.NewPublisher(e.store, tr, o)
		require.NoError(t, err)
		start(t, pub)
		testdb.Poll(t, 30*time.Second, "the messages after the dead one delivered", func() bool { return tr.count() == len(seq)-1 })
		tr.mu.Lock()
		defer tr.mu.Unlock()
		require.Equal(t, 1, tr.outOfOrder, "one gap in the key: the dead message, passed over")
		require.Equal(t, outbox.StatusDead, e.get(t, k[3]).Status)
	})
}

// TestOrderedRunsOutage: a destination that is down fails a key's run at its first
// message; the messages released behind it are neither failures nor deliveries, so the
// batch counts as wholly unavailable and the circuit opens, and no attempt is spent.
func TestOrderedRunsOutage(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		keys, seq := runsEnv(t, e, "runs", map[string]int{"k": 10})
		tr := newKeyOrderTransport(true, seq, func(outbox.Delivery) error {
			return outbox.Unavailable(errors.New("connection refused"))
		})
		pub, err := outbox.NewPublisher(e.store, tr, runsOptions(t, "runs"))
		require.NoError(t, err)
		start(t, pub)
		// Each batch holds the key's run, whose first message alone counts as unavailable.
		testdb.Poll(t, 30*time.Second, "the circuit to open, each batch settled", func() bool {
			tr.mu.Lock()
			batches := len(tr.batches)
			tr.mu.Unlock()
			st := pub.Stats()
			return st.CircuitOpens > 0 && st.Unavailable == int64(batches)
		})
		st := pub.Stats()
		require.Zero(t, st.Retried+st.Dead+st.Delivered)
		require.Greater(t, tr.maxPerKey(), 1, "the run was handed over whole")
		for _, id := range keys["k"] {
			require.Zero(t, e.get(t, id).Attempts)
		}
	})
}

// TestUnorderedPublisherWaivesKeyOrder: an unordered publisher's batches need no key order,
// so a transport that keeps it through outbox.PublishInKeyOrder sends a batch in one call
// and a key's failed message holds none of the key's others back.
func TestUnorderedPublisherWaivesKeyOrder(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		keys, seq := runsEnv(t, e, "waived", map[string]int{"k": 6})
		var once sync.Once
		inner := newKeyOrderTransport(false, seq, func(d outbox.Delivery) (err error) {
			if d.ID == keys["k"][0] {
				once.Do(func() { err = errors.New("refused once") })
			}
			return err
		})
		var mu sync.Mutex
		calls := 0
		tr := outbox.TransportFunc(func(ctx context.Context, batch []outbox.Delivery) []error {
			return outbox.PublishInKeyOrder(ctx, batch, nil, func(ctx context.Context, b []outbox.Delivery) []error {
				mu.Lock()
				calls++
				mu.Unlock()
				return inner.Publish(ctx, b)
			})
		})
		o := fastOptions(t, "waived")
		o.BatchSize = 20
		pub, err := outbox.NewPublisher(e.store, tr, o)
		require.NoError(t, err)
		start(t, pub)
		testdb.Poll(t, 30*time.Second, "every message delivered", func() bool { return inner.count() == len(seq) })
		inner.mu.Lock()
		defer inner.mu.Unlock()
		require.Len(t, inner.batches[0], 6, "the key's six rows in one call")
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, 2, calls, "one call for the batch, one for the retry")
		for _, id := range keys["k"][1:] {
			r, err := e.store.Get(context.Background(), id)
			require.NoError(t, err)
			require.Equal(t, 1, r.Attempts, "delivered at the first try, not held back")
		}
	})
}

// TestOrderedLoopsShareKeys: an ordered publisher with two claim loops drains a few keys'
// backlog with both loops at once, each on keys of its own: the first loop's claim leaves
// half the keys to the second ([outbox.ClaimOptions.RunShare]), where it would otherwise
// take every key's head and leave the second loop nothing to claim.
func TestOrderedLoopsShareKeys(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		_, seq := runsEnv(t, e, "share", map[string]int{"a": 30, "b": 30, "c": 30, "d": 30})
		inner := newKeyOrderTransport(true, seq, nil)
		tr := &concurrentKeys{keyOrderTransport: inner, both: make(chan struct{})}
		o := runsOptions(t, "share")
		o.Concurrency = 2
		pub, err := outbox.NewPublisher(e.store, tr, o)
		require.NoError(t, err)
		start(t, pub)
		select {
		case <-tr.both:
		case <-time.After(30 * time.Second):
			t.Fatal("the two claim loops never had batches in the transport at once")
		}
		testdb.Poll(t, 30*time.Second, "every message delivered", func() bool { return inner.count() == len(seq) })
		tr.mu.Lock()
		defer tr.mu.Unlock()
		require.Empty(t, tr.shared, "two batches in the transport at once never share a key")
		inner.mu.Lock()
		defer inner.mu.Unlock()
		require.Zero(t, inner.outOfOrder, "nothing delivered out of order")
	})
}

// concurrentKeys is a keyOrderTransport whose first call waits, up to a while, for a
// second one: both then go on, and both says so. It records keys that two calls in the
// transport at once both carried.
type concurrentKeys struct {
	*keyOrderTransport
	both chan struct{}

	mu     sync.Mutex
	inside map[string]int // key → calls in the transport carrying it
	calls  int
	shared []string
	once   sync.Once
}

func (c *concurrentKeys) Publish(ctx context.Context, batch []outbox.Delivery) []error {
	c.mu.Lock()
	if c.inside == nil {
		c.inside = map[string]int{}
	}
	keys := map[string]bool{}
	for _, d := range batch {
		keys[d.PartitionKey] = true
	}
	for k := range keys {
		if c.inside[k]++; c.inside[k] > 1 {
			c.shared = append(c.shared, k)
		}
	}
	c.calls++
	if c.calls == 2 {
		c.once.Do(func() { close(c.both) })
	}
	c.mu.Unlock()
	select { // hold the batch so that the other loop's claim can find keys to take
	case <-c.both:
	case <-time.After(2 * time.Second):
	case <-ctx.Done():
	}
	defer func() {
		c.mu.Lock()
		for k := range keys {
			c.inside[k]--
		}
		c.calls--
		c.mu.Unlock()
	}()
	return c.keyOrderTransport.Publish(ctx, batch)
}

// TestOrderedPublisherKeepsKeyOrderUnderWaivedContext: an ordered publisher run with a
// context that a caller marked [outbox.WithoutKeyOrder] (one shared with an unordered
// relay, say) still has its transport sequence each key: the rows of a run behind a
// failed one are not sent before it.
func TestOrderedPublisherKeepsKeyOrderUnderWaivedContext(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		keys, _ := runsEnv(t, e, "rewaived", map[string]int{"k": 6})
		var (
			mu        sync.Mutex
			delivered []uuid.UUID
			once      sync.Once
		)
		tr := outbox.PerMessage(func(_ context.Context, d outbox.Delivery) (err error) {
			if d.ID == keys["k"][0] {
				once.Do(func() { err = errors.New("refused once") })
			}
			if err == nil {
				mu.Lock()
				delivered = append(delivered, d.ID)
				mu.Unlock()
			}
			return err
		})
		o := runsOptions(t, "rewaived")
		o.Retry.BaseDelay = time.Millisecond
		pub, err := outbox.NewPublisher(e.store, tr, o)
		require.NoError(t, err)
		runUntilStopped(t, "Run", func(ctx context.Context) error { return pub.Run(outbox.WithoutKeyOrder(ctx)) })
		testdb.Poll(t, 30*time.Second, "every message delivered", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(delivered) >= len(keys["k"])
		})
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, keys["k"], delivered, "the key's rows delivered in sequence, none ahead of the refused one")
	})
}

// TestOrderedContinueGivesOtherKeysTheirTurn: a loop that continues the key it keeps busy
// still looks for other keys' heads every few batches. The cold key's head, older than
// every hot row, is held elsewhere while the loop takes the hot key, and freed during the
// loop's first batch: it goes out within continueTurns batches, not after the hot key's
// backlog.
func TestOrderedContinueGivesOtherKeysTheirTurn(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ctx := context.Background()
		_, seq := runsEnv(t, e, "turns", map[string]int{"cold": 1})
		_, hot := runsEnv(t, e, "turns", map[string]int{"hot": 400})
		maps.Copy(seq, hot)
		held, err := e.store.Claim(ctx, outbox.ClaimOptions{Scope: outbox.Scope{Namespace: "turns"}, Limit: 1, Lease: time.Minute,
			MaxAttempts: 10, WorkerID: "elsewhere", Ordered: true})
		require.NoError(t, err)
		require.Len(t, held, 1)
		require.Equal(t, "cold", held[0].PartitionKey)
		inner := newKeyOrderTransport(true, seq, nil)
		var (
			mu        sync.Mutex
			calls     int
			coldBatch int
		)
		tr := keyOrderFunc{inner, func(ctx context.Context, batch []outbox.Delivery) []error {
			mu.Lock()
			calls++
			call := calls
			for _, d := range batch {
				if d.PartitionKey == "cold" {
					coldBatch = call
				}
			}
			mu.Unlock()
			if call == 1 { // the loop has the hot key: its next claims may continue it
				require.NoError(t, e.store.Complete(ctx, outbox.Outcome{Lease: held[0].Lease(), Status: outbox.StatusPending}))
			}
			return inner.Publish(ctx, batch)
		}}
		o := runsOptions(t, "turns")
		o.Concurrency = 1
		pub, err := outbox.NewPublisher(e.store, tr, o)
		require.NoError(t, err)
		start(t, pub)
		testdb.Poll(t, 30*time.Second, "every message delivered", func() bool { return inner.count() == len(seq) })
		mu.Lock()
		defer mu.Unlock()
		require.Greater(t, coldBatch, 1)
		require.LessOrEqual(t, coldBatch, outbox.ContinueTurns+1, "the cold key's head goes out within a round of turns, not after the hot key's 20 batches")
		require.Zero(t, inner.outOfOrder, "nothing delivered out of order")
	})
}

// keyOrderFunc is a transport that keeps key order and publishes with publish.
type keyOrderFunc struct {
	*keyOrderTransport
	publish func(context.Context, []outbox.Delivery) []error
}

func (k keyOrderFunc) Publish(ctx context.Context, batch []outbox.Delivery) []error {
	return k.publish(ctx, batch)
}
