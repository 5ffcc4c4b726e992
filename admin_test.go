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

// TestAdminStatsEstimate: beyond StatsDeliveredSample delivered rows, Stats says its
// delivered counts are estimates, keeps the others exact, and estimates from the
// database's statistics within reason.
func TestAdminStatsEstimate(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ctx := context.Background()
		n := outbox.StatsDeliveredSample + 1000
		msgs := make([]outbox.Message, 1000)
		for i := range msgs {
			msgs[i] = outbox.Message{Namespace: "est", Topic: fmt.Sprint("t", i%2), Payload: json.RawMessage(`{}`)}
		}
		for range n / len(msgs) {
			_, err := e.store.EnqueueStandalone(ctx, msgs...)
			require.NoError(t, err)
		}
		o := outbox.ClaimOptions{Limit: outbox.MaxBatch, Lease: time.Minute, MaxAttempts: 5, WorkerID: "est"}
		for range n / outbox.MaxBatch {
			recs, err := e.store.Claim(ctx, o)
			require.NoError(t, err)
			leases := make([]outbox.Lease, len(recs))
			for i := range recs {
				leases[i] = recs[i].Lease()
			}
			require.NoError(t, e.store.Ack(ctx, leases...))
		}
		_, err := e.store.EnqueueStandalone(ctx, msgs[:10]...)
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
		require.True(t, st.DeliveredEstimated)
		require.EqualValues(t, 10, st.Pending, "live rows are counted exactly")
		require.InDelta(t, n, st.Delivered, float64(n)/2, "estimated from statistics")
		require.Len(t, st.Topics, 2)
		require.InDelta(t, st.Topics[0].Delivered, st.Topics[1].Delivered, float64(n)/4, "shared out by the topics' mix")
	})
}

// adminOnly is a dialect with the admin ability but not the inspection one, as a dialect
// written before the inspection ability existed would be.
type adminOnly struct {
	outbox.Dialect
	dialect.Administrator
}

// TestErrorFilterNeedsInspect: a dialect that may not know the error filters refuses them,
// rather than listing, replaying or discarding more rows than the filter selects.
func TestErrorFilterNeedsInspect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Migrated(t, "sqlite")
	d := outbox.SQLite()
	store, err := outbox.New(db, adminOnly{d, d.(dialect.Administrator)}, outbox.Options{})
	require.NoError(t, err)
	f := outbox.DeadFilter{ErrorContains: "timeout"}
	_, err = store.ListDead(ctx, outbox.ListDeadOptions{DeadFilter: f})
	require.ErrorIs(t, err, errors.ErrUnsupported)
	_, err = store.ReplayWhere(ctx, f)
	require.ErrorIs(t, err, errors.ErrUnsupported)
	_, err = store.DiscardWhere(ctx, outbox.DeadFilter{LastError: "timeout"})
	require.ErrorIs(t, err, errors.ErrUnsupported)
	_, err = store.DeadGroups(ctx, outbox.DeadGroupsOptions{})
	require.ErrorIs(t, err, errors.ErrUnsupported)
	_, err = store.ListDead(ctx, outbox.ListDeadOptions{})
	require.NoError(t, err, "without an error filter the admin ability suffices")
}
