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
	ctx := dialecttest.OrderedPlanCtx(t, dialecttest.OrderedPlanRows(t, dialecttest.OrderedPlanRowsSQLite))
	s, db, rec := newLoggedSQLiteStore(ctx, t)
	dialecttest.UpOrdered(ctx, t, db, "sqlite")
	rows := dialecttest.OrderedPlanRows(t, dialecttest.OrderedPlanRowsSQLite)
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

// TestSQLiteDueClaimPlan: with 5,000 rows delayed an hour, an unordered claim's probe and
// its candidate read are one range of the due index each, in its order, up to now: the
// delayed rows lie past the range's end and are never read, whether nothing or 100 rows
// are due, analyzed or not. The statements name their index (INDEXED BY), so the plan does
// not change with the number of rows: 5,000 give the verdicts 100,000 gave.
func TestSQLiteDueClaimPlan(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, db, rec := newLoggedSQLiteStore(ctx, t)
	bulk := func(n int, delay time.Duration) {
		now := time.Now().UnixMicro()
		_, err := db.ExecContext(ctx, `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)`+
			` INSERT INTO outbox_events (id, namespace, topic, payload, payload_hash, status, attempts, next_attempt_at, created_at, updated_at)`+
			` SELECT randomblob(16), 'orders', 'order.created', '{"n":1}', x'00', 'pending', 0, ?, ?, ? FROM n`,
			n, now+delay.Microseconds(), now, now)
		require.NoError(t, err)
	}
	bulk(5000, time.Hour)
	scopes := []outbox.Scope{{}, {Namespace: "orders", Topics: []string{"order.created", "order.paid"}}}
	for _, analyzed := range []bool{false, true} {
		if analyzed {
			_, err := db.ExecContext(ctx, `ANALYZE`)
			require.NoError(t, err)
		}
		for _, sc := range scopes {
			rec.reset()
			o := outbox.ClaimOptions{Limit: 100, Lease: time.Minute, MaxAttempts: 5, WorkerID: "plan", Scope: sc}
			recs, err := s.Claim(ctx, o)
			require.NoError(t, err)
			require.Empty(t, recs, "nothing is due")
			requireDueRead(ctx, t, db, rec.every(), "SELECT 1 FROM", "the probe of an empty claim")
		}
	}
	bulk(1000, -time.Second)
	for _, sc := range scopes {
		rec.reset()
		o := outbox.ClaimOptions{Limit: 100, Lease: time.Minute, MaxAttempts: 5, WorkerID: "plan", Scope: sc}
		recs, err := s.Claim(ctx, o)
		require.NoError(t, err)
		require.Len(t, recs, 100)
		requireDueRead(ctx, t, db, rec.every(), "UPDATE", "a claim of 100")
	}
}

// requireDueRead fails unless the last of queries that starts with prefix reads the table
// through one range of the due index, in its order, and nothing else of it.
func requireDueRead(ctx context.Context, t *testing.T, db *sql.DB, queries []string, prefix, what string) {
	t.Helper()
	var q string
	for _, s := range queries {
		if strings.HasPrefix(s, prefix) {
			q = s
		}
	}
	require.NotEmpty(t, q, "%s ran", what)
	plan := sqlitePlan(ctx, t, db, q, make([]any, strings.Count(q, "?"))...)
	t.Logf("%s: %s\n%s", what, q, plan)
	require.Contains(t, plan, "SEARCH outbox_events USING INDEX outbox_events_due_idx (<expr><?)", what)
	require.NotContains(t, plan, "TEMP B-TREE", "%s sorts nothing", what)
	require.NotContains(t, plan, "SCAN outbox_events", "%s scans nothing", what)
	require.NotContains(t, plan, "outbox_events_claim_idx", "%s does not walk the creation order", what)
}
