package conformance

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

// runsSetup is orderedSetup for the tests of runs ([dialect.ClaimParams.Runs]): it skips,
// saying so, when the dialect claims heads only, which the contract allows. It finds out
// in a namespace of its own, which the tests' claims do not see.
func runsSetup(t *testing.T, h Harness) *env {
	t.Helper()
	e := orderedSetup(t, h)
	probe := []outbox.Message{keyed("p", 0), keyed("p", 1)}
	for i := range probe {
		probe[i].Namespace = "runs-probe"
	}
	e.enqueue(t, probe...)
	o := runOpts(2)
	o.Namespace = "runs-probe"
	recs := e.claim(t, o)
	if len(recs) < 2 {
		t.Skipf("dialect %s claims heads only (it ignores ClaimParams.Runs)", h.Dialect.Name())
	}
	require.NoError(t, e.store.Ack(e.ctx, leases(recs)...))
	return e
}

func runOpts(limit int) outbox.ClaimOptions {
	o := orderedOpts(limit)
	o.Runs = true
	return o
}

func leases(recs []outbox.Record) []outbox.Lease {
	out := make([]outbox.Lease, len(recs))
	for i, r := range recs {
		out[i] = r.Lease()
	}
	return out
}

// requireRuns checks that recs, one claim, are in (created_at, id) order and that each
// key's rows are the first ones of want[key] not in done, in sequence: a run never skips a
// row of its key.
func requireRuns(t *testing.T, recs []outbox.Record, want map[string][]uuid.UUID, done map[uuid.UUID]bool) {
	t.Helper()
	for i := 1; i < len(recs); i++ {
		a, b := recs[i-1], recs[i]
		require.False(t, b.CreatedAt.Before(a.CreatedAt) || b.CreatedAt.Equal(a.CreatedAt) && string(b.ID[:]) < string(a.ID[:]),
			"the claimed records are in (created_at, id) order")
	}
	next := map[string]int{}
	for k, ids := range want {
		for next[k] < len(ids) && done[ids[next[k]]] {
			next[k]++
		}
	}
	for _, r := range recs {
		if r.PartitionKey == "" {
			continue
		}
		ids := want[r.PartitionKey]
		require.Less(t, next[r.PartitionKey], len(ids), "key %s: more rows than it has", r.PartitionKey)
		require.Equal(t, ids[next[r.PartitionKey]], r.ID, "key %s: its run comes in sequence, skipping no row", r.PartitionKey)
		next[r.PartitionKey]++
	}
}

// A key's waiting rows come back together, in sequence, with the heads of other keys and
// the rows without a key; the claims after them find the keys in flight.
func testRunsInSequence(t *testing.T, h Harness) {
	e := runsSetup(t, h)
	a := resultIDs(e.enqueue(t, keyed("a", 0), keyed("a", 1), keyed("a", 2)))
	rest := resultIDs(e.enqueue(t, keyed("b", 0), msg(7), keyed("a", 3), keyed("b", 1)))
	b := []uuid.UUID{rest[0], rest[3]}
	a = append(a, rest[2])
	want := map[string][]uuid.UUID{"a": a, "b": b}

	recs := e.claim(t, runOpts(100))
	require.Len(t, recs, 7, "every row: both keys' runs and the row without a key")
	requireRuns(t, recs, want, nil)
	for _, r := range recs {
		require.Equal(t, outbox.StatusProcessing, r.Status)
		require.Equal(t, recs[0].LeaseToken, r.LeaseToken, "one claim, one token")
		require.Equal(t, 1, r.Attempts)
	}
	require.Empty(t, e.claim(t, runOpts(100)), "the keys are in flight")
	require.Equal(t, outbox.StatusProcessing, e.get(t, a[3]).Status)
}

// Limit counts every row of every run; each key's share of it is a prefix of its rows
// (how the batch is shared among the keys is the dialect's choice), and what is left is
// claimed, in sequence, once the first rows are settled.
func testRunsLimit(t *testing.T, h Harness) {
	e := runsSetup(t, h)
	var msgs []outbox.Message
	for i := range 6 {
		msgs = append(msgs, keyed("a", i), keyed("b", i), keyed("c", i))
	}
	res := resultIDs(e.enqueue(t, msgs...))
	want := map[string][]uuid.UUID{}
	for i, id := range res {
		k := string(rune('a' + i%3))
		want[k] = append(want[k], id)
	}
	done := map[uuid.UUID]bool{}
	for claims := 0; len(done) < len(res); claims++ {
		require.Less(t, claims, 20, "the rows are claimed in a few claims")
		recs := e.claim(t, runOpts(5))
		require.NotEmpty(t, recs, "rows are waiting and no key is in flight")
		require.LessOrEqual(t, len(recs), 5, "Limit holds across the keys")
		requireRuns(t, recs, want, done)
		require.Empty(t, e.claim(t, runOpts(5)), "every key is in flight")
		require.NoError(t, e.store.Ack(e.ctx, leases(recs)...))
		for _, r := range recs {
			done[r.ID] = true
		}
	}
}

// A hot key among cold ones fills what the cold keys leave of the batch: a run claim comes
// back short of Limit only when no key in it has a claimable row left.
func testRunsFillBatch(t *testing.T, h Harness) {
	e := runsSetup(t, h)
	var msgs []outbox.Message
	for i := range 4 {
		cold := fmt.Sprintf("cold%d", i)
		msgs = append(msgs, keyed(cold, 0), keyed(cold, 1))
	}
	for i := range 20 {
		msgs = append(msgs, keyed("hot", i))
	}
	res := resultIDs(e.enqueue(t, msgs...))
	want := map[string][]uuid.UUID{}
	for i, m := range msgs {
		want[m.PartitionKey] = append(want[m.PartitionKey], res[i])
	}
	recs := e.claim(t, runOpts(12))
	requireRuns(t, recs, want, nil)
	require.Len(t, recs, 12, "the hot key's rows fill what the four cold keys' two rows each leave")
}

// With RunShare, a claim takes the runs of its share of the keys whose heads it finds,
// rounded up, and leaves the others to the next claimer: never none of a lone key. It
// skips, saying so, when the dialect ignores RunShare, which the contract allows.
func testRunsShare(t *testing.T, h Harness) {
	e := runsSetup(t, h)
	var msgs []outbox.Message
	for i := range 3 {
		msgs = append(msgs, keyed("a", i), keyed("b", i), keyed("c", i), keyed("d", i))
	}
	res := resultIDs(e.enqueue(t, msgs...))
	want := map[string][]uuid.UUID{}
	for i, m := range msgs {
		want[m.PartitionKey] = append(want[m.PartitionKey], res[i])
	}
	o := runOpts(100)
	o.RunShare = 2
	keysOf := func(recs []outbox.Record) []string {
		var keys []string
		for _, r := range recs {
			if len(keys) == 0 || keys[len(keys)-1] != r.PartitionKey {
				keys = append(keys, r.PartitionKey)
			}
		}
		return keys
	}
	first := e.claim(t, o)
	requireRuns(t, first, want, nil)
	if len(first) == 12 {
		t.Skipf("dialect %s takes every key (it ignores ClaimParams.RunShare)", h.Dialect.Name())
	}
	keys := map[string]bool{}
	for _, r := range first {
		keys[r.PartitionKey] = true
	}
	require.Len(t, keys, 2, "half of the four keys, each with its whole run")
	require.Len(t, first, 6)
	second := e.claim(t, o)
	requireRuns(t, second, want, nil)
	require.Len(t, second, 3, "half of the two keys left: one, with its run")
	require.Len(t, keysOf(second), 1)
	third := e.claim(t, o)
	requireRuns(t, third, want, nil)
	require.Len(t, third, 3, "the lone key left is taken, not left for a share of none")
	require.Empty(t, e.claim(t, o), "every key is in flight")
}

// A run stops at a row of its key in flight: a dead row replayed becomes the key's head
// again while the row after it is being delivered, and is claimed alone.
func testRunsStopAtInFlight(t *testing.T, h Harness) {
	e := runsSetup(t, h)
	admin := requireAdmin(t, e)
	k := resultIDs(e.enqueue(t, keyed("k", 0), keyed("k", 1), keyed("k", 2), keyed("k", 3)))
	recs := e.claim(t, orderedOpts(1))
	require.Equal(t, []uuid.UUID{k[0]}, ids(recs))
	require.NoError(t, e.store.Nack(e.ctx, outbox.RetryPolicy{}, outbox.Failure{
		Lease: recs[0].Lease(), Attempts: 1, Err: outbox.Permanent(errors.New("rejected"))}))
	skip := orderedOpts(1)
	skip.OrderedSkipDead = true
	inFlight := e.claim(t, skip)
	require.Equal(t, []uuid.UUID{k[1]}, ids(inFlight), "the row after the dead one")

	_, err := admin.Replay(e.ctx, k[0])
	require.NoError(t, err)
	recs = e.claim(t, runOpts(10))
	require.Equal(t, []uuid.UUID{k[0]}, ids(recs), "the replayed head alone: the next row is in flight, and the run stops there")

	require.NoError(t, e.store.Ack(e.ctx, recs[0].Lease(), inFlight[0].Lease()))
	require.Equal(t, k[2:], ids(e.claim(t, runOpts(10))))
}

// A run stops at a dead row of its key, and passes over it with OrderedSkipDead.
func testRunsStopAtDead(t *testing.T, h Harness) {
	e := runsSetup(t, h)
	k := resultIDs(e.enqueue(t, keyed("k", 0), keyed("k", 1), keyed("k", 2), keyed("k", 3)))
	// An unordered claim takes the key's first two rows; the first goes back for a retry
	// due at once, the second dies.
	recs := e.claim(t, claimOpts(2, time.Minute))
	require.Equal(t, k[:2], ids(recs))
	require.NoError(t, e.store.Nack(e.ctx, outbox.RetryPolicy{}, outbox.Failure{
		Lease: recs[1].Lease(), Attempts: 1, Err: outbox.Permanent(errors.New("rejected"))}))
	requireDueRetry(t, e, recs[0])

	got := e.claim(t, runOpts(10))
	require.Equal(t, []uuid.UUID{k[0]}, ids(got), "the head alone: the dead row after it holds the rest back")
	requireDueRetry(t, e, got[0])

	o := runOpts(10)
	o.OrderedSkipDead = true
	require.Equal(t, []uuid.UUID{k[0], k[2], k[3]}, ids(e.claim(t, o)), "with OrderedSkipDead the run passes over the dead row")
}

// requireDueRetry puts r back to pending, due at once, and waits until it is.
func requireDueRetry(t *testing.T, e *env, r outbox.Record) {
	t.Helper()
	require.NoError(t, e.store.Nack(e.ctx, outbox.RetryPolicy{}, outbox.Failure{
		Lease: r.Lease(), Attempts: r.Attempts, Err: outbox.RetryAfter(errors.New("later"), time.Millisecond)}))
	eventually(t, 5*time.Second, "the retry to fall due", func() bool {
		return e.get(t, r.ID).NextAttemptAt.Before(time.Now().Add(-5 * time.Millisecond))
	})
}

// A run stops at a row of its key that is not due yet (waiting for a retry), and takes
// nothing after it.
func testRunsStopAtNotDue(t *testing.T, h Harness) {
	e := runsSetup(t, h)
	k := resultIDs(e.enqueue(t, keyed("k", 0), keyed("k", 1), keyed("k", 2)))
	recs := e.claim(t, claimOpts(2, time.Minute))
	require.Equal(t, k[:2], ids(recs))
	require.NoError(t, e.store.Nack(e.ctx, outbox.RetryPolicy{}, outbox.Failure{
		Lease: recs[1].Lease(), Attempts: 1, Err: outbox.RetryAfter(errors.New("later"), time.Hour)}))
	requireDueRetry(t, e, recs[0])
	require.Equal(t, []uuid.UUID{k[0]}, ids(e.claim(t, runOpts(10))), "the head alone: the next row is not due")
}

// Concurrent claimers with runs never hold rows of one key at once, and every key is
// delivered in sequence.
func testRunsConcurrent(t *testing.T, h Harness) {
	e := runsSetup(t, h)
	const keys, per, workers = 8, 25, 4
	var msgs []outbox.Message
	for i := range per {
		for k := range keys {
			msgs = append(msgs, keyed(fmt.Sprintf("k%d", k), i))
		}
	}
	res := resultIDs(e.enqueue(t, msgs...))
	want := map[string][]uuid.UUID{}
	for i, id := range res {
		k := fmt.Sprintf("k%d", i%keys)
		want[k] = append(want[k], id)
	}
	var (
		mu     sync.Mutex
		holder = map[string]int{} // key → worker holding rows of it
		done   = map[uuid.UUID]bool{}
	)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			o := runOpts(7)
			o.WorkerID = fmt.Sprintf("worker-%d", w)
			for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
				mu.Lock()
				finished := len(done) == len(res)
				mu.Unlock()
				if finished {
					return
				}
				recs, err := e.store.Claim(e.ctx, o)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for _, r := range recs {
					if hw, ok := holder[r.PartitionKey]; ok && hw != w {
						mu.Unlock()
						errs <- fmt.Errorf("key %s claimed by worker %d while worker %d holds rows of it", r.PartitionKey, w, hw)
						return
					}
				}
				for _, r := range recs {
					holder[r.PartitionKey] = w
				}
				// Each key's rows must follow the ones delivered before them.
				if err := runsInSequence(recs, want, done); err != nil {
					mu.Unlock()
					errs <- err
					return
				}
				for _, r := range recs {
					delete(holder, r.PartitionKey) // before the ack that lets another worker in
					done[r.ID] = true
				}
				mu.Unlock()
				if len(recs) > 0 {
					if err := e.store.Ack(e.ctx, leases(recs)...); err != nil {
						errs <- err
						return
					}
				}
			}
			errs <- errors.New("not every row was delivered within a minute")
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, done, len(res))
}

// runsInSequence is requireRuns for a goroutine that is not the test's.
func runsInSequence(recs []outbox.Record, want map[string][]uuid.UUID, done map[uuid.UUID]bool) error {
	next := map[string]int{}
	for k, ids := range want {
		for next[k] < len(ids) && done[ids[next[k]]] {
			next[k]++
		}
	}
	for _, r := range recs {
		ids := want[r.PartitionKey]
		if next[r.PartitionKey] >= len(ids) || ids[next[r.PartitionKey]] != r.ID {
			return fmt.Errorf("key %s: row %s claimed out of sequence", r.PartitionKey, r.ID)
		}
		next[r.PartitionKey]++
	}
	return nil
}

// Settling a key's run and claiming in one transaction returns the key's next run.
func testRunsSettleAndClaim(t *testing.T, h Harness) {
	e := runsSetup(t, h)
	if _, ok := e.h.Dialect.(dialect.SettleClaimer); !ok {
		t.Skipf("dialect %s does not implement dialect.SettleClaimer", h.Dialect.Name())
	}
	var msgs []outbox.Message
	for i := range 6 {
		msgs = append(msgs, keyed("k", i))
	}
	k := resultIDs(e.enqueue(t, msgs...))
	first := e.claim(t, runOpts(3))
	require.Equal(t, k[:3], ids(first))
	next, lost, err := e.store.CompleteAndClaim(e.ctx, acks(first), runOpts(3))
	require.NoError(t, err)
	require.Empty(t, lost)
	require.Equal(t, k[3:], ids(next), "the key's next run, claimed in the settle's transaction")
	for _, id := range k[:3] {
		require.Equal(t, outbox.StatusDelivered, e.get(t, id).Status)
	}
}
