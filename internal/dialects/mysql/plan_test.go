package mysql_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/dialects/dialecttest"
	dialectmysql "github.com/outboxgo/outbox/internal/dialects/mysql"
)

// TestMySQLPurgePlan: each purge batch locks its rows through the retention index (a range
// on status, in updated_at order), and deletes them by primary key.
func TestMySQLPurgePlan(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	dialecttest.PlanRows(e.ctx, t, e.store)
	_, err := e.db.ExecContext(e.ctx, "ANALYZE TABLE `"+e.table+"`")
	require.NoError(t, err)
	for _, status := range []outbox.Status{outbox.StatusDelivered, outbox.StatusDead} {
		q := dialectmysql.PurgeSQL(e.store.Table(), status)
		plan := myExplain(t, e, myRecorded{query: q, args: []any{time.Hour.Microseconds(), outbox.DefaultPurgeBatch}})
		t.Logf("purge %s:\n%s", status, plan)
		require.Len(t, plan, 1)
		require.Equal(t, e.table+"_retention_idx", plan[0]["key"])
		require.Equal(t, "range", plan[0]["type"])
		require.NotContains(t, plan[0]["Extra"], "filesort", "the index gives updated_at order")
	}
}

// TestMySQLInspectPlan: the same on MySQL/MariaDB: ranges of the retention index, and the
// dedupe table's primary key then the outbox table's.
func TestMySQLInspectPlan(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	dialecttest.PlanRows(e.ctx, t, e.store)
	_, err := e.db.ExecContext(e.ctx, "ANALYZE TABLE `"+e.table+"`")
	require.NoError(t, err)
	for _, f := range []outbox.DeadFilter{{}, dialecttest.InspectFilter} {
		for _, st := range dialecttest.InspectSQL(e.store.Table(), f, dialectmysql.DeadGroupsSQL, dialectmysql.ActivitySQL, dialectmysql.DedupeKeySQL) {
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

func TestMySQLOrderedClaimPlan(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	e.ctx = dialecttest.OrderedPlanCtx(t, dialecttest.OrderedPlanRows(t, dialecttest.OrderedPlanRowsServer))
	dialecttest.UpOrdered(e.ctx, t, e.db, "mysql")
	rows := dialecttest.OrderedPlanRows(t, dialecttest.OrderedPlanRowsServer)
	dialecttest.OrderedBacklog(e.ctx, t, e.store, rows)
	r, err := e.db.QueryContext(e.ctx, "ANALYZE TABLE `"+e.table+"`")
	require.NoError(t, err)
	require.NoError(t, r.Close())

	rec := &myRecorder{}
	s := e.storeOn(t, reopenMySQL(t, e.db, nil, rec.wrap))
	dialecttest.TimeOrderedClaim(e.ctx, t, s)
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
	dialecttest.TimeHeldBackClaim(e.ctx, t, e.store, rows)
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
	dialecttest.UpOrdered(e.ctx, t, e.db, "mysql")
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
	heads, err := e.store.Claim(e.ctx, dialecttest.OrderedClaimOpts(outbox.MaxBatch))
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
		recs, err := s.Claim(e.ctx, dialecttest.OrderedClaimOpts(limit))
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
	recs, err := s.Claim(e.ctx, dialecttest.OrderedClaimOpts(10))
	require.NoError(t, err)
	require.Len(t, recs, 1)
	require.Equal(t, heads[keys-1].PartitionKey, recs[0].PartitionKey)
}

// TestMySQLDueClaimBounded: with 100,000 rows delayed an hour, an unordered claim reads
// (handler reads: index entries and rows) about as many rows as it returns, scoped or not,
// whether nothing or 100 rows are due.
func TestMySQLDueClaimBounded(t *testing.T) {
	t.Parallel()
	const delayed = 100_000
	e := setupMySQL(t, "")
	digits := `(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4` +
		` UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)`
	bulk := func(thousands int, due string) {
		_, err := e.db.ExecContext(e.ctx, "INSERT INTO `"+e.table+"` (id, namespace, topic, payload, payload_hash, next_attempt_at, created_at, updated_at)"+
			` SELECT UNHEX(REPLACE(UUID(), '-', '')), 'orders', 'order.created', '{"n":1}', UNHEX(SHA2('{"n":1}', 256)), `+due+
			`, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) FROM `+digits+` a, `+digits+` b, `+digits+` c WHERE a.d + 10 * b.d + 100 * c.d < ?`, thousands)
		require.NoError(t, err)
	}
	for range delayed / 1000 {
		bulk(1000, "UTC_TIMESTAMP(6) + INTERVAL 1 HOUR")
	}
	db := reopenMySQL(t, e.db, nil, nil)
	db.SetMaxOpenConns(1) // so that the counters are the claim's session's
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
	before := reads()
	show := reads() - before // SHOW STATUS counts reads of its own
	claim := func(sc outbox.Scope, limit int) (int, int64) {
		before := reads()
		recs, err := s.Claim(e.ctx, outbox.ClaimOptions{Scope: sc, Limit: limit, Lease: time.Minute, MaxAttempts: 5, WorkerID: "bounded"})
		require.NoError(t, err)
		return len(recs), reads() - before - show
	}
	scopes := []outbox.Scope{{}, {Namespace: "orders", Topics: []string{"order.created", "order.paid"}}}
	for _, sc := range scopes {
		n, r := claim(sc, 100)
		t.Logf("empty claim, scope %+v, %d rows delayed: %d handler reads", sc, delayed, r)
		require.Zero(t, n)
		require.Less(t, r, int64(20), "an empty claim reads a few index entries, not the %d delayed rows", delayed)
	}
	bulk(1000, "UTC_TIMESTAMP(6) - INTERVAL 1 SECOND")
	for _, sc := range scopes {
		n, r := claim(sc, 100)
		t.Logf("claim of 100, scope %+v, %d rows delayed: %d handler reads", sc, delayed, r)
		require.Equal(t, 100, n)
		// Each row: its index entry and its update by primary key.
		require.Less(t, r, int64(3*100+50), "a claim of 100 reads about its rows, not the %d delayed rows", delayed)
	}
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
	dialecttest.UpOrdered(e.ctx, t, e.db, "mysql")
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
	head, err := e.store.Claim(e.ctx, dialecttest.OrderedClaimOpts(1))
	require.NoError(t, err)
	require.Len(t, head, 1)
	require.Equal(t, "a-hot", head[0].PartitionKey, "the hot key's head stays in flight")

	seen := map[string]int{}
	for i := range keys * perKey {
		recs, err := e.store.Claim(e.ctx, dialecttest.OrderedClaimOpts(1))
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
	recs, err := e.store.Claim(e.ctx, dialecttest.OrderedClaimOpts(1))
	require.NoError(t, err)
	require.Empty(t, recs)
}
