package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
)

// planRows fills store's table with 2000 delivered, 200 dead and 2000 pending rows through
// the API, so that a plan has a table worth an index to read.
func planRows(ctx context.Context, t *testing.T, store *outbox.Store) {
	t.Helper()
	msgs := make([]outbox.Message, 1000)
	for i := range msgs {
		msgs[i] = outbox.Message{Namespace: "orders", Topic: "order.created", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
	}
	for range 4 {
		_, err := store.EnqueueStandalone(ctx, msgs...)
		require.NoError(t, err)
	}
	o := outbox.ClaimOptions{Limit: outbox.MaxBatch, Lease: time.Minute, MaxAttempts: 5, WorkerID: "plan"}
	for i := range 2 {
		recs, err := store.Claim(ctx, o)
		require.NoError(t, err)
		require.Len(t, recs, outbox.MaxBatch)
		var out []outbox.Outcome
		for j, r := range recs {
			status := outbox.StatusDelivered
			if i == 1 && j < 200 {
				status = outbox.StatusDead
			}
			out = append(out, outbox.Outcome{Lease: r.Lease(), Status: status})
		}
		require.NoError(t, store.Complete(ctx, out...))
	}
}

// TestPostgresPurgePlan: each purge batch finds its rows through the partial retention
// index, in updated_at order, and never reads the table's pending rows.
func TestPostgresPurgePlan(t *testing.T) {
	t.Parallel()
	b := setupPostgres(t, "")
	planRows(b.ctx, t, b.store)
	_, err := b.db.ExecContext(b.ctx, `ANALYZE "`+b.table+`"`)
	require.NoError(t, err)
	for _, status := range []outbox.Status{outbox.StatusDelivered, outbox.StatusDead} {
		q := outbox.PurgeSQL["postgres"](b.store.Table(), status)
		var out string
		require.NoError(t, b.db.QueryRowContext(b.ctx, `EXPLAIN (FORMAT JSON) `+q, time.Hour.Microseconds(), outbox.DefaultPurgeBatch).Scan(&out))
		var plans []struct{ Plan planNode }
		require.NoError(t, json.Unmarshal([]byte(out), &plans))
		require.Len(t, plans, 1)
		t.Logf("purge %s:\n%s", status, plans[0].Plan.format(""))
		cte := plans[0].Plan.find(func(n *planNode) bool { return n.SubplanName == "CTE c" })
		require.NotNil(t, cte, "the batch is a materialized CTE")
		found := false
		cte.walk(func(n *planNode) {
			require.NotContains(t, n.NodeType, "Sort", "the index gives updated_at order")
			if n.RelationName == b.table {
				require.Contains(t, []string{"Index Scan", "Index Only Scan"}, n.NodeType, "rows are found through an index")
				require.Equal(t, b.table+"_retention_idx", n.IndexName)
				found = true
			}
		})
		require.True(t, found)
	}
}

// TestMySQLPurgePlan: each purge batch locks its rows through the retention index (a range
// on status, in updated_at order), and deletes them by primary key.
func TestMySQLPurgePlan(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	planRows(e.ctx, t, e.store)
	_, err := e.db.ExecContext(e.ctx, "ANALYZE TABLE `"+e.table+"`")
	require.NoError(t, err)
	for _, status := range []outbox.Status{outbox.StatusDelivered, outbox.StatusDead} {
		q := outbox.PurgeSQL["mysql"](e.store.Table(), status)
		plan := myExplain(t, e, myRecorded{query: q, args: []any{time.Hour.Microseconds(), outbox.DefaultPurgeBatch}})
		t.Logf("purge %s:\n%s", status, plan)
		require.Len(t, plan, 1)
		require.Equal(t, e.table+"_retention_idx", plan[0]["key"])
		require.Equal(t, "range", plan[0]["type"])
		require.NotContains(t, plan[0]["Extra"], "filesort", "the index gives updated_at order")
	}
}

// TestSQLitePurgePlan: each purge batch finds its rows through the partial retention
// index and deletes them by primary key.
func TestSQLitePurgePlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, db := newSQLiteStore(ctx, t)
	planRows(ctx, t, store)
	for _, status := range []outbox.Status{outbox.StatusDelivered, outbox.StatusDead} {
		q := outbox.PurgeSQL["sqlite"](store.Table(), status)
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
