package postgres_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/dialects/dialecttest"
	"github.com/outboxgo/outbox/internal/dialects/postgres"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// TestPostgresPurgePlan: each purge batch finds its rows through the partial retention
// index, in updated_at order, and never reads the table's pending rows.
func TestPostgresPurgePlan(t *testing.T) {
	t.Parallel()
	b := setupPostgres(t, "")
	dialecttest.PlanRows(b.ctx, t, b.store)
	_, err := b.db.ExecContext(b.ctx, `ANALYZE "`+b.table+`"`)
	require.NoError(t, err)
	for _, status := range []outbox.Status{outbox.StatusDelivered, outbox.StatusDead} {
		q := postgres.PurgeSQL(b.store.Table(), status)
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

// TestPostgresInspectPlan: dead groups and totals read the partial retention index (the
// dead rows only), activity walks it backwards from now, and the dedupe lookup is one probe
// of the dedupe index.
func TestPostgresInspectPlan(t *testing.T) {
	t.Parallel()
	b := setupPostgres(t, "")
	dialecttest.PlanRows(b.ctx, t, b.store)
	_, err := b.db.ExecContext(b.ctx, `ANALYZE "`+b.table+`"`)
	require.NoError(t, err)
	for _, f := range []outbox.DeadFilter{{}, dialecttest.InspectFilter} {
		for _, st := range dialecttest.InspectSQL(b.store.Table(), f, postgres.DeadGroupsSQL, postgres.ActivitySQL, postgres.DedupeKeySQL) {
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

func TestPostgresOrderedClaimPlan(t *testing.T) {
	t.Parallel()
	b := setupPostgres(t, "")
	b.ctx = dialecttest.OrderedPlanCtx(t, dialecttest.OrderedPlanRows(t, dialecttest.OrderedPlanRowsServer))
	dialecttest.UpOrdered(b.ctx, t, b.db, "postgres")
	rows := dialecttest.OrderedPlanRows(t, dialecttest.OrderedPlanRowsServer)
	dialecttest.OrderedBacklog(b.ctx, t, b.store, rows)
	_, err := b.db.ExecContext(b.ctx, `ANALYZE "`+b.table+`"`)
	require.NoError(t, err)

	rec, store := recordingStore(t, b)
	dialecttest.TimeOrderedClaim(b.ctx, t, store)
	plan := b.explainAnalyzeLast(t, rec, "the ordered claim", func(sql string) bool {
		return strings.HasPrefix(sql, "WITH f AS") && strings.Contains(sql, "e.partition_key")
	})
	t.Logf("EXPLAIN ANALYZE of the ordered claim, %d rows:\n%s", rows, plan.format(""))

	var walk, head *orderedPlanNode
	plan.walk(func(n *orderedPlanNode) {
		if strings.Contains(n.NodeType, "Sort") {
			require.LessOrEqual(t, n.ActualRows, float64(sqlkit.OrderedWindow(100)+1), "the claim sorts the window's rows, not the backlog")
		}
		require.NotEqual(t, "Seq Scan", n.NodeType, "the claim scans no table")
		switch n.IndexName {
		case b.table + "_claim_idx":
			walk = n
		case b.table + "_order_idx":
			head = n
		}
	})
	require.NotNil(t, walk, "the candidates come from the claim index, in claim order")
	require.NotNil(t, head, "the head check reads the order index")
	// Half the keys are held back, so the walk passes about one row it may not take for
	// each it takes, and checks each with one probe: far from the whole pending set.
	require.Less(t, head.ActualLoops, 400, "rows the claim walked for 100, of %d pending", rows)
	dialecttest.TimeHeldBackClaim(b.ctx, t, b.store, rows)
}

// The key visit of an ordered claim (pgHeadsByKey) locks the heads it found by primary key,
// whatever the planner believes of the table: on a table never analyzed, the backlog
// grouped key by key so that the walk of the claim index finds few heads, it once checked
// every candidate row against every head (a nested loop over the heads for each of 4,000
// rows: 1.2 s a claim, and eight ordered publishers took 26 s for 4,000 events).
func TestPostgresHeadsByKeyPlanUnanalyzed(t *testing.T) {
	t.Parallel()
	const keys, perKey = 200, 20
	b := setupPostgres(t, "")
	dialecttest.UpOrdered(b.ctx, t, b.db, "postgres")
	for k := range keys {
		msgs := make([]outbox.Message, perKey)
		for i := range msgs {
			msgs[i] = outbox.Message{Namespace: "orders", Topic: "order.changed",
				PartitionKey: fmt.Sprintf("key-%03d", k), Payload: json.RawMessage(`{"v":1}`)}
		}
		_, err := b.store.EnqueueStandalone(b.ctx, msgs...)
		require.NoError(t, err)
	}
	rec, store := recordingStore(t, b)
	recs, err := store.Claim(b.ctx, dialecttest.OrderedClaimOpts(10))
	require.NoError(t, err)
	require.Len(t, recs, 10)
	plan := b.explainAnalyzeLast(t, rec, "the key visit", func(sql string) bool { return strings.HasPrefix(sql, "WITH RECURSIVE") })
	t.Logf("EXPLAIN ANALYZE of the key visit, %d rows never analyzed:\n%s", keys*perKey, plan.format(""))
	plan.walk(func(n *orderedPlanNode) {
		require.LessOrEqual(t, n.ActualLoops, keys+1, "%s runs once per key at most, not once per row", n.NodeType)
	})
}

// delayedRows is how many rows wait an hour ahead in the due-order tests: far more than a
// claim may read.
const delayedRows = 100_000

// TestPostgresDueClaimPlan: an unordered claim reads the rows it returns and a few index
// pages more, whatever number of rows wait for later, and keeps that plan whatever the
// statistics say: never analyzed, analyzed while empty, or analyzed while the only rows
// were delivered ones. With 100,000 rows delayed an hour, an empty claim and a claim of 100
// read a bounded number of pages (EXPLAIN (ANALYZE, BUFFERS)), scoped or not.
func TestPostgresDueClaimPlan(t *testing.T) {
	t.Parallel()
	for _, stats := range []string{"never analyzed", "analyzed empty", "analyzed delivered"} {
		t.Run(stats, func(t *testing.T) {
			t.Parallel()
			b := setupPostgres(t, "")
			_, err := b.db.ExecContext(b.ctx, `ALTER TABLE "`+b.table+`" SET (autovacuum_enabled = false)`)
			require.NoError(t, err)
			switch stats {
			case "analyzed delivered":
				b.bulk(t, 20, "now()", "'delivered'")
				fallthrough
			case "analyzed empty":
				_, err := b.db.ExecContext(b.ctx, `ANALYZE "`+b.table+`"`)
				require.NoError(t, err)
			}
			b.bulk(t, delayedRows, "now() + interval '1 hour'", "'pending'")
			rec, store := recordingStore(t, b)
			scopes := []outbox.Scope{{}, {Namespace: "orders", Topics: []string{"order.created", "order.paid"}},
				{Namespace: "orders", TenantID: uuid.MustParse("0190f5c4-2b6e-7c3a-9e1d-4f2a8b6c0d1e")}}
			// Each claim's statement is explained as planned for its arguments and as the
			// generic plan a prepared statement settles on after five runs.
			plans := [][]string{nil, {`SET LOCAL plan_cache_mode = force_generic_plan`}}
			claim := func(sc outbox.Scope, limit int) (int, []orderedPlanNode) {
				o := pgClaimOpts(limit)
				o.Scope = sc
				recs, err := store.Claim(b.ctx, o)
				require.NoError(t, err)
				var out []orderedPlanNode
				for _, settings := range plans {
					out = append(out, b.explainAnalyzeLast(t, rec, "the claim", func(sql string) bool { return strings.HasPrefix(sql, "WITH c AS") }, settings...))
				}
				return len(recs), out
			}
			for _, sc := range scopes {
				n, plans := claim(sc, 100)
				require.Zero(t, n, "nothing is due")
				for i, plan := range plans {
					requireDueWalk(t, b.table, plan, 20, "an empty claim, scope %+v, generic %v", sc, i == 1)
				}
			}
			b.bulk(t, 1000, "now() - interval '1 second'", "'pending'")
			for _, sc := range scopes[:2] {
				n, plans := claim(sc, 100)
				require.Equal(t, 100, n)
				for i, plan := range plans {
					// A buffer per row read, and as many again for the entries of the 100
					// rows the claim before took (dead versions until vacuum), a few index
					// pages.
					requireDueWalk(t, b.table, plan, 350, "a claim of 100, scope %+v, generic %v", sc, i == 1)
				}
			}
		})
	}
}

// requireDueWalk fails unless plan reads the table through the due index only, sorts
// nothing, and touches at most pages buffers in the claim's read.
func requireDueWalk(t *testing.T, table string, plan orderedPlanNode, pages int, msgAndArgs ...any) {
	t.Helper()
	what := fmt.Sprintf(msgAndArgs[0].(string), msgAndArgs[1:]...)
	t.Logf("%s:\n%s", what, plan.format(""))
	var read *orderedPlanNode
	plan.walk(func(n *orderedPlanNode) {
		require.NotContains(t, n.NodeType, "Sort", "%s: the claim sorts nothing", what)
		if n.RelationName == table && n.NodeType != "ModifyTable" && read == nil {
			read = n
		}
	})
	require.NotNil(t, read, what)
	require.Equal(t, "Index Scan", read.NodeType, "%s: the table is read through an index, in order", what)
	require.Equal(t, table+"_due_idx", read.IndexName, what)
	require.LessOrEqual(t, read.SharedHit+read.SharedRead, pages, "%s: pages read, with %d rows delayed", what, delayedRows)
}

// bulk inserts n rows of namespace orders, topic order.created, with status and
// next_attempt_at as given (SQL expressions), in one statement.
func (b *pgBundle) bulk(t *testing.T, n int, next, status string) {
	t.Helper()
	_, err := b.db.ExecContext(b.ctx, `INSERT INTO "`+b.table+`" (id, namespace, topic, payload, payload_hash, status, next_attempt_at)`+
		` SELECT gen_random_uuid(), 'orders', 'order.created', '{"n":1}', '\x00', `+status+`, `+next+` FROM generate_series(1, $1::int)`, n)
	require.NoError(t, err)
}

// explainAnalyzeLast returns the EXPLAIN ANALYZE of the last query rec recorded that match
// accepts (what names it), run in a transaction that is rolled back: it runs the query.
// settings run first in that transaction (SET LOCAL ...).
func (b *pgBundle) explainAnalyzeLast(t *testing.T, rec *recordingConnector, what string, match func(sql string) bool, settings ...string) orderedPlanNode {
	t.Helper()
	var q recordedQuery
	rec.mu.Lock()
	for _, r := range rec.queries {
		if match(r.sql) {
			q = r
		}
	}
	rec.mu.Unlock()
	require.NotEmpty(t, q.sql, "%s ran", what)
	tx, err := b.db.BeginTx(b.ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	for _, set := range settings {
		_, err := tx.ExecContext(b.ctx, set)
		require.NoError(t, err)
	}
	var out string
	require.NoError(t, tx.QueryRowContext(b.ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+q.sql, q.args...).Scan(&out))
	var plans []struct{ Plan orderedPlanNode }
	require.NoError(t, json.Unmarshal([]byte(out), &plans))
	require.Len(t, plans, 1)
	return plans[0].Plan
}

// orderedPlanNode is one node of EXPLAIN (ANALYZE, FORMAT JSON).
type orderedPlanNode struct {
	NodeType     string            `json:"Node Type"`
	IndexName    string            `json:"Index Name"`
	SubplanName  string            `json:"Subplan Name"`
	ActualRows   float64           `json:"Actual Rows"`
	ActualLoops  int               `json:"Actual Loops"`
	Plans        []orderedPlanNode `json:"Plans"`
	RelationName string            `json:"Relation Name"`
	SharedHit    int               `json:"Shared Hit Blocks"`
	SharedRead   int               `json:"Shared Read Blocks"`
}

func (n *orderedPlanNode) walk(f func(*orderedPlanNode)) {
	f(n)
	for i := range n.Plans {
		n.Plans[i].walk(f)
	}
}

func (n *orderedPlanNode) format(indent string) string {
	s := fmt.Sprintf("%s%s", indent, n.NodeType)
	if n.SubplanName != "" {
		s += " [" + n.SubplanName + "]"
	}
	if n.IndexName != "" {
		s += " using " + n.IndexName
	}
	s += fmt.Sprintf(" (rows=%g loops=%d)\n", n.ActualRows, n.ActualLoops)
	for i := range n.Plans {
		s += n.Plans[i].format(indent + "  ")
	}
	return s
}

// TestPostgresRunsPlan: the run claim reads, for each head, one range of the order index
// after it, bounded by what is left of the batch, and the table by primary key only; it
// sorts only the rows it read, never the key's backlog.
func TestPostgresRunsPlan(t *testing.T) {
	t.Parallel()
	const keys, perKey, limit = 5, 2000, 100
	b := setupPostgres(t, "")
	dialecttest.UpOrdered(b.ctx, t, b.db, "postgres")
	for i := 0; i < keys*perKey; i += 1000 {
		msgs := make([]outbox.Message, 1000)
		for j := range msgs {
			msgs[j] = outbox.Message{Namespace: "orders", Topic: "order.changed", PartitionKey: fmt.Sprintf("k%d", (i+j)%keys), Payload: json.RawMessage(`{"v":1}`)}
		}
		_, err := b.store.EnqueueStandalone(b.ctx, msgs...)
		require.NoError(t, err)
	}
	_, err := b.db.ExecContext(b.ctx, `ANALYZE "`+b.table+`"`)
	require.NoError(t, err)

	rec, store := recordingStore(t, b)
	o := dialecttest.OrderedClaimOpts(limit)
	o.Runs = true
	recs, err := store.Claim(b.ctx, o)
	require.NoError(t, err)
	require.Len(t, recs, limit, "the heads and their runs fill the batch")
	plan := b.explainAnalyzeLast(t, rec, "the run claim", func(sql string) bool { return strings.HasPrefix(sql, "WITH h AS") })
	t.Logf("EXPLAIN ANALYZE of the run claim, %d keys of %d rows:\n%s", keys, perKey, plan.format(""))
	var order *orderedPlanNode
	plan.walk(func(n *orderedPlanNode) {
		require.NotEqual(t, "Seq Scan", n.NodeType, "the run claim scans no table")
		if n.RelationName == b.table && strings.Contains(n.NodeType, "Scan") {
			require.Contains(t, []string{"Index Scan", "Index Only Scan"}, n.NodeType)
		}
		if n.IndexName == b.table+"_order_idx" {
			order = n
		}
		if strings.Contains(n.NodeType, "Sort") {
			require.LessOrEqual(t, n.ActualRows, float64(keys*limit), "a sort of the rows read, not of the backlog")
		}
	})
	require.NotNil(t, order, "the runs come from the order index")
	require.Equal(t, keys, order.ActualLoops, "one range per head")
	require.LessOrEqual(t, order.ActualRows, float64(limit), "each range (rows per loop) bounded by the batch")
}

// TestPostgresHotKeyClaimBounded: an ordered claim with runs, on one key's backlog of
// 20,000 rows enqueued 1,000 to a transaction (so 1,000 rows share each created_at) on a
// table never analyzed, reads a bounded part of the claim index, however long the backlog:
// the walk in index order that the claim's transaction settings leave the planner (a bitmap
// scan read the whole backlog and sorted it, every claim: 3,000 pages), of the window's
// first rows by (created_at, id) (a bound on created_at alone took in every row of the
// transaction: 2,500 pages), checking the head of the key's first row only (a check per
// row of the window: 800 pages; now 530 to 1,340, by the plan the claim's walk gets).
func TestPostgresHotKeyClaimBounded(t *testing.T) {
	t.Parallel()
	const rows, perTx, limit = 20_000, 1_000, 100
	b := setupPostgres(t, "")
	dialecttest.UpOrdered(b.ctx, t, b.db, "postgres")
	for i := 0; i < rows; i += perTx {
		msgs := make([]outbox.Message, perTx)
		for j := range msgs {
			msgs[j] = outbox.Message{Namespace: "orders", Topic: "order.changed", PartitionKey: "hot", Payload: json.RawMessage(`{"v":1}`)}
		}
		_, err := b.store.EnqueueStandalone(b.ctx, msgs...)
		require.NoError(t, err)
	}
	rec, store := recordingStore(t, b)
	o := dialecttest.OrderedClaimOpts(limit)
	o.Runs = true
	// past the first transaction's rows: the window then starts among delivered ones
	plan := explainHeadsClaim(t, b, rec, store, o, 3, "the head and its run fill the batch")
	t.Logf("EXPLAIN ANALYZE of the heads claim, one key of %d rows:\n%s", rows, plan.format(""))
	plan.walk(func(n *orderedPlanNode) {
		require.NotContains(t, n.NodeType, "Bitmap", "the claim index walked in order")
		require.NotEqual(t, "Seq Scan", n.NodeType)
		if n.IndexName == b.table+"_claim_idx" {
			require.LessOrEqual(t, n.ActualRows*float64(max(n.ActualLoops, 1)), float64(sqlkit.OrderedWindow(limit)+1), "at most the window")
		}
	})
	require.LessOrEqual(t, plan.SharedHit+plan.SharedRead, 2_000, "pages read for a claim of %d rows", limit)
}

// TestPostgresManyKeysHeadsByID: the heads claim of many keys finds its candidates by
// primary key. Its lock's eligibility term once implied the claim index's predicate, and
// with bitmap scans off (a claim with runs) the planner read the whole claim index for the
// ids, whose second column id is: a claim of 1,000 keys' heads read every pending row.
func TestPostgresManyKeysHeadsByID(t *testing.T) {
	t.Parallel()
	const keys, perKey, limit = 1_000, 10, 100
	b := setupPostgres(t, "")
	dialecttest.UpOrdered(b.ctx, t, b.db, "postgres")
	var msgs []outbox.Message
	for i := range keys * perKey {
		msgs = append(msgs, outbox.Message{Namespace: "orders", Topic: "order.changed", PartitionKey: fmt.Sprintf("k%d", i%keys), Payload: json.RawMessage(`{"v":1}`)})
	}
	_, err := b.store.EnqueueStandalone(b.ctx, msgs...)
	require.NoError(t, err)
	rec, store := recordingStore(t, b)
	o := dialecttest.OrderedClaimOpts(limit)
	o.Runs = true
	// past the first heads: the window then starts among delivered rows
	plan := explainHeadsClaim(t, b, rec, store, o, 3, "a batch of heads")
	// By primary key about 2,800 pages; the whole claim index for the ids, 15,600.
	require.LessOrEqual(t, plan.SharedHit+plan.SharedRead, 6_000, "pages read for a claim of %d heads:\n%s", limit, plan.format(""))
}

// explainHeadsClaim claims with o rounds times, each a full batch (why says what fills
// it) acked at once, and returns EXPLAIN ANALYZE of the last claim's heads statement, run
// under the settings its transaction made.
func explainHeadsClaim(t *testing.T, b *pgBundle, rec *recordingConnector, store *outbox.Store, o outbox.ClaimOptions, rounds int, why string) orderedPlanNode {
	t.Helper()
	for range rounds {
		rec.mu.Lock()
		rec.queries = nil
		rec.mu.Unlock()
		recs, err := store.Claim(b.ctx, o)
		require.NoError(t, err)
		require.Len(t, recs, o.Limit, why)
		leases := make([]outbox.Lease, len(recs))
		for i, r := range recs {
			leases[i] = r.Lease()
		}
		require.NoError(t, store.Ack(b.ctx, leases...))
	}
	var settings []string
	rec.mu.Lock()
	for _, q := range rec.queries {
		if strings.HasPrefix(q.sql, "SET LOCAL") {
			settings = append(settings, q.sql)
		}
	}
	rec.mu.Unlock()
	return b.explainAnalyzeLast(t, rec, "the heads claim", func(sql string) bool { return strings.HasPrefix(sql, "WITH f AS") }, settings...)
}

// TestPostgresSettleByID: a settle finds its rows by primary key however many rows are in
// flight and whatever the statistics say. Its status term once implied the claim index's
// predicate, and on statistics older than a burst the planner ANDed the whole claim index
// into the primary key's bitmap: a log reader behind by thousands of leased rows spent
// 60 ms settling 300 of them and never caught up.
func TestPostgresSettleByID(t *testing.T) {
	t.Parallel()
	const rows, settled = 10_000, 100
	b := setupPostgres(t, "")
	leased, err := outbox.New(b.db, outbox.Postgres(), outbox.Options{Table: b.table, LogLease: time.Hour})
	require.NoError(t, err)
	enqueue := func() []outbox.Record {
		var recs []outbox.Record
		for i := 0; i < rows; i += 1_000 {
			msgs := make([]outbox.Message, 1_000)
			for j := range msgs {
				msgs[j] = outbox.Message{Namespace: "orders", Topic: "order.changed", Payload: json.RawMessage(`{"v":1}`)}
			}
			res, err := leased.EnqueueStandalone(b.ctx, msgs...)
			require.NoError(t, err)
			for _, r := range res {
				recs = append(recs, outbox.Record{ID: r.ID, LeaseToken: outbox.LogLeaseToken(r.ID)})
			}
		}
		return recs
	}
	deliver := func(recs []outbox.Record) {
		for chunk := range slices.Chunk(recs, outbox.MaxBatch) {
			done := make([]outbox.Outcome, len(chunk))
			for i, r := range chunk {
				done[i] = outbox.Outcome{Lease: r.Lease(), Status: outbox.StatusDelivered}
			}
			require.NoError(t, b.store.Complete(b.ctx, done...))
		}
	}
	// Statistics taken when every row was delivered, then a burst in flight: what a busy
	// table looks like to the planner between autovacuum's looks. The claim index then
	// seems to hold next to nothing, and ANDing it whole into the primary key's bitmap cheap.
	deliver(enqueue())
	_, err = b.db.ExecContext(b.ctx, `ANALYZE "`+b.table+`"`)
	require.NoError(t, err)
	recs := enqueue()
	deliver(recs[:rows/2])
	rec, store := recordingStore(t, b)
	outcomes := make([]outbox.Outcome, settled)
	for i := range settled {
		outcomes[i] = outbox.Outcome{Lease: recs[rows/2+i].Lease(), Status: outbox.StatusDelivered}
	}
	require.NoError(t, store.Complete(b.ctx, outcomes...))
	plan := b.explainAnalyzeLast(t, rec, "the settle", func(sql string) bool {
		return strings.HasPrefix(sql, `UPDATE "`+b.table+`" AS t SET status = u.status`)
	})
	plan.walk(func(n *orderedPlanNode) {
		require.NotEqual(t, b.table+"_claim_idx", n.IndexName, "a settle reads the rows by primary key, not the claim index:\n%s", plan.format(""))
	})
}

// TestPostgresStillLeasedByID: the check that a continued claim's rows are still leased,
// before its top-up, finds them by primary key, as the settles do (TestPostgresSettleByID),
// on statistics taken before thousands of rows went in flight. Written with status =
// 'processing', it walked the whole claim index for 100 ids (10,000 buffers against 400).
func TestPostgresStillLeasedByID(t *testing.T) {
	t.Parallel()
	const inFlight = 10_000
	b := pgRunsSetup(t, "outbox_plan_still_leased")
	for range inFlight / 1_000 {
		msgs := make([]outbox.Message, 1_000)
		for i := range msgs {
			msgs[i] = outbox.Message{Namespace: "elsewhere", Topic: "t", Payload: json.RawMessage(`{"v":1}`)}
		}
		b.enqueue(t, msgs...)
	}
	exec := func(sql string) {
		_, err := b.db.ExecContext(b.ctx, sql)
		require.NoError(t, err)
	}
	// Statistics taken when every row was delivered, then all of them in flight elsewhere.
	exec(`UPDATE "` + b.table + `" SET status = 'delivered', delivered_at = now()`)
	exec(`ANALYZE "` + b.table + `"`)
	exec(`UPDATE "` + b.table + `" SET status = 'processing', lease_token = gen_random_uuid(), locked_until = now() + interval '1 hour'`)
	res, first := pgClaimFirst(t, b, pgKeyed("k", 0), pgKeyed("k", 1), pgKeyed("j", 0))
	rec := &recordingConnector{}
	store, err := outbox.New(openRecording(t, b, rec), outbox.Postgres(), outbox.Options{Table: b.table})
	require.NoError(t, err)
	o := pgRunOpts(4)
	o.Continue = true
	next, _, err := store.CompleteAndClaim(b.ctx, []outbox.Outcome{{Lease: first.Lease(), Status: outbox.StatusDelivered}}, o)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{res[1].ID, res[2].ID}, pgRecIDs(next), "k's run, then j's head from the top-up")
	plan := b.explainAnalyzeLast(t, rec, "the lease check", func(sql string) bool {
		return strings.HasPrefix(sql, `SELECT count(*), set_config('enable_bitmapscan'`)
	})
	plan.walk(func(n *orderedPlanNode) {
		require.NotEqual(t, b.table+"_claim_idx", n.IndexName, "the lease check reads the rows by primary key, not the claim index:\n%s", plan.format(""))
	})
}
