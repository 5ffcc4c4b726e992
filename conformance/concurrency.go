package conformance

import (
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
