package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/testdb"
)

// TestAdminStatsEstimate: beyond StatsDeliveredSample delivered rows, on a table whose
// topic mix changed (the namespace billing busy an hour ago, shop busy now), every
// per-topic delivered count is exact since Stats.DeliveredSince, never a share of an
// estimate; the unscoped total is an estimate, said so, within a quarter of the truth; a
// scoped total is exact since then; live counts stay exact.
func TestAdminStatsEstimate(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ctx := context.Background()
		deliver := func(ns string, n int) map[string]int64 {
			per := map[string]int64{}
			for lo := 0; lo < n; lo += outbox.MaxBatch {
				var msgs []outbox.Message
				for i := lo; i < min(lo+outbox.MaxBatch, n); i++ {
					topic := fmt.Sprint(ns, ".t", i%4)
					per[topic]++
					msgs = append(msgs, outbox.Message{Namespace: ns, Topic: topic, Payload: json.RawMessage(`{}`)})
				}
				_, err := e.store.EnqueueStandalone(ctx, msgs...)
				require.NoError(t, err)
				recs, err := e.store.Claim(ctx, outbox.ClaimOptions{Scope: outbox.Scope{Namespace: ns}, Limit: len(msgs), Lease: time.Minute, MaxAttempts: 5, WorkerID: "est"})
				require.NoError(t, err)
				leases := make([]outbox.Lease, len(recs))
				for i := range recs {
					leases[i] = recs[i].Lease()
				}
				require.NoError(t, e.store.Ack(ctx, leases...))
			}
			return per
		}
		billing := deliver("billing", 2921)
		// An hour ago: a test fixture moves the settle times back, as an hour would have.
		shift := map[string]string{
			"postgres": `UPDATE outbox_events SET updated_at = updated_at - interval '1 hour'`,
			"mysql":    `UPDATE outbox_events SET updated_at = DATE_SUB(updated_at, INTERVAL 1 HOUR)`,
			"sqlite":   `UPDATE outbox_events SET updated_at = updated_at - 3600000000`,
		}[e.backend]
		_, err := e.db.ExecContext(ctx, shift)
		require.NoError(t, err)
		shop := deliver("shop", 1902)
		_, err = e.store.EnqueueStandalone(ctx, outbox.Message{Namespace: "shop", Topic: "shop.t0", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
		switch e.backend {
		case "postgres":
			_, err = e.db.ExecContext(ctx, `ANALYZE outbox_events`)
		case "mysql":
			_, err = e.db.ExecContext(ctx, `ANALYZE TABLE outbox_events`)
		}
		require.NoError(t, err)

		st, err := e.store.Stats(ctx, outbox.Scope{})
		require.NoError(t, err)
		require.EqualValues(t, 1, st.Pending, "live rows are counted exactly")
		require.True(t, st.DeliveredEstimated)
		require.InDelta(t, 2921+1902, st.Delivered, (2921+1902)/4, "the estimate is within a quarter of the truth")
		require.False(t, st.DeliveredSince.IsZero())
		require.WithinDuration(t, time.Now().Add(-time.Hour), st.DeliveredSince, 5*time.Minute, "the window reaches back to billing's last rows")
		var billingSeen int64
		for _, tp := range st.Topics {
			if tp.Namespace == "shop" {
				require.Equal(t, shop[tp.Topic], tp.Delivered, "%s: every row since DeliveredSince, exactly", tp.Topic)
			} else {
				require.LessOrEqual(t, tp.Delivered, billing[tp.Topic])
				billingSeen += tp.Delivered
			}
		}
		require.LessOrEqual(t, billingSeen, int64(outbox.StatsDeliveredSample-1902), "only billing's rows since DeliveredSince")

		st, err = e.store.Stats(ctx, outbox.Scope{Namespace: "shop"})
		require.NoError(t, err)
		require.False(t, st.DeliveredEstimated, "a scoped total is exact since DeliveredSince")
		require.EqualValues(t, 1902, st.Delivered)
	})
}

// filterBlind is an Admin that cannot filter dead rows by their error, as the dialect.Admin
// checklist allows: it says so with errors.ErrUnsupported.
type filterBlind struct {
	outbox.Dialect
	dialect.Admin
}

func (d filterBlind) ListDead(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ListDeadParams) ([]outbox.Record, error) {
	if p.ErrorContains != "" || p.LastError != "" {
		return nil, fmt.Errorf("no error filters: %w", errors.ErrUnsupported)
	}
	return d.Admin.ListDead(ctx, q, t, p)
}

// TestErrorFilterUnsupported: a dialect that cannot filter by the error says so, and
// ReplayWhere and DiscardWhere then return its error and change nothing, rather than
// replaying or discarding more rows than the filter selects.
func TestErrorFilterUnsupported(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Migrated(t, "sqlite")
	d := outbox.SQLite()
	store, err := outbox.New(db, filterBlind{d, d.(dialect.Admin)}, outbox.Options{})
	require.NoError(t, err)
	_, err = store.EnqueueStandalone(ctx, outbox.Message{Namespace: "n", Topic: "t", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	recs, err := store.Claim(ctx, outbox.ClaimOptions{Limit: 1, Lease: time.Minute, MaxAttempts: 5, WorkerID: "w"})
	require.NoError(t, err)
	require.Len(t, recs, 1)
	require.NoError(t, store.Complete(ctx, outbox.Outcome{Lease: recs[0].Lease(), Status: outbox.StatusDead, Error: "timeout"}))

	f := outbox.DeadFilter{ErrorContains: "other"}
	_, err = store.ListDead(ctx, outbox.ListDeadOptions{DeadFilter: f})
	require.ErrorIs(t, err, errors.ErrUnsupported)
	_, err = store.ReplayWhere(ctx, f)
	require.ErrorIs(t, err, errors.ErrUnsupported)
	_, err = store.DiscardWhere(ctx, outbox.DeadFilter{LastError: "other"})
	require.ErrorIs(t, err, errors.ErrUnsupported)
	r, err := store.Get(ctx, recs[0].ID)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDead, r.Status, "an unsupported filter changes nothing")
	page, err := store.ListDead(ctx, outbox.ListDeadOptions{})
	require.NoError(t, err, "without an error filter the dialect lists")
	require.Len(t, page.Records, 1)
}

// TestStatsOldestUndelivered: an event stuck behind an outage (each probe gives its attempt
// back and moves next_attempt_at forward) leaves the due set, so the oldest pending age
// stays zero, while the oldest undelivered age counts from its enqueue; an event delayed
// and never claimed counts from when it is due, so a delay alone raises no age.
func TestStatsOldestUndelivered(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ctx := context.Background()
		_, err := e.store.EnqueueStandalone(ctx, outbox.Message{Namespace: "n", Topic: "stuck", Payload: json.RawMessage(`{}`)},
			outbox.Message{Namespace: "n", Topic: "later", Payload: json.RawMessage(`{}`), Delay: time.Hour})
		require.NoError(t, err)
		start := time.Now()
		probe := func() {
			recs, err := e.store.Claim(ctx, outbox.ClaimOptions{Limit: 10, Lease: time.Minute, MaxAttempts: 5, WorkerID: "probe"})
			require.NoError(t, err)
			require.Len(t, recs, 1)
			require.NoError(t, e.store.Nack(ctx, outbox.DefaultRetryPolicy(), outbox.Failure{Lease: recs[0].Lease(), Attempts: recs[0].Attempts,
				Err: outbox.RetryAfter(outbox.Unavailable(errors.New("nats: no stream")), time.Hour)}))
		}
		probe()
		// Poll until the database clock has moved well past the enqueue.
		deadline := time.Now().Add(30 * time.Second)
		var st outbox.Stats
		for {
			st, err = e.store.Stats(ctx, outbox.Scope{})
			require.NoError(t, err)
			if st.OldestUndeliveredAge >= 300*time.Millisecond {
				break
			}
			require.True(t, time.Now().Before(deadline), "the oldest undelivered age does not grow: %v", st.OldestUndeliveredAge)
			time.Sleep(20 * time.Millisecond)
		}
		require.Zero(t, st.OldestPendingAge, "the probe moved the row out of the due set")
		require.EqualValues(t, 0, st.Pending)
		require.EqualValues(t, 2, st.Scheduled)
		require.LessOrEqual(t, st.OldestUndeliveredAge, time.Since(start)+time.Second, "from the enqueue, not before")
		for _, tp := range st.Topics {
			if tp.Topic == "later" {
				require.Zero(t, tp.OldestUndeliveredAge, "a delayed event never claimed is not due yet")
			}
		}
	})
}
