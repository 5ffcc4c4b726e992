package dialecttest

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

// The ordered claim's plans, per backend, on a backlog of OrderedPlanRows rows spread over
// 1000 partition keys in turn (OUTBOX_ORDERED_PLAN_ROWS=1000000 measures the large case by
// hand). Half the keys have their head in flight, so that the claim passes rows it may not
// take, as it does in a burn-down.

const OrderedPlanKeys = 1000

// Default backlogs of the ordered plan tests. PostgreSQL and MariaDB choose their plans
// from the table's statistics, so they plan on a table of some size; SQLite's statements
// name their indexes (INDEXED BY), so its plan is the same on 4,000 rows as on 20,000, which
// its pure-Go engine takes minutes to write under the race detector.
const (
	OrderedPlanRowsServer = 20000
	OrderedPlanRowsSQLite = 4000
)

// OrderedPlanCtx bounds a plan test on rows rows: the default backlog takes seconds, a
// million rows minutes.
func OrderedPlanCtx(t *testing.T, rows int) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute+time.Duration(rows)*time.Millisecond)
	t.Cleanup(cancel)
	return ctx
}

// OrderedPlanRows returns OUTBOX_ORDERED_PLAN_ROWS when set, else def.
func OrderedPlanRows(t *testing.T, def int) int {
	if v := os.Getenv("OUTBOX_ORDERED_PLAN_ROWS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		return n
	}
	return def
}

// OrderedBacklog enqueues rows messages, key i%OrderedPlanKeys for the i-th, 1000 per
// transaction; then claims every key's head in order and acks every other one, so that the
// next heads of half the keys are due while the other half are held back by a row in flight.
func OrderedBacklog(ctx context.Context, t *testing.T, s *outbox.Store, rows int) {
	t.Helper()
	start := time.Now()
	for i := 0; i < rows; i += 1000 {
		msgs := make([]outbox.Message, min(1000, rows-i))
		for j := range msgs {
			msgs[j] = outbox.Message{Namespace: "orders", Topic: "order.changed",
				PartitionKey: fmt.Sprintf("order-%04d", (i+j)%OrderedPlanKeys), Payload: json.RawMessage(`{"v":1}`)}
		}
		_, err := s.EnqueueStandalone(ctx, msgs...)
		require.NoError(t, err)
	}
	t.Logf("enqueued %d rows in %s", rows, time.Since(start))
	o := OrderedClaimOpts(outbox.MaxBatch)
	heads, err := s.Claim(ctx, o)
	require.NoError(t, err)
	require.Len(t, heads, min(rows, OrderedPlanKeys), "one head per key")
	var acks []outbox.Lease
	for i, r := range heads {
		if i%2 == 0 {
			acks = append(acks, r.Lease())
		}
	}
	require.NoError(t, s.Ack(ctx, acks...))
}

// UpOrdered adds the ordered migration set, which ordered claims need, to the default table
// of a database its setup migrated without it.
func UpOrdered(ctx context.Context, t *testing.T, db *sql.DB, backend string) {
	t.Helper()
	require.NoError(t, migrations.Up(ctx, db, backend, migrations.Options{Ordered: true}))
}

func OrderedClaimOpts(limit int) outbox.ClaimOptions {
	return outbox.ClaimOptions{Limit: limit, Lease: time.Hour, MaxAttempts: 5, WorkerID: "plan", Ordered: true,
		Scope: outbox.Scope{Namespace: "orders"}}
}

// TimeOrderedClaim claims 100 rows in order and logs how long it took and the unordered
// claim after it, on the same backlog.
func TimeOrderedClaim(ctx context.Context, t *testing.T, s *outbox.Store) []outbox.Record {
	t.Helper()
	start := time.Now()
	recs, err := s.Claim(ctx, OrderedClaimOpts(100))
	require.NoError(t, err)
	ordered := time.Since(start)
	require.Len(t, recs, 100)
	keys := map[string]bool{}
	for _, r := range recs {
		require.False(t, keys[r.PartitionKey], "two rows of %s in one claim", r.PartitionKey)
		keys[r.PartitionKey] = true
	}
	o := OrderedClaimOpts(100)
	o.Ordered = false
	start = time.Now()
	_, err = s.Claim(ctx, o)
	require.NoError(t, err)
	t.Logf("claim of 100: ordered %s, unordered %s", ordered, time.Since(start))
	return recs
}

// TimeHeldBackClaim takes every remaining head, so that every key has a row in flight, and
// logs how long an ordered claim then takes to find nothing: the walk passes only held-back
// rows, and the key visit finds no due head (see docs/ordering.md, What it costs). It is a
// measurement, not a limit.
func TimeHeldBackClaim(ctx context.Context, t *testing.T, s *outbox.Store, rows int) {
	t.Helper()
	for {
		recs, err := s.Claim(ctx, OrderedClaimOpts(outbox.MaxBatch))
		require.NoError(t, err)
		if len(recs) == 0 {
			break
		}
	}
	start := time.Now()
	recs, err := s.Claim(ctx, OrderedClaimOpts(100))
	require.NoError(t, err)
	require.Empty(t, recs)
	t.Logf("ordered claim with every key in flight, %d rows: nothing, in %s", rows, time.Since(start))
}
