package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/migrations"
)

// foldingDialect is a faultyDialect that keeps the SettleClaimer ability of the built-in
// dialect it wraps, and counts how the publisher settles: folded into the next claim
// (folds) or alone (completes).
type foldingDialect struct {
	*faultyDialect
	folds, foldLost atomic.Int64
	// hang makes CompleteAndClaim announce itself on stdout and wait for its context.
	hang bool
}

func newFoldingDialect(backend string) *foldingDialect {
	return &foldingDialect{faultyDialect: &faultyDialect{Dialect: pubDialect(backend)}}
}

var _ dialect.SettleClaimer = (*foldingDialect)(nil)

func (d *foldingDialect) CompleteAndClaim(ctx context.Context, db *sql.DB, t dialect.Table, o []outbox.Outcome, p dialect.ClaimParams) ([]outbox.Record, []uuid.UUID, error) {
	d.folds.Add(1)
	if d.hang {
		fmt.Println("folding")
		<-ctx.Done()
		return nil, nil, ctx.Err()
	}
	recs, lost, err := d.Dialect.(dialect.SettleClaimer).CompleteAndClaim(ctx, db, t, o, p)
	d.foldLost.Add(int64(len(lost)))
	return recs, lost, err
}

// TestPublisherFoldsSettleIntoClaim: after a full batch the publisher records its outcomes
// with the next claim, one transaction for both; every message is delivered once.
func TestPublisherFoldsSettleIntoClaim(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ids := e.enqueue(t, "fold", 50)
		d := newFoldingDialect(e.backend)
		rec := newRecorder(nil)
		o := fastOptions(t, "fold")
		o.BatchSize = 10
		p, err := outbox.NewPublisher(e.newStore(t, e.db, d), rec.transport("p"), o)
		require.NoError(t, err)
		stop := start(t, p)
		e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == 50 })
		require.Eventually(t, func() bool { return p.Stats().Delivered == 50 }, 10*time.Second, 5*time.Millisecond)
		stop()
		for _, id := range ids {
			require.Equal(t, []int{1}, rec.seen(id))
		}
		// Five full batches: each settled by the claim after it (the fifth by a claim that
		// found nothing), none alone. A loop that stops claiming ahead records the batch it
		// claimed before together with the next one, in that one's settle: two batches, one
		// transaction, so there may be fewer folds than batches, but never a settle alone.
		require.Zero(t, d.completes.Load(), "no batch was settled alone")
		require.GreaterOrEqual(t, d.folds.Load(), int64(3), "each fold recorded one batch or two")
		require.LessOrEqual(t, d.folds.Load(), int64(5))
		require.Equal(t, outbox.PublisherStats{Claimed: 50, Delivered: 50}, p.Stats())
	})
}

// TestPublisherLeaseLostOnFoldedSettle: a full batch whose lease ran out while it was
// published, and which another worker delivered meanwhile, is reported lost by the settle
// folded into the next claim, which overwrites nothing; later rows are delivered as usual.
func TestPublisherLeaseLostOnFoldedSettle(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ids := e.enqueue(t, "foldlost", 2)
		d := newFoldingDialect(e.backend)
		d.skipExtend.Store(true)
		taken := make(chan struct{})
		// The claim made ahead while the batch is published waits for the rival too: on a
		// stalled machine it could run after the lease ran out and take the rows back.
		d.gate = taken
		var calls atomic.Int64
		started := make(chan struct{}, 1)
		rec := newRecorder(nil)
		inner := rec.transport("stale")
		tr := outbox.TransportFunc(func(ctx context.Context, batch []outbox.Delivery) []error {
			if calls.Add(1) == 1 {
				started <- struct{}{}
				select { // hold the first batch until a rival has delivered it
				case <-taken:
				case <-ctx.Done():
				}
			}
			return inner.Publish(ctx, batch)
		})
		o := fastOptions(t, "foldlost")
		o.BatchSize = 2
		o.Lease = 300 * time.Millisecond
		o.PollInterval = 50 * time.Millisecond
		o.Logger = slog.New(slog.DiscardHandler) // lost leases are logged as warnings
		stale, err := outbox.NewPublisher(e.newStore(t, e.db, d), tr, o)
		require.NoError(t, err)
		stop := start(t, stale)
		<-started

		// The rival takes the batch over once its lease has expired, and delivers it.
		until := e.get(t, ids[0]).LockedUntil
		require.Eventually(t, func() bool { return time.Now().After(until.Add(50 * time.Millisecond)) }, 10*time.Second, 10*time.Millisecond)
		rival := e.newStore(t, e.openPool(t), pubDialect(e.backend))
		took, err := rival.Claim(context.Background(), outbox.ClaimOptions{Scope: outbox.Scope{Namespace: "foldlost"},
			Limit: 2, Lease: time.Minute, MaxAttempts: 10, WorkerID: "rival"})
		require.NoError(t, err)
		require.Len(t, took, 2)
		require.NoError(t, rival.Ack(context.Background(), took[0].Lease(), took[1].Lease()))
		close(taken)

		require.Eventually(t, func() bool { return stale.Stats().LeaseLost == 2 }, 10*time.Second, 5*time.Millisecond)
		require.EqualValues(t, 2, d.foldLost.Load(), "the folded settle found the batch lost")
		require.Zero(t, d.completes.Load(), "the batch was settled with the next claim, not alone")
		for _, id := range ids {
			r := e.get(t, id)
			require.Equal(t, outbox.StatusDelivered, r.Status, "the stale worker overwrites nothing")
			require.Equal(t, 2, r.Attempts)
		}

		// Renewals back on, so that the later batch keeps its 300 ms lease on a loaded
		// machine, and is published once.
		d.skipExtend.Store(false)
		later := e.enqueue(t, "foldlost", 2)
		require.Eventually(t, func() bool { return stale.Stats().Delivered == 2 }, 10*time.Second, 5*time.Millisecond)
		stop()
		for _, id := range later {
			require.Equal(t, []int{1}, rec.seen(id))
		}
		require.Equal(t, outbox.PublisherStats{Claimed: 4, Delivered: 2, LeaseLost: 2}, stale.Stats())
	})
}

// TestPublisherCrashBetweenPublishAndFoldedSettle: a publisher killed after publishing a
// batch, before the settle that rides with its next claim commits, loses nothing: the
// published rows keep their lease, and a survivor delivers them again after it expires,
// along with every row never claimed.
func TestPublisherCrashBetweenPublishAndFoldedSettle(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		const n = 12
		ids := e.enqueue(t, "foldcrash", n)

		// SIGKILL between the publish and its settle.
		killHelper(t, e, "reach the folded settle", func(out string) bool { return strings.Contains(out, "folding") }, helperFoldEnv+"=1")

		// The first batch was published, and the second claimed ahead of it while it was in
		// the transport; the first's settle, riding with the claim after them, never committed.
		held := map[uuid.UUID]bool{}
		for _, id := range ids {
			if r := e.get(t, id); r.Status == outbox.StatusProcessing {
				require.Equal(t, "doomed", r.LockedBy)
				held[id] = true
			} else {
				require.Equal(t, outbox.StatusPending, r.Status)
			}
		}
		require.Len(t, held, 10, "the published batch and the one claimed ahead held, not settled")

		rec := newRecorder(nil)
		o := fastOptions(t, "foldcrash")
		o.WorkerID = "survivor"
		p, err := outbox.NewPublisher(e.store, rec.transport("survivor"), o)
		require.NoError(t, err)
		start(t, p)
		e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == n })
		for _, id := range ids {
			want := []int{1}
			if held[id] {
				want = []int{2} // its first attempt was counted by the killed process's claim
			}
			require.Equal(t, want, rec.seen(id))
		}
	})
}

// TestPublisherClaimsWhilePublishing: while a full batch is in a transport that takes a
// while, the claim loop already holds the next one (and records the batch before it), so the
// database's work overlaps the broker's. Every message is still delivered once, in batches
// that never share a row.
func TestPublisherClaimsWhilePublishing(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		const batch = 5
		ids := e.enqueue(t, "overlap", 4*batch)
		var calls atomic.Int64
		overlapped := make(chan bool, 1)
		bg := &goroutineT{} // the transport runs on the publisher's goroutines
		rec := newRecorder(nil)
		inner := rec.transport("p")
		tr := outbox.TransportFunc(func(ctx context.Context, ds []outbox.Delivery) []error {
			switch calls.Add(1) {
			case 1:
				// The loop claims ahead once a publish took long enough to pay for it.
				time.Sleep(100 * time.Millisecond)
			case 2:
				// Hold the second batch until the third is claimed, or give up.
				deadline := time.Now().Add(10 * time.Second)
				for e.counts(bg)[outbox.StatusProcessing] < 2*batch && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				overlapped <- e.counts(bg)[outbox.StatusProcessing] == 2*batch
			}
			return inner.Publish(ctx, ds)
		})
		o := fastOptions(t, "overlap")
		o.BatchSize = batch
		p, err := outbox.NewPublisher(e.store, tr, o)
		require.NoError(t, err)
		stop := start(t, p)
		require.True(t, <-overlapped, "the next batch was claimed while the second was published")
		bg.check(t)
		e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == 4*batch })
		require.Eventually(t, func() bool { return p.Stats().Delivered == 4*batch }, 10*time.Second, 5*time.Millisecond)
		stop()
		for _, id := range ids {
			require.Equal(t, []int{1}, rec.seen(id))
		}
		require.Equal(t, outbox.PublisherStats{Claimed: 4 * batch, Delivered: 4 * batch}, p.Stats())
	})
}

// orderedFoldingDialect is a foldingDialect that can claim in order, as the built-in
// dialect it wraps.
type orderedFoldingDialect struct{ *foldingDialect }

func (d orderedFoldingDialect) BlockedKeys(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.BlockedKeysParams) ([]outbox.BlockedKey, error) {
	return d.Dialect.(dialect.OrderedClaimer).BlockedKeys(ctx, q, t, p)
}

func (d orderedFoldingDialect) CheckOrdered(ctx context.Context, db *sql.DB, t dialect.Table) error {
	return d.Dialect.(dialect.OrderedClaimer).CheckOrdered(ctx, db, t)
}

// TestPublisherOrderedFoldsWithoutClaimingAhead: an ordered publisher records a full
// batch's outcomes with its next claim, as an unordered one does, but claims that batch
// only once the one before is published, so that it never holds the heads of two batches
// of keys. Every row has a key of its own, so a claim ahead would find heads to take.
func TestPublisherOrderedFoldsWithoutClaimingAhead(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		const batch, n = 10, 30
		ctx := context.Background()
		require.NoError(t, migrations.Up(ctx, e.db, e.backend, migrations.Options{Ordered: true}))
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			msgs[i] = outbox.Message{Namespace: "ordfold", Topic: "t", PartitionKey: fmt.Sprint("key-", i), Payload: []byte(fmt.Sprintf(`{"n": %d}`, i))}
		}
		_, err := e.store.EnqueueStandalone(ctx, msgs...)
		require.NoError(t, err)
		d := orderedFoldingDialect{newFoldingDialect(e.backend)}
		rec := newRecorder(nil)
		inner := rec.transport("p")
		var claimedAhead atomic.Int64
		bg := &goroutineT{} // the transport runs on the publisher's goroutines
		tr := outbox.TransportFunc(func(ctx context.Context, ds []outbox.Delivery) []error {
			// A claim ahead would start now and lease a second batch: give it a second.
			deadline := time.Now().Add(time.Second)
			for time.Now().Before(deadline) {
				if got := e.counts(bg)[outbox.StatusProcessing]; got > len(ds) {
					claimedAhead.Add(1)
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			return inner.Publish(ctx, ds)
		})
		o := fastOptions(t, "ordfold")
		o.BatchSize = batch
		o.Ordered = true
		p, err := outbox.NewPublisher(e.newStore(t, e.db, d), tr, o)
		require.NoError(t, err)
		stop := start(t, p)
		e.waitCounts(t, 60*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == n })
		require.Eventually(t, func() bool { return p.Stats().Delivered == n }, 10*time.Second, 5*time.Millisecond)
		stop()
		bg.check(t)
		require.Zero(t, claimedAhead.Load(), "no batch was claimed while another was published")
		// Three full batches: each settled by the claim after it (the third by a claim that
		// found nothing), none alone.
		require.EqualValues(t, n/batch, d.folds.Load())
		require.Zero(t, d.completes.Load(), "no batch was settled alone")
		require.Equal(t, outbox.PublisherStats{Claimed: n, Delivered: n}, p.Stats())
	})
}

// goroutineT collects the failures of require checks made on a goroutine other than the
// test's (a transport's), where FailNow must not stop the goroutine; check reports them.
type goroutineT struct {
	mu   sync.Mutex
	errs []string
}

func (g *goroutineT) Errorf(format string, args ...any) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.errs = append(g.errs, fmt.Sprintf(format, args...))
}

func (g *goroutineT) FailNow() {}

// check fails t with what the goroutine's checks reported.
func (g *goroutineT) check(t *testing.T) {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	require.Empty(t, g.errs, "checks on the transport's goroutine")
}
