package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
)

var concurrencyTests = []test{
	{"NoDoubleClaim", testNoDoubleClaim},
	{"ClaimsRacingEnqueues", testClaimsRacingEnqueues},
	{"OneConnectionPool", testOneConnectionPool},
}

const claimers = 8

// claimLog counts how often each row was claimed.
type claimLog struct {
	mu     sync.Mutex
	counts map[uuid.UUID]int
	total  atomic.Int64
}

func (l *claimLog) add(recs []outbox.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range recs {
		l.counts[r.ID]++
	}
	l.total.Add(int64(len(recs)))
}

func (l *claimLog) requireEachOnce(t *testing.T, want []uuid.UUID) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, n := range l.counts {
		require.Equal(t, 1, n, "row %s claimed %d times under a live lease", id, n)
	}
	for _, id := range want {
		require.Equal(t, 1, l.counts[id], "row %s claimed %d times", id, l.counts[id])
	}
	require.Len(t, l.counts, len(want))
}

func testNoDoubleClaim(t *testing.T, h Harness) {
	e := setup(t, h)
	const rows = 3000
	var want []uuid.UUID
	for start := 0; start < rows; start += 500 {
		for _, r := range e.enqueue(t, messages(500)...) {
			want = append(want, r.ID)
		}
	}
	log := &claimLog{counts: map[uuid.UUID]int{}}
	deadline := time.Now().Add(90 * time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, claimers)
	for w := range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := outbox.ClaimOptions{Limit: 37, Lease: 10 * time.Minute, MaxAttempts: 5, WorkerID: fmt.Sprintf("worker-%d", w)}
			for log.total.Load() < rows && time.Now().Before(deadline) {
				recs, err := e.store.Claim(e.ctx, o)
				if err != nil {
					errs <- fmt.Errorf("%s: %w", o.WorkerID, err)
					return
				}
				log.add(recs)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	log.requireEachOnce(t, want)
	require.Equal(t, rows, e.count(t, outbox.StatusProcessing))
}

func testClaimsRacingEnqueues(t *testing.T, h Harness) {
	e := setup(t, h)
	const producers, perProducer, perTx = 4, 200, 4
	const rows = producers * perProducer
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		want     []uuid.UUID
		produced atomic.Bool
		log      = &claimLog{counts: map[uuid.UUID]int{}}
		errs     = make(chan error, producers+claimers)
		deadline = time.Now().Add(90 * time.Second)
	)
	var pg sync.WaitGroup
	for p := range producers {
		pg.Add(1)
		go func() {
			defer pg.Done()
			for i := 0; i < perProducer; i += perTx {
				batch := messages(perTx)
				for j := range batch {
					if j%2 == 0 {
						batch[j].DedupeKey = fmt.Sprintf("p%d-%d", p, i+j)
					}
				}
				err := func() error {
					tx, err := e.db.BeginTx(e.ctx, nil)
					if err != nil {
						return err
					}
					defer func() { _ = tx.Rollback() }()
					res, err := e.store.EnqueueBatch(e.ctx, tx, batch)
					if err != nil {
						return err
					}
					if err := tx.Commit(); err != nil {
						return err
					}
					mu.Lock()
					for _, r := range res {
						want = append(want, r.ID)
					}
					mu.Unlock()
					return nil
				}()
				if err != nil {
					errs <- fmt.Errorf("producer %d: %w", p, err)
					return
				}
			}
		}()
	}
	for w := range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := outbox.ClaimOptions{Limit: 10, Lease: 10 * time.Minute, MaxAttempts: 5, WorkerID: fmt.Sprintf("worker-%d", w)}
			for time.Now().Before(deadline) {
				done := produced.Load()
				recs, err := e.store.Claim(e.ctx, o)
				if err != nil {
					errs <- fmt.Errorf("%s claim: %w", o.WorkerID, err)
					return
				}
				log.add(recs)
				if len(recs) > 0 {
					leases := make([]outbox.Lease, len(recs))
					for i, r := range recs {
						leases[i] = r.Lease()
					}
					if err := e.store.Ack(e.ctx, leases...); err != nil {
						errs <- fmt.Errorf("%s ack: %w", o.WorkerID, err)
						return
					}
				}
				if done && log.total.Load() >= rows {
					return
				}
			}
		}()
	}
	pg.Wait()
	produced.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	log.requireEachOnce(t, want)
	require.Equal(t, rows, e.count(t, outbox.StatusDelivered))
}

// testOneConnectionPool runs every call of the store, and so every write of the dialect and
// of its abilities, on a pool of one connection. A call that holds the pool's connection
// while it asks the pool for another (a statement prepared on the pool inside a
// transaction, say) waits forever there; each call gets a deadline and must return within
// it.
func testOneConnectionPool(t *testing.T, h Harness) {
	e := setup(t, h)
	e.db.SetMaxOpenConns(1)
	const within = 30 * time.Second
	// do runs one call and fails the test if it does not return in time.
	do := func(what string, fn func(ctx context.Context) error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(e.ctx, within)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- fn(ctx) }()
		select {
		case err := <-done:
			require.NoError(t, err, "%s on a one-connection pool", what)
		case <-time.After(within + 5*time.Second):
			t.Fatalf("%s did not return within %s on a one-connection pool: it waits for a second connection while holding the only one", what, within)
		}
	}
	ok := func(err error) error {
		if errors.Is(err, errors.ErrUnsupported) {
			return nil
		}
		return err
	}
	opts := func(ordered bool) outbox.ClaimOptions {
		o := claimOpts(2, time.Minute)
		o.Namespace, o.Ordered = "orders", ordered
		return o
	}
	do("Enqueue", func(ctx context.Context) error {
		tx, err := e.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		for i := range 8 {
			m := msg(i)
			m.DedupeKey, m.PartitionKey = fmt.Sprint("k", i), fmt.Sprint("p", i%2)
			if _, err := e.store.Enqueue(ctx, tx, m); err != nil {
				return err
			}
		}
		return tx.Commit()
	})
	do("EnqueueStandalone", func(ctx context.Context) error {
		_, err := e.store.EnqueueStandalone(ctx, msg(100), msg(101))
		return err
	})
	var recs []outbox.Record
	do("Claim", func(ctx context.Context) (err error) {
		recs, err = e.store.Claim(ctx, opts(false))
		return err
	})
	require.Len(t, recs, 2)
	do("Extend", func(ctx context.Context) error { return e.store.Extend(ctx, time.Minute, recs[0].Lease()) })
	do("Ack", func(ctx context.Context) error { return e.store.Ack(ctx, recs[0].Lease()) })
	do("Nack", func(ctx context.Context) error {
		return e.store.Nack(ctx, outbox.RetryPolicy{BaseDelay: time.Hour, MaxDelay: time.Hour, MaxAttempts: 5},
			outbox.Failure{Lease: recs[1].Lease(), Attempts: recs[1].Attempts, Err: errors.New("boom")})
	})
	// Twice, so that the second runs with whatever the first left prepared.
	for range 2 {
		do("CompleteAndClaim", func(ctx context.Context) error {
			got, err := e.store.Claim(ctx, opts(false))
			if err != nil || len(got) == 0 {
				return err
			}
			outs := make([]outbox.Outcome, len(got))
			for i, r := range got {
				outs[i] = outbox.Outcome{Lease: r.Lease(), Status: outbox.StatusDelivered}
			}
			_, _, err = e.store.CompleteAndClaim(ctx, outs, opts(false))
			return ok(err)
		})
	}
	do("Bury", func(ctx context.Context) error {
		_, err := e.store.Bury(ctx, outbox.Scope{Namespace: "orders"}, 1, 10)
		return err
	})
	do("BuryExpired", func(ctx context.Context) error {
		_, err := e.store.BuryExpired(ctx, outbox.Scope{Namespace: "orders"}, 1, 10)
		return err
	})
	do("Get", func(ctx context.Context) error { _, err := e.store.Get(ctx, recs[0].ID); return err })
	do("Check", func(ctx context.Context) error { return ok(e.store.Check(ctx)) })
	do("ordered Claim and BlockedKeys", func(ctx context.Context) error {
		if _, err := e.store.Claim(ctx, opts(true)); ok(err) != nil {
			return err
		}
		_, err := e.store.BlockedKeys(ctx, outbox.Scope{Namespace: "orders"}, 10)
		return ok(err)
	})
	do("Stats", func(ctx context.Context) error { _, err := e.store.Stats(ctx, outbox.Scope{}); return ok(err) })
	var dead []outbox.Record
	do("ListDead", func(ctx context.Context) error {
		page, err := e.store.ListDead(ctx, outbox.ListDeadOptions{})
		dead = page.Records
		return ok(err)
	})
	if len(dead) > 0 {
		do("Replay", func(ctx context.Context) error { _, err := e.store.Replay(ctx, dead[0].ID); return ok(err) })
		do("ReplayWhere", func(ctx context.Context) error {
			_, err := e.store.ReplayWhere(ctx, outbox.DeadFilter{})
			return ok(err)
		})
		do("Discard", func(ctx context.Context) error { _, err := e.store.Discard(ctx, dead[0].ID); return ok(err) })
	}
	do("Purge", func(ctx context.Context) error {
		_, err := e.store.Purge(ctx, outbox.PurgeOptions{DeliveredOlderThan: time.Nanosecond, DeadOlderThan: time.Nanosecond})
		return ok(err)
	})
}
