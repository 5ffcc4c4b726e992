package outbox_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
)

// inspectFilter is a dead filter with every term the web view sets: the plans must still
// read the dead rows through the retention index.
var inspectFilter = outbox.DeadFilter{
	Scope:         outbox.Scope{Namespace: "orders", Topics: []string{"order.created"}},
	Since:         time.Now().Add(-24 * time.Hour),
	ErrorContains: "refused",
}

// TestPostgresInspectPlan: dead groups and totals read the partial retention index (the
// dead rows only), activity walks it backwards from now, and the dedupe lookup is one probe
// of the dedupe index.
func TestPostgresInspectPlan(t *testing.T) {
	t.Parallel()
	b := setupPostgres(t, "")
	planRows(b.ctx, t, b.store)
	_, err := b.db.ExecContext(b.ctx, `ANALYZE "`+b.table+`"`)
	require.NoError(t, err)
	for _, f := range []outbox.DeadFilter{{}, inspectFilter} {
		for _, st := range outbox.InspectSQL("postgres", b.store.Table(), f) {
			var out string
			require.NoError(t, b.db.QueryRowContext(b.ctx, `EXPLAIN (FORMAT JSON) `+st.Query, st.Args...).Scan(&out), st.Name)
			var plans []struct{ Plan planNode }
			require.NoError(t, json.Unmarshal([]byte(out), &plans))
			t.Logf("%s:\n%s", st.Name, plans[0].Plan.format(""))
			want := b.table + "_retention_idx"
			if st.Name == "dedupe key" {
				want = b.table + "_dedupe_idx"
			}
			found := false
			plans[0].Plan.walk(func(n *planNode) {
				if n.RelationName == b.table {
					require.Contains(t, []string{"Index Scan", "Index Only Scan", "Bitmap Heap Scan"}, n.NodeType, "%s: through an index", st.Name)
				}
				if n.IndexName == want {
					found = true
				}
				if st.Name == "activity delivered" { // on 200 dead rows, a sort is cheaper
					require.NotContains(t, n.NodeType, "Sort", "%s: the index gives updated_at order", st.Name)
				}
			})
			require.True(t, found, "%s reads %s", st.Name, want)
		}
	}
}

// TestMySQLInspectPlan: the same on MySQL/MariaDB: ranges of the retention index, and the
// dedupe table's primary key then the outbox table's.
func TestMySQLInspectPlan(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	planRows(e.ctx, t, e.store)
	_, err := e.db.ExecContext(e.ctx, "ANALYZE TABLE `"+e.table+"`")
	require.NoError(t, err)
	for _, f := range []outbox.DeadFilter{{}, inspectFilter} {
		for _, st := range outbox.InspectSQL("mysql", e.store.Table(), f) {
			plan := myExplain(t, e, myRecorded{query: st.Query, args: st.Args})
			t.Logf("%s:\n%s", st.Name, plan)
			for _, row := range plan {
				if row["table"] == e.table {
					require.NotEqual(t, "ALL", row["type"], "%s: no full scan", st.Name)
					if st.Name == "dedupe key" {
						require.Equal(t, "PRIMARY", row["key"], st.Name)
					} else {
						require.Equal(t, e.table+"_retention_idx", row["key"], st.Name)
						require.Contains(t, []string{"ref", "range"}, row["type"], st.Name)
					}
				}
				if strings.HasPrefix(st.Name, "activity") && row["table"] == e.table { // the derived table of 100 rows is sorted for GROUP BY
					require.NotContains(t, row["Extra"], "filesort", "%s: the index gives updated_at order", st.Name)
				}
			}
		}
	}
}

// TestSQLiteInspectPlan: the same on SQLite.
func TestSQLiteInspectPlan(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store, db := newSQLiteStore(ctx, t)
	planRows(ctx, t, store)
	for _, f := range []outbox.DeadFilter{{}, inspectFilter} {
		for _, st := range outbox.InspectSQL("sqlite", store.Table(), f) {
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
