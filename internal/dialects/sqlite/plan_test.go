package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/dialects/dialecttest"
	"github.com/outboxgo/outbox/internal/dialects/sqlite"
)

// TestSQLitePurgePlan: each purge batch finds its rows through the partial retention
// index and deletes them by primary key.
func TestSQLitePurgePlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, db := newSQLiteStore(ctx, t)
	dialecttest.PlanRows(ctx, t, store)
	for _, status := range []outbox.Status{outbox.StatusDelivered, outbox.StatusDead} {
		q := sqlite.PurgeSQL(store.Table(), status)
		rows, err := db.QueryContext(ctx, `EXPLAIN QUERY PLAN `+q, time.Hour.Microseconds(), outbox.DefaultPurgeBatch)
		require.NoError(t, err)
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			require.NoError(t, rows.Scan(&id, &parent, &unused, &detail))
			plan = append(plan, detail)
		}
		require.NoError(t, rows.Err())
		require.NoError(t, rows.Close())
		text := strings.Join(plan, "\n")
		t.Logf("purge %s:\n%s", status, text)
		require.Contains(t, text, "INDEX "+outbox.DefaultTable+"_retention_idx (status=? AND updated_at<?)")
		require.NotContains(t, text, "SCAN "+outbox.DefaultTable, "no scan of the table")
		require.NotContains(t, text, "TEMP B-TREE", "the index gives updated_at order")
	}
}

// TestSQLiteInspectPlan: the same on SQLite.
func TestSQLiteInspectPlan(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store, db := newSQLiteStore(ctx, t)
	dialecttest.PlanRows(ctx, t, store)
	for _, f := range []outbox.DeadFilter{{}, dialecttest.InspectFilter} {
		for _, st := range dialecttest.InspectSQL(store.Table(), f, sqlite.DeadGroupsSQL, sqlite.ActivitySQL, sqlite.DedupeKeySQL) {
			rows, err := db.QueryContext(ctx, `EXPLAIN QUERY PLAN `+st.Query, st.Args...)
			require.NoError(t, err, st.Name)
			var plan []string
			for rows.Next() {
				var id, parent, unused int
				var detail string
				require.NoError(t, rows.Scan(&id, &parent, &unused, &detail))
				plan = append(plan, detail)
			}
			require.NoError(t, rows.Err())
			require.NoError(t, rows.Close())
			text := strings.Join(plan, "\n")
			t.Logf("%s:\n%s", st.Name, text)
			want := "INDEX " + outbox.DefaultTable + "_retention_idx (status=?"
			if st.Name == "dedupe key" {
				want = "INDEX " + outbox.DefaultTable + "_dedupe_idx (namespace=? AND topic=? AND dedupe_key=?)"
			}
			require.Contains(t, text, want, st.Name)
			require.NotContains(t, text, "SCAN "+outbox.DefaultTable+"\n", "%s: no scan of the table", st.Name)
			if strings.HasPrefix(st.Name, "activity") {
				require.Contains(t, text, "updated_at>?", st.Name)
			}
		}
	}
}

func TestSQLiteOrderedClaimPlan(t *testing.T) {
	t.Parallel()
	ctx := dialecttest.OrderedPlanCtx(t)
	s, db, rec := newLoggedSQLiteStore(ctx, t)
	dialecttest.UpOrdered(ctx, t, db, "sqlite")
	rows := dialecttest.OrderedPlanRows(t)
	dialecttest.OrderedBacklog(ctx, t, s, rows)
	_, err := db.ExecContext(ctx, `ANALYZE`)
	require.NoError(t, err)
	dialecttest.TimeOrderedClaim(ctx, t, s)

	var claim string
	for _, q := range rec.every() {
		if strings.Contains(q, `SET status = 'processing'`) && strings.Contains(q, `_order_idx`) && !strings.Contains(q, `RECURSIVE`) {
			claim = q
		}
	}
	require.NotEmpty(t, claim, "the ordered claim ran")
	n := strings.Count(claim, "?")
	plan := sqlitePlan(ctx, t, db, claim, make([]any, n)...)
	t.Logf("EXPLAIN QUERY PLAN of the ordered claim, %d rows:\n%s", rows, plan)
	require.Contains(t, plan, `USING INDEX outbox_events_claim_idx`, "candidates come from the claim index")
	require.Contains(t, plan, `USING INDEX outbox_events_order_idx (namespace=? AND partition_key=?)`, "the head check is one descent of the order index")
	require.NotContains(t, plan, "TEMP B-TREE", "nothing is sorted")
	dialecttest.TimeHeldBackClaim(ctx, t, s, rows)
}

// sqlitePlan returns the EXPLAIN QUERY PLAN of query, one step a line.
func sqlitePlan(ctx context.Context, t *testing.T, db *sql.DB, query string, args ...any) string {
	t.Helper()
	rows, err := db.QueryContext(ctx, `EXPLAIN QUERY PLAN `+query, args...)
	require.NoError(t, err)
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var id, parent, unused int
		var detail string
		require.NoError(t, rows.Scan(&id, &parent, &unused, &detail))
		fmt.Fprintf(&b, "  %d<-%d %s\n", id, parent, detail)
	}
	require.NoError(t, rows.Err())
	return b.String()
}
