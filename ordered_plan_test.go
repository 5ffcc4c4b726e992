package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

// The ordered claim's plans, per backend, on a backlog of orderedPlanRows rows spread over
// 1000 partition keys in turn (OUTBOX_ORDERED_PLAN_ROWS=1000000 measures the large case by
// hand). Half the keys have their head in flight, so that the claim passes rows it may not
// take, as it does in a burn-down.

const orderedPlanKeys = 1000

// orderedPlanCtx bounds a plan test: the default backlog takes seconds, a million rows
// minutes.
func orderedPlanCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute+time.Duration(orderedPlanRows(t))*time.Millisecond)
	t.Cleanup(cancel)
	return ctx
}

func orderedPlanRows(t *testing.T) int {
	if v := os.Getenv("OUTBOX_ORDERED_PLAN_ROWS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		return n
	}
	return 20000
}

// orderedBacklog enqueues rows messages, key i%orderedPlanKeys for the i-th, 1000 per
// transaction; then claims every key's head in order and acks every other one, so that the
// next heads of half the keys are due while the other half are held back by a row in flight.
func orderedBacklog(ctx context.Context, t *testing.T, s *outbox.Store, rows int) {
	t.Helper()
	start := time.Now()
	for i := 0; i < rows; i += 1000 {
		msgs := make([]outbox.Message, min(1000, rows-i))
		for j := range msgs {
			msgs[j] = outbox.Message{Namespace: "orders", Topic: "order.changed",
				PartitionKey: fmt.Sprintf("order-%04d", (i+j)%orderedPlanKeys), Payload: json.RawMessage(`{"v":1}`)}
		}
		_, err := s.EnqueueStandalone(ctx, msgs...)
		require.NoError(t, err)
	}
	t.Logf("enqueued %d rows in %s", rows, time.Since(start))
	o := orderedClaimOpts(outbox.MaxBatch)
	heads, err := s.Claim(ctx, o)
	require.NoError(t, err)
	require.Len(t, heads, min(rows, orderedPlanKeys), "one head per key")
	var acks []outbox.Lease
	for i, r := range heads {
		if i%2 == 0 {
			acks = append(acks, r.Lease())
		}
	}
	require.NoError(t, s.Ack(ctx, acks...))
}

// upOrdered adds the ordered migration set, which ordered claims need, to the default table
// of a database its setup migrated without it.
func upOrdered(ctx context.Context, t *testing.T, db *sql.DB, backend string) {
	t.Helper()
	require.NoError(t, migrations.Up(ctx, db, backend, migrations.Options{Ordered: true}))
}

func orderedClaimOpts(limit int) outbox.ClaimOptions {
	return outbox.ClaimOptions{Limit: limit, Lease: time.Hour, MaxAttempts: 5, WorkerID: "plan", Ordered: true,
		Scope: outbox.Scope{Namespace: "orders"}}
}

// timeOrderedClaim claims 100 rows in order and logs how long it took and the unordered
// claim after it, on the same backlog.
func timeOrderedClaim(ctx context.Context, t *testing.T, s *outbox.Store) []outbox.Record {
	t.Helper()
	start := time.Now()
	recs, err := s.Claim(ctx, orderedClaimOpts(100))
	require.NoError(t, err)
	ordered := time.Since(start)
	require.Len(t, recs, 100)
	keys := map[string]bool{}
	for _, r := range recs {
		require.False(t, keys[r.PartitionKey], "two rows of %s in one claim", r.PartitionKey)
		keys[r.PartitionKey] = true
	}
	o := orderedClaimOpts(100)
	o.Ordered = false
	start = time.Now()
	_, err = s.Claim(ctx, o)
	require.NoError(t, err)
	t.Logf("claim of 100: ordered %s, unordered %s", ordered, time.Since(start))
	return recs
}

// timeHeldBackClaim takes every remaining head, so that every key has a row in flight, and
// logs how long an ordered claim then takes to find nothing: the walk passes only held-back
// rows, and the key visit finds no due head (see docs/ordering.md, What it costs). It is a
// measurement, not a limit.
func timeHeldBackClaim(ctx context.Context, t *testing.T, s *outbox.Store, rows int) {
	t.Helper()
	for {
		recs, err := s.Claim(ctx, orderedClaimOpts(outbox.MaxBatch))
		require.NoError(t, err)
		if len(recs) == 0 {
			break
		}
	}
	start := time.Now()
	recs, err := s.Claim(ctx, orderedClaimOpts(100))
	require.NoError(t, err)
	require.Empty(t, recs)
	t.Logf("ordered claim with every key in flight, %d rows: nothing, in %s", rows, time.Since(start))
}

func TestPostgresOrderedClaimPlan(t *testing.T) {
	t.Parallel()
	b := setupPostgres(t, "")
	b.ctx = orderedPlanCtx(t)
	upOrdered(b.ctx, t, b.db, "postgres")
	rows := orderedPlanRows(t)
	orderedBacklog(b.ctx, t, b.store, rows)
	_, err := b.db.ExecContext(b.ctx, `ANALYZE "`+b.table+`"`)
	require.NoError(t, err)

	rec := &recordingConnector{}
	store, err := outbox.New(openRecording(t, b, rec), outbox.Postgres(), outbox.Options{})
	require.NoError(t, err)
	timeOrderedClaim(b.ctx, t, store)
	var q recordedQuery
	rec.mu.Lock()
	for _, r := range rec.queries {
		if strings.HasPrefix(r.sql, "WITH c AS") && strings.Contains(r.sql, "e.partition_key") {
			q = r
		}
	}
	rec.mu.Unlock()
	require.NotEmpty(t, q.sql, "the ordered claim ran")

	// EXPLAIN ANALYZE runs the claim: in a transaction that is rolled back.
	tx, err := b.db.BeginTx(b.ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	var out string
	require.NoError(t, tx.QueryRowContext(b.ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+q.sql, q.args...).Scan(&out))
	var plans []struct{ Plan orderedPlanNode }
	require.NoError(t, json.Unmarshal([]byte(out), &plans))
	require.Len(t, plans, 1)
	t.Logf("EXPLAIN ANALYZE of the ordered claim, %d rows:\n%s", rows, plans[0].Plan.format(""))

	var walk, head *orderedPlanNode
	plans[0].Plan.walk(func(n *orderedPlanNode) {
		require.NotContains(t, n.NodeType, "Sort", "the claim sorts nothing")
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
	require.NoError(t, tx.Rollback())
	timeHeldBackClaim(b.ctx, t, b.store, rows)
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

func TestMySQLOrderedClaimPlan(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	e.ctx = orderedPlanCtx(t)
	upOrdered(e.ctx, t, e.db, "mysql")
	rows := orderedPlanRows(t)
	orderedBacklog(e.ctx, t, e.store, rows)
	r, err := e.db.QueryContext(e.ctx, "ANALYZE TABLE `"+e.table+"`")
	require.NoError(t, err)
	require.NoError(t, r.Close())

	rec := &myRecorder{}
	s := e.storeOn(t, reopenMySQL(t, e.db, nil, rec.wrap))
	timeOrderedClaim(e.ctx, t, s)
	reads := rec.matching("_order_idx`)")
	require.Len(t, reads, 2, "the reclaim read and the pending read check heads")
	for i, what := range []string{"reclaim read", "pending read"} {
		require.NotContains(t, reads[i].query, "FOR UPDATE", "heads are found without locking")
		plan := myExplain(t, e, reads[i])
		t.Logf("EXPLAIN of the ordered %s, %d rows:\n%s", what, rows, plan)
		require.Equal(t, e.table+"_claim_idx", plan[0]["key"], "the %s walks the claim index", what)
		require.Contains(t, []string{"ref", "range"}, plan[0]["type"])
		var head myPlanRow
		for _, row := range plan {
			require.NotContains(t, row["Extra"], "filesort", "in index order, never sorted")
			if row["select_type"] == "DEPENDENT SUBQUERY" {
				head = row
			}
		}
		require.Equal(t, e.table+"_order_idx", head["key"], "the head check reads the order index")
		require.Equal(t, "ref", head["type"])
		require.Contains(t, head["Extra"], "Using index", "the head check reads the order index alone, not the rows")
	}
	locks := rec.matching("FORCE INDEX (PRIMARY) WHERE id IN")
	require.Len(t, locks, 1)
	plan := myExplain(t, e, locks[0])
	t.Logf("EXPLAIN of the lock:\n%s", plan)
	require.Equal(t, "PRIMARY", plan[0]["key"], "heads are locked by primary key")
	timeHeldBackClaim(e.ctx, t, e.store, rows)
}

func TestSQLiteOrderedClaimPlan(t *testing.T) {
	t.Parallel()
	ctx := orderedPlanCtx(t)
	s, db, rec := newLoggedSQLiteStore(ctx, t)
	upOrdered(ctx, t, db, "sqlite")
	rows := orderedPlanRows(t)
	orderedBacklog(ctx, t, s, rows)
	_, err := db.ExecContext(ctx, `ANALYZE`)
	require.NoError(t, err)
	timeOrderedClaim(ctx, t, s)

	var claim string
	for _, q := range rec.all() {
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
	timeHeldBackClaim(ctx, t, s, rows)
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

// On MariaDB, an ordered claim on a backlog where every key has its head in flight finds
// nothing after reading a number of index entries that follows the batch size and the
// number of keys, not the backlog: the walk stops at its window and the key visit reads a
// few entries per key. The server's handler counters, read on the claim's own session,
// count every index entry and row it read.
func TestMySQLOrderedClaimBounded(t *testing.T) {
	t.Parallel()
	const (
		keys   = 50
		perKey = 600
	)
	e := setupMySQL(t, "")
	upOrdered(e.ctx, t, e.db, "mysql")
	for k0 := 0; k0 < keys; k0 += 5 {
		var msgs []outbox.Message
		for k := k0; k < k0+5; k++ {
			for seq := range perKey {
				msgs = append(msgs, outbox.Message{Namespace: "orders", Topic: "order.changed",
					PartitionKey: fmt.Sprintf("order-%03d", k), Payload: json.RawMessage(fmt.Sprintf(`{"seq":%d}`, seq))})
			}
		}
		_, err := e.store.EnqueueStandalone(e.ctx, msgs...)
		require.NoError(t, err)
	}
	heads, err := e.store.Claim(e.ctx, orderedClaimOpts(outbox.MaxBatch))
	require.NoError(t, err)
	require.Len(t, heads, keys, "one head per key")

	// One connection, so that the counters are the claim's session's.
	db := reopenMySQL(t, e.db, nil, nil)
	db.SetMaxOpenConns(1)
	s := e.storeOn(t, db)
	reads := func() int64 {
		rows, err := db.QueryContext(e.ctx, `SHOW SESSION STATUS LIKE 'Handler_read%'`)
		require.NoError(t, err)
		defer rows.Close()
		var sum int64
		for rows.Next() {
			var name string
			var v int64
			require.NoError(t, rows.Scan(&name, &v))
			sum += v
		}
		require.NoError(t, rows.Err())
		return sum
	}
	// SHOW STATUS counts reads of its own: subtract them.
	before := reads()
	show := reads() - before
	for _, limit := range []int{1, 10, 100} {
		before := reads()
		recs, err := s.Claim(e.ctx, orderedClaimOpts(limit))
		require.NoError(t, err)
		require.Empty(t, recs, "every key's head is in flight")
		n := reads() - before - show
		t.Logf("ordered claim of %d with every key in flight, %d rows in %d keys: %d handler reads", limit, keys*perKey, keys, n)
		// The visit reads at most 32 order-index entries and a head per key; the walk a
		// window of 2 × limit + 50 rows and a head check each.
		require.Less(t, n, int64(100*keys+10*limit+500), "reads follow the keys and the batch, not the %d rows", keys*perKey)
	}

	// Once a head is delivered, the key's next row is found beyond the window.
	require.NoError(t, e.store.Ack(e.ctx, heads[keys-1].Lease()))
	recs, err := s.Claim(e.ctx, orderedClaimOpts(10))
	require.NoError(t, err)
	require.Len(t, recs, 1)
	require.Equal(t, heads[keys-1].PartitionKey, recs[0].PartitionKey)
}

// On MariaDB, the ordered claims' key visits take the keys in turn: each starts after the
// last key the visit before it dealt with and goes round from the first key at the end.
// Behind a key whose head is in flight and whose rows fill the walk's window, twenty keys
// of five rows each: claims of one row take the next key each time, not the first keys
// again whenever their next row is due after an ack, nor every other key; and every row is
// claimed, none left behind the visit's starting point.
func TestMySQLOrderedVisitGoesRound(t *testing.T) {
	t.Parallel()
	const (
		keys   = 20
		perKey = 5
	)
	e := setupMySQL(t, "")
	upOrdered(e.ctx, t, e.db, "mysql")
	hot := make([]outbox.Message, 300)
	for i := range hot {
		hot[i] = outbox.Message{Namespace: "orders", Topic: "order.changed", PartitionKey: "a-hot", Payload: json.RawMessage(`{}`)}
	}
	_, err := e.store.EnqueueStandalone(e.ctx, hot...)
	require.NoError(t, err)
	var msgs []outbox.Message
	for k := range keys {
		for seq := range perKey {
			msgs = append(msgs, outbox.Message{Namespace: "orders", Topic: "order.changed",
				PartitionKey: fmt.Sprintf("k%02d", k), Payload: json.RawMessage(fmt.Sprintf(`{"seq":%d}`, seq))})
		}
	}
	_, err = e.store.EnqueueStandalone(e.ctx, msgs...)
	require.NoError(t, err)
	head, err := e.store.Claim(e.ctx, orderedClaimOpts(1))
	require.NoError(t, err)
	require.Len(t, head, 1)
	require.Equal(t, "a-hot", head[0].PartitionKey, "the hot key's head stays in flight")

	seen := map[string]int{}
	for i := range keys * perKey {
		recs, err := e.store.Claim(e.ctx, orderedClaimOpts(1))
		require.NoError(t, err)
		require.Len(t, recs, 1, "claim %d of %d: a due head is left", i+1, keys*perKey)
		seen[recs[0].PartitionKey]++
		if i < keys*3/4 {
			require.Len(t, seen, i+1, "each of the first claims takes the next key, not the first keys again nor every other key: %v", seen)
		}
		require.NoError(t, e.store.Ack(e.ctx, recs[0].Lease()))
	}
	for k := range keys {
		require.Equal(t, perKey, seen[fmt.Sprintf("k%02d", k)])
	}
	recs, err := e.store.Claim(e.ctx, orderedClaimOpts(1))
	require.NoError(t, err)
	require.Empty(t, recs)
}
