package conformance

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

// adminTests check [dialect.Admin]. Each skips, saying so, when the dialect lacks the
// ability, or when its Admin reports the method the test needs as unsupported.
var adminTests = []test{
	{"StatsCounts", testStatsCounts},
	{"StatsOldestPendingAge", testStatsOldestPendingAge},
	{"StatsDeliveredSample", testStatsDeliveredSample},
	{"ListDeadPages", testListDeadPages},
	{"ListDeadFilters", testListDeadFilters},
	{"ReplayOnlyDeadRows", testReplayOnlyDead},
	{"ReplayedRowIsDelivered", testReplayDelivered},
	{"ReplayWhere", testReplayWhere},
	{"DiscardOnlyDeadRows", testDiscardOnlyDead},
	{"Validation", testAdminValidation},
	// Dead letters by error, activity, the lookup by dedupe key.
	{"DeadGroups", testDeadGroups},
	{"DeadCauses", testDeadCauses},
	{"ErrorFilters", testErrorFilters},
	{"ReplayAndDiscardWhereByError", testWhereByError},
	{"Activity", testActivity},
	{"GetByDedupeKey", testGetByDedupeKey},
	{"InspectValidation", testInspectValidation},
	// Purging old rows.
	{"PurgeNeverTouchesLiveRows", testPurgeLiveRows},
	{"PurgeInBatches", testPurgeBatches},
	{"PurgeConcurrently", testPurgeConcurrent},
}

func needAdmin(t *testing.T, e *env) {
	t.Helper()
	if _, ok := e.store.Dialect().(dialect.Admin); !ok {
		t.Skipf("dialect %q does not implement dialect.Admin (stats, dead letters, replay, discard, purge)", e.h.Dialect.Name())
	}
}

// needRetention skips unless the dialect purges: an Admin may report Purge as unsupported.
func needRetention(t *testing.T, e *env) {
	t.Helper()
	needAdmin(t, e)
	_, err := e.store.Purge(e.ctx, outbox.PurgeOptions{DeliveredOlderThan: 24 * time.Hour})
	skipUnsupported(t, err)
	require.NoError(t, err)
}

// skipUnsupported skips when a dialect that has the interface reports a method as
// unsupported, and fails on any other error.
func skipUnsupported(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skipf("the dialect reports this ability as unsupported: %v", err)
	}
	require.NoError(t, err)
}

func topicMsg(ns, topic string, i int) outbox.Message {
	return outbox.Message{Namespace: ns, Topic: topic, Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
}

// settled enqueues msgs, claims them (nothing else may be due in their namespace and
// topics) and settles them as status: delivered (ack) or dead (a permanent nack). It
// returns the records as claimed.
func (e *env) settled(t *testing.T, status outbox.Status, msgs ...outbox.Message) []outbox.Record {
	t.Helper()
	e.enqueue(t, msgs...)
	recs := e.claimAll(t, msgs)
	switch status {
	case outbox.StatusDelivered:
		leases := make([]outbox.Lease, len(recs))
		for i := range recs {
			leases[i] = recs[i].Lease()
		}
		require.NoError(t, e.store.Ack(e.ctx, leases...))
	case outbox.StatusDead:
		fs := make([]outbox.Failure, len(recs))
		for i := range recs {
			fs[i] = outbox.Failure{Lease: recs[i].Lease(), Attempts: recs[i].Attempts, Err: outbox.Permanent(errors.New("broker refused the message"))}
		}
		require.NoError(t, e.store.Nack(e.ctx, outbox.DefaultRetryPolicy(), fs...))
	case outbox.StatusProcessing:
	default:
		t.Fatalf("settled: unexpected status %q", status)
	}
	return recs
}

// claimAll claims exactly the rows of msgs (already enqueued), scoped to their namespace
// and topics.
func (e *env) claimAll(t *testing.T, msgs []outbox.Message) []outbox.Record {
	t.Helper()
	o := claimOpts(len(msgs), time.Hour)
	o.Namespace = msgs[0].Namespace
	for _, m := range msgs {
		if !slices.Contains(o.Topics, m.Topic) {
			o.Topics = append(o.Topics, m.Topic)
		}
	}
	recs := e.claim(t, o)
	require.Len(t, recs, len(msgs), "claim the rows just enqueued")
	return recs
}

// seed writes rows in every state into two namespaces:
//
//	orders/a: 2 delivered, 2 dead, 1 processing, 2 pending due, 1 scheduled
//	orders/b: 1 dead, 1 pending due
//	billing/c: 1 delivered, 1 dead
type seeded struct {
	delivered, dead, processing, pending, scheduled []uuid.UUID
}

func (e *env) seed(t *testing.T) seeded {
	t.Helper()
	var s seeded
	add := func(dst *[]uuid.UUID, recs []outbox.Record) {
		for _, r := range recs {
			*dst = append(*dst, r.ID)
		}
	}
	add(&s.delivered, e.settled(t, outbox.StatusDelivered, topicMsg("orders", "a", 1), topicMsg("orders", "a", 2)))
	add(&s.delivered, e.settled(t, outbox.StatusDelivered, topicMsg("billing", "c", 3)))
	add(&s.dead, e.settled(t, outbox.StatusDead, topicMsg("orders", "a", 4), topicMsg("orders", "a", 5), topicMsg("orders", "b", 6)))
	add(&s.dead, e.settled(t, outbox.StatusDead, topicMsg("billing", "c", 7)))
	add(&s.processing, e.settled(t, outbox.StatusProcessing, topicMsg("orders", "a", 8)))
	for _, r := range e.enqueue(t, topicMsg("orders", "a", 9), topicMsg("orders", "a", 10), topicMsg("orders", "b", 11)) {
		s.pending = append(s.pending, r.ID)
	}
	later := topicMsg("orders", "a", 12)
	later.Delay = time.Hour
	s.scheduled = append(s.scheduled, e.enqueue(t, later)[0].ID)
	return s
}

func (s seeded) all() []uuid.UUID {
	return slices.Concat(s.delivered, s.dead, s.processing, s.pending, s.scheduled)
}

func (e *env) stats(t *testing.T, sc outbox.Scope) outbox.Stats {
	t.Helper()
	st, err := e.store.Stats(e.ctx, sc)
	skipUnsupported(t, err)
	return st
}

// testStatsDeliveredSample calls the dialect's Stats with a sample smaller than the
// delivered rows, as the engine does with outbox.StatsDeliveredSample once a table holds
// more than that many: the sample reads the most recently settled rows, exactly as many as
// asked, and the dialect estimates the table's delivered rows (DeliveredTotal, at least the
// sample). A larger sample reads them all and counts them exactly.
func testStatsDeliveredSample(t *testing.T, h Harness) {
	e := setup(t, h)
	needAdmin(t, e)
	admin := e.store.Dialect().(dialect.Admin)
	tbl, err := dialect.NewTable(e.table)
	require.NoError(t, err)
	var older, newer []outbox.Message
	for i := range 8 {
		older = append(older, topicMsg("orders", "a", i))
	}
	for i := range 5 {
		newer = append(newer, topicMsg("billing", "c", i))
	}
	recs := e.settled(t, outbox.StatusDelivered, older...)
	// The newer rows are settled on a later tick of the database clock.
	eventually(t, 5*time.Second, "the clock to pass the first settle", func() bool {
		return time.Since(e.get(t, recs[0].ID).UpdatedAt) > 5*time.Millisecond
	})
	e.settled(t, outbox.StatusDelivered, newer...)
	e.enqueue(t, topicMsg("orders", "a", 99))

	// One more than the newer rows: the sample's oldest row is one of the older ones, and
	// the counts leave out every row settled at that row's time (the sample may have cut
	// them), so they are exactly the newer rows.
	const sample = 6
	got, err := admin.Stats(e.ctx, e.db, tbl, dialect.StatsParams{DeliveredSample: sample})
	skipUnsupported(t, err)
	require.EqualValues(t, sample, got.DeliveredSampled, "the sample reads as many delivered rows as asked")
	require.GreaterOrEqual(t, got.DeliveredTotal, got.DeliveredSampled,
		"a full sample comes with the dialect's estimate of the table's delivered rows (StatsSample.DeliveredTotal)")
	delivered := map[string]int64{}
	for _, ts := range got.Topics {
		delivered[ts.Namespace+"/"+ts.Topic] += ts.Delivered
	}
	require.Equal(t, map[string]int64{"billing/c": 5, "orders/a": 0}, delivered,
		"the sample is the most recently settled rows, less those settled at the time of its oldest")

	got, err = admin.Stats(e.ctx, e.db, tbl, dialect.StatsParams{DeliveredSample: 100})
	require.NoError(t, err)
	require.EqualValues(t, 13, got.DeliveredSampled, "a sample larger than the delivered rows reads them all")
	delivered = map[string]int64{}
	for _, ts := range got.Topics {
		delivered[ts.Namespace+"/"+ts.Topic] += ts.Delivered
	}
	require.Equal(t, map[string]int64{"billing/c": 5, "orders/a": 8}, delivered)
}

func testStatsCounts(t *testing.T, h Harness) {
	e := setup(t, h)
	needAdmin(t, e)
	e.seed(t)
	st := e.stats(t, outbox.Scope{})
	require.False(t, st.DeliveredEstimated, "a dozen rows are counted exactly")
	zero := func(ts []outbox.TopicStats) []outbox.TopicStats {
		for i := range ts {
			ts[i].OldestPendingAge, ts[i].OldestUndeliveredAge = 0, 0
		}
		return ts
	}
	require.Equal(t, []outbox.TopicStats{
		{Namespace: "billing", Topic: "c", Delivered: 1, Dead: 1},
		{Namespace: "orders", Topic: "a", Pending: 2, Scheduled: 1, Processing: 1, Delivered: 2, Dead: 2},
		{Namespace: "orders", Topic: "b", Pending: 1, Dead: 1},
	}, zero(slices.Clone(st.Topics)), "per topic, sorted by namespace then topic")
	require.Equal(t, [5]int64{3, 1, 1, 3, 4}, [5]int64{st.Pending, st.Scheduled, st.Processing, st.Delivered, st.Dead})

	st = e.stats(t, outbox.Scope{Namespace: "orders", Topics: []string{"b"}})
	require.Len(t, st.Topics, 1)
	require.Equal(t, [5]int64{1, 0, 0, 0, 1}, [5]int64{st.Pending, st.Scheduled, st.Processing, st.Delivered, st.Dead})

	st = e.stats(t, outbox.Scope{Namespace: "billing"})
	require.Equal(t, [5]int64{0, 0, 0, 1, 1}, [5]int64{st.Pending, st.Scheduled, st.Processing, st.Delivered, st.Dead})
	require.Zero(t, st.OldestPendingAge, "no pending row is due in billing")

	st = e.stats(t, outbox.Scope{TenantID: uuid.New()})
	require.Empty(t, st.Topics, "no row belongs to that tenant")
}

func testStatsOldestPendingAge(t *testing.T, h Harness) {
	e := setup(t, h)
	needAdmin(t, e)
	require.Zero(t, e.stats(t, outbox.Scope{}).OldestPendingAge, "an empty table")
	later := topicMsg("orders", "a", 1)
	later.Delay = time.Hour
	e.enqueue(t, later)
	require.Zero(t, e.stats(t, outbox.Scope{}).OldestPendingAge, "a row not yet due has no age")
	require.Zero(t, e.stats(t, outbox.Scope{}).OldestUndeliveredAge, "a row never claimed and not yet due has no age")

	before := time.Now()
	e.enqueue(t, topicMsg("orders", "b", 2))
	var st outbox.Stats
	eventually(t, 10*time.Second, "the due row to age", func() bool {
		st = e.stats(t, outbox.Scope{})
		return st.OldestPendingAge >= 20*time.Millisecond
	})
	// The database clock and this process's clock are the same host's here; allow slack.
	require.LessOrEqual(t, st.OldestPendingAge, time.Since(before)+2*time.Second)
	require.GreaterOrEqual(t, st.OldestUndeliveredAge, st.OldestPendingAge, "a due row is undelivered since it was due")
	b := st.Topics[slices.IndexFunc(st.Topics, func(ts outbox.TopicStats) bool { return ts.Topic == "b" })]
	require.Equal(t, st.OldestPendingAge, b.OldestPendingAge, "the total age is the oldest topic's")
}

// deadRows makes n dead rows in orders/topic, in batches of three nacked in one call (so some
// share updated_at and pagination must break ties by id), and returns their ids.
func (e *env) deadRows(t *testing.T, n int, topic string) []uuid.UUID {
	t.Helper()
	var out []uuid.UUID
	for i := 0; i < n; i += 3 {
		var msgs []outbox.Message
		for j := i; j < min(n, i+3); j++ {
			msgs = append(msgs, topicMsg("orders", topic, j))
		}
		for _, r := range e.settled(t, outbox.StatusDead, msgs...) {
			out = append(out, r.ID)
		}
	}
	return out
}

func (e *env) listAll(t *testing.T, o outbox.ListDeadOptions) (recs []outbox.Record, pages int) {
	t.Helper()
	for {
		page, err := e.store.ListDead(e.ctx, o)
		skipUnsupported(t, err)
		pages++
		require.LessOrEqual(t, len(page.Records), max(o.Limit, 1))
		recs = append(recs, page.Records...)
		if page.Next == "" {
			return recs, pages
		}
		require.Len(t, page.Records, o.Limit, "only the last page may be short")
		o.Cursor = page.Next
		require.Less(t, pages, 100, "pagination must end")
	}
}

func testListDeadPages(t *testing.T, h Harness) {
	e := setup(t, h)
	needAdmin(t, e)
	s := e.seed(t)
	dead := e.deadRows(t, 7, "p")
	want := append(dead, s.dead...)

	recs, pages := e.listAll(t, outbox.ListDeadOptions{Limit: 3})
	require.Equal(t, 4, pages, "11 dead rows in pages of 3")
	require.ElementsMatch(t, want, ids(recs), "every dead row once, nothing else")
	for i, r := range recs {
		require.Equal(t, outbox.StatusDead, r.Status)
		require.Equal(t, "permanent: broker refused the message", r.LastError)
		require.Equal(t, 1, r.Attempts)
		require.NoError(t, r.Integrity(), "the payload comes with the record")
		if i > 0 {
			prev := recs[i-1]
			c := prev.UpdatedAt.Compare(r.UpdatedAt)
			require.True(t, c > 0 || (c == 0 && string(prev.ID[:]) > string(r.ID[:])),
				"newest death first, ties by id descending: %d %s %s then %s %s", i, prev.UpdatedAt, prev.ID, r.UpdatedAt, r.ID)
		}
	}
	full, err := e.store.ListDead(e.ctx, outbox.ListDeadOptions{})
	require.NoError(t, err)
	require.Equal(t, ids(recs), ids(full.Records), "one default page holds them all, in the same order")
	require.Empty(t, full.Next)

	// Rows that die while an operator pages are newer than the first page: later pages
	// neither repeat nor lose rows.
	first, err := e.store.ListDead(e.ctx, outbox.ListDeadOptions{Limit: 4})
	require.NoError(t, err)
	e.deadRows(t, 2, "p")
	rest, _ := e.listAll(t, outbox.ListDeadOptions{Limit: 4, Cursor: first.Next})
	require.Equal(t, ids(recs), append(ids(first.Records), ids(rest)...))
}

func testListDeadFilters(t *testing.T, h Harness) {
	e := setup(t, h)
	needAdmin(t, e)
	s := e.seed(t)
	recs, _ := e.listAll(t, outbox.ListDeadOptions{DeadFilter: outbox.DeadFilter{Scope: outbox.Scope{Namespace: "orders", Topics: []string{"b"}}}, Limit: 10})
	require.Len(t, recs, 1)
	require.Equal(t, "b", recs[0].Topic)
	recs, _ = e.listAll(t, outbox.ListDeadOptions{DeadFilter: outbox.DeadFilter{Scope: outbox.Scope{Namespace: "billing"}}, Limit: 10})
	require.Len(t, recs, 1)
	require.Equal(t, s.dead[3], recs[0].ID)

	later := e.deadRows(t, 2, "late")
	all, _ := e.listAll(t, outbox.ListDeadOptions{Limit: 10})
	cut := e.get(t, later[0]).UpdatedAt
	if u := e.get(t, later[1]).UpdatedAt; u.Before(cut) {
		cut = u
	}
	newer, _ := e.listAll(t, outbox.ListDeadOptions{DeadFilter: outbox.DeadFilter{Since: cut}, Limit: 10})
	older, _ := e.listAll(t, outbox.ListDeadOptions{DeadFilter: outbox.DeadFilter{Until: cut}, Limit: 10})
	require.ElementsMatch(t, later, ids(newer), "Since includes its bound")
	require.Equal(t, len(all), len(newer)+len(older), "Since and Until split the rows at one instant")
	for _, r := range older {
		require.True(t, r.UpdatedAt.Before(cut), "Until excludes its bound")
	}
}

func testReplayOnlyDead(t *testing.T, h Harness) {
	e := setup(t, h)
	needAdmin(t, e)
	s := e.seed(t)
	before := map[uuid.UUID]outbox.Record{}
	for _, id := range s.all() {
		before[id] = e.get(t, id)
	}
	ghost := uuid.New()
	req := append(s.all(), ghost, s.dead[0]) // a repeat counts once
	res, err := e.store.Replay(e.ctx, req...)
	skipUnsupported(t, err)
	require.Equal(t, s.dead, res.Replayed, "exactly the dead rows, in the order given")
	require.Equal(t, slices.Concat(s.delivered, s.processing, s.pending, s.scheduled, []uuid.UUID{ghost}), res.Skipped)

	for id, was := range before {
		got := e.get(t, id)
		if !slices.Contains(s.dead, id) {
			require.Equal(t, was, got, "a row that was not dead is untouched")
			continue
		}
		require.Equal(t, outbox.StatusPending, got.Status)
		require.Zero(t, got.Attempts, "attempts start again")
		require.Equal(t, 1, got.Replays)
		require.Equal(t, was.LastError, got.LastError, "the last error stays until the next outcome")
		require.NotEqual(t, was.LeaseToken, got.LeaseToken, "a fresh lease token")
		require.Empty(t, got.LockedBy)
		require.True(t, got.LockedUntil.IsZero())
		require.False(t, got.UpdatedAt.Before(was.UpdatedAt))
		require.False(t, got.NextAttemptAt.After(got.UpdatedAt), "due at once")
	}
	again, err := e.store.Replay(e.ctx, s.dead...)
	require.NoError(t, err)
	require.Empty(t, again.Replayed, "replay is idempotent")
	require.Equal(t, s.dead, again.Skipped)
	require.Equal(t, 1, e.get(t, s.dead[0]).Replays)
	none, err := e.store.Replay(e.ctx)
	require.NoError(t, err)
	require.Empty(t, none.Replayed)
}

func testReplayDelivered(t *testing.T, h Harness) {
	e := setup(t, h)
	needAdmin(t, e)
	m := topicMsg("orders", "a", 1)
	dead := e.settled(t, outbox.StatusDead, m)[0]
	res, err := e.store.Replay(e.ctx, dead.ID)
	skipUnsupported(t, err)
	require.Equal(t, []uuid.UUID{dead.ID}, res.Replayed)
	st := e.stats(t, outbox.Scope{})
	require.Equal(t, [2]int64{1, 0}, [2]int64{st.Pending, st.Dead}, "the replayed row is pending and due")

	recs := e.claimAll(t, []outbox.Message{m})
	require.Equal(t, dead.ID, recs[0].ID)
	require.Equal(t, 1, recs[0].Attempts, "the replayed row starts its attempts again")
	require.ErrorIs(t, e.store.Ack(e.ctx, dead.Lease()), outbox.ErrLeaseLost, "no lease of the row's earlier life settles it")
	require.NoError(t, e.store.Ack(e.ctx, recs[0].Lease()))
	got := e.get(t, dead.ID)
	require.Equal(t, outbox.StatusDelivered, got.Status)
	require.Equal(t, 1, got.Replays)
	_, err = e.store.Replay(e.ctx, dead.ID)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDelivered, e.get(t, dead.ID).Status, "a delivered row is never replayed")
}

func testReplayWhere(t *testing.T, h Harness) {
	e := setup(t, h)
	needAdmin(t, e)
	s := e.seed(t)
	n, err := e.store.ReplayWhere(e.ctx, outbox.DeadFilter{Scope: outbox.Scope{Namespace: "orders", Topics: []string{"a"}}})
	skipUnsupported(t, err)
	require.EqualValues(t, 2, n)
	for i, id := range s.dead {
		want := outbox.StatusDead
		if i < 2 {
			want = outbox.StatusPending
		}
		require.Equal(t, want, e.get(t, id).Status, "only orders/a rows are replayed")
	}
	n, err = e.store.ReplayWhere(e.ctx, outbox.DeadFilter{})
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "the rest")
	require.Zero(t, e.count(t, outbox.StatusDead))
}

func testDiscardOnlyDead(t *testing.T, h Harness) {
	e := setup(t, h)
	needAdmin(t, e)
	s := e.seed(t)
	keyed := topicMsg("orders", "k", 1)
	keyed.DedupeKey = "order-42"
	dk := e.settled(t, outbox.StatusDead, keyed)[0].ID

	dead := append(slices.Clone(s.dead), dk)
	res, err := e.store.Discard(e.ctx, append(s.all(), dk)...)
	skipUnsupported(t, err)
	require.Equal(t, dead, res.Discarded)
	require.Equal(t, slices.Concat(s.delivered, s.processing, s.pending, s.scheduled), res.Skipped)
	for _, id := range dead {
		_, err := e.store.Get(e.ctx, id)
		require.ErrorIs(t, err, outbox.ErrNotFound)
	}
	require.Equal(t, len(s.all())-len(s.dead), e.count(t), "nothing else was deleted")
	require.False(t, e.enqueue(t, keyed)[0].Duplicate, "the discarded row's dedupe key is free again")
	again, err := e.store.Discard(e.ctx, dead...)
	require.NoError(t, err)
	require.Empty(t, again.Discarded)
}

func testAdminValidation(t *testing.T, h Harness) {
	e := setup(t, h)
	needAdmin(t, e)
	e.seed(t)
	cases := map[string]error{}
	_, cases["limit"] = e.store.ListDead(e.ctx, outbox.ListDeadOptions{Limit: outbox.MaxBatch + 1})
	_, cases["negative limit"] = e.store.ListDead(e.ctx, outbox.ListDeadOptions{Limit: -1})
	_, cases["cursor"] = e.store.ListDead(e.ctx, outbox.ListDeadOptions{Cursor: "not-a-cursor"})
	_, cases["until before since"] = e.store.ListDead(e.ctx, outbox.ListDeadOptions{DeadFilter: outbox.DeadFilter{Since: time.Now(), Until: time.Now().Add(-time.Hour)}})
	_, cases["stats topic"] = e.store.Stats(e.ctx, outbox.Scope{Topics: []string{""}})
	_, cases["replay ids"] = e.store.Replay(e.ctx, make([]uuid.UUID, outbox.MaxBatch+1)...)
	_, cases["discard ids"] = e.store.Discard(e.ctx, make([]uuid.UUID, outbox.MaxBatch+1)...)
	_, cases["purge nothing"] = e.store.Purge(e.ctx, outbox.PurgeOptions{})
	_, cases["purge negative"] = e.store.Purge(e.ctx, outbox.PurgeOptions{DeadOlderThan: -time.Second})
	_, cases["purge batch"] = e.store.Purge(e.ctx, outbox.PurgeOptions{DeadOlderThan: time.Second, BatchSize: outbox.MaxBatch + 1})
	for name, err := range cases {
		require.ErrorIs(t, err, outbox.ErrInvalid, name)
	}
	require.Equal(t, 4, e.count(t, outbox.StatusDead), "bad input changed nothing")
	require.Equal(t, 3, e.count(t, outbox.StatusDelivered))
}

func testPurgeLiveRows(t *testing.T, h Harness) {
	e := setup(t, h)
	needRetention(t, e)
	s := e.seed(t)
	keyed := topicMsg("orders", "k", 1)
	keyed.DedupeKey = "order-42"
	e.settled(t, outbox.StatusDelivered, keyed)

	res, err := e.store.Purge(e.ctx, outbox.PurgeOptions{DeliveredOlderThan: time.Hour, DeadOlderThan: time.Hour})
	skipUnsupported(t, err)
	require.Zero(t, res, "nothing is an hour old")
	require.Equal(t, len(s.all())+1, e.count(t))

	// One microsecond: every settled row qualifies as soon as the database clock moves on.
	var total outbox.PurgeResult
	eventually(t, 10*time.Second, "settled rows to be purged", func() bool {
		res, err := e.store.Purge(e.ctx, outbox.PurgeOptions{DeliveredOlderThan: time.Microsecond, DeadOlderThan: time.Microsecond})
		require.NoError(t, err)
		total.Delivered += res.Delivered
		total.Dead += res.Dead
		return e.count(t, outbox.StatusDelivered)+e.count(t, outbox.StatusDead) == 0
	})
	require.Equal(t, outbox.PurgeResult{Delivered: 4, Dead: 4}, total)
	require.Equal(t, len(s.processing), e.count(t, outbox.StatusProcessing), "processing rows stay")
	require.Equal(t, len(s.pending)+len(s.scheduled), e.count(t, outbox.StatusPending), "pending rows stay")
	for _, id := range slices.Concat(s.processing, s.pending, s.scheduled) {
		e.get(t, id)
	}
	require.False(t, e.enqueue(t, keyed)[0].Duplicate, "the purged row's dedupe key is free again")
}

// oldRows makes n delivered rows and waits until a purge of rows older than a
// millisecond would take them all.
func (e *env) oldRows(t *testing.T, n int) {
	t.Helper()
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = topicMsg("orders", "a", i)
	}
	e.settled(t, outbox.StatusDelivered, msgs...)
	e.enqueue(t, topicMsg("orders", "live", 0)) // a pending row, which must stay
	time.Sleep(5 * time.Millisecond)            // an age the purge must see, not a wait for a result
}

func testPurgeBatches(t *testing.T, h Harness) {
	e := setup(t, h)
	needRetention(t, e)
	e.oldRows(t, 25)
	var progress []outbox.PurgeResult
	res, err := e.store.Purge(e.ctx, outbox.PurgeOptions{
		DeliveredOlderThan: time.Millisecond, BatchSize: 10,
		Progress: func(r outbox.PurgeResult) { progress = append(progress, r) },
	})
	skipUnsupported(t, err)
	require.Equal(t, outbox.PurgeResult{Delivered: 25}, res)
	require.Equal(t, []outbox.PurgeResult{{Delivered: 10}, {Delivered: 20}, {Delivered: 25}}, progress, "batches of 10, running totals")
	require.Equal(t, 1, e.count(t), "the pending row stays")
}

func testPurgeConcurrent(t *testing.T, h Harness) {
	e := setup(t, h)
	needRetention(t, e)
	e.oldRows(t, 60)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int64
		errs  []error
	)
	for range 3 {
		wg.Go(func() {
			res, err := e.store.Purge(e.ctx, outbox.PurgeOptions{DeliveredOlderThan: time.Millisecond, BatchSize: 7})
			mu.Lock()
			defer mu.Unlock()
			total += res.Delivered
			if err != nil {
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		skipUnsupported(t, err)
	}
	// A purger stops at its first short batch, which a concurrent one may cause; whatever
	// is left, one more purge takes, and no row is counted twice.
	res, err := e.store.Purge(e.ctx, outbox.PurgeOptions{DeliveredOlderThan: time.Millisecond})
	require.NoError(t, err)
	require.EqualValues(t, 60, total+res.Delivered, "every row deleted once")
	require.Equal(t, 1, e.count(t), "the pending row stays")
}

// needInspect skips unless the dialect groups dead rows by their error and filters them
// by it: an Admin may report those as unsupported.
func needInspect(t *testing.T, e *env) {
	t.Helper()
	needAdmin(t, e)
	_, err := e.store.DeadGroups(e.ctx, outbox.DeadGroupsOptions{})
	skipUnsupported(t, err)
	require.NoError(t, err)
	_, err = e.store.ListDead(e.ctx, outbox.ListDeadOptions{DeadFilter: outbox.DeadFilter{ErrorContains: "x"}})
	skipUnsupported(t, err)
	require.NoError(t, err)
}

// deadWith enqueues msgs, claims them and nacks them as permanent failures with reason,
// so that their last error is "permanent: " + reason. It returns their ids.
func (e *env) deadWith(t *testing.T, reason string, msgs ...outbox.Message) []uuid.UUID {
	t.Helper()
	e.enqueue(t, msgs...)
	recs := e.claimAll(t, msgs)
	fs := make([]outbox.Failure, len(recs))
	for i := range recs {
		fs[i] = outbox.Failure{Lease: recs[i].Lease(), Attempts: recs[i].Attempts, Err: outbox.Permanent(errors.New(reason))}
	}
	require.NoError(t, e.store.Nack(e.ctx, outbox.DefaultRetryPolicy(), fs...))
	return ids(recs)
}

// errorSeed makes dead rows of three errors (3 "timeout", 2 "schema", 1 "refused") in
// orders/a and orders/b, and live and delivered rows beside them.
type errorSeeded struct{ timeout, schema, refused []uuid.UUID }

func (e *env) errorSeed(t *testing.T) errorSeeded {
	t.Helper()
	var s errorSeeded
	s.timeout = e.deadWith(t, "timeout after 5s", topicMsg("orders", "a", 1), topicMsg("orders", "a", 2), topicMsg("orders", "b", 3))
	s.schema = e.deadWith(t, "schema: field total missing", topicMsg("orders", "a", 4), topicMsg("orders", "a", 5))
	s.refused = e.deadWith(t, "refused", topicMsg("orders", "b", 6))
	e.settled(t, outbox.StatusDelivered, topicMsg("orders", "a", 7))
	e.enqueue(t, topicMsg("orders", "a", 8))
	return s
}

// testDeadCauses: one error met on four topics, with ids and sizes in it, is one cause with
// its distinct texts inside; replaying a cause replays its rows and no other.
func testDeadCauses(t *testing.T, h Harness) {
	e := setup(t, h)
	needInspect(t, e)
	var large []uuid.UUID
	for i, topic := range []string{"orders.created", "orders.paid", "billing.invoice.sent", "shop.cart"} {
		large = append(large, e.deadWith(t, "kafka: produce to "+topic+": MESSAGE_TOO_LARGE", topicMsg("orders", topic, i))...)
	}
	e.deadWith(t, fmt.Sprintf("webhook: POST https://hooks.example.com/t/%s: status 503", uuid.New()), topicMsg("orders", "a", 10))
	e.deadWith(t, fmt.Sprintf("webhook: POST https://hooks.example.com/t/%s: status 503", uuid.New()), topicMsg("orders", "a", 11))
	refused := e.deadWith(t, "webhook: POST https://hooks.example.com/t/x: status 400", topicMsg("orders", "a", 12))

	c, err := e.store.DeadCauses(e.ctx, outbox.DeadGroupsOptions{})
	skipUnsupported(t, err)
	require.EqualValues(t, 7, c.Total)
	require.Zero(t, c.Ungrouped)
	require.Len(t, c.Causes, 3, "%+v", c.Causes)
	require.Equal(t, "permanent: kafka: produce to <name>: MESSAGE_TOO_LARGE", c.Causes[0].Fingerprint)
	require.EqualValues(t, 4, c.Causes[0].Count)
	require.Len(t, c.Causes[0].Texts, 4, "the distinct texts inside the cause")
	require.Equal(t, "permanent: webhook: POST https://hooks.example.com/…: status 503", c.Causes[1].Fingerprint)
	require.EqualValues(t, 2, c.Causes[1].Count)
	require.Equal(t, "permanent: webhook: POST https://hooks.example.com/…: status 400", c.Causes[2].Fingerprint, "another status, another cause")
	require.True(t, c.Newest.Equal(e.get(t, refused[0]).UpdatedAt))

	n, err := e.store.ReplayCause(e.ctx, outbox.DeadFilter{Until: c.Newest.Add(time.Microsecond)}, c.Causes[0].Fingerprint)
	require.NoError(t, err)
	require.EqualValues(t, 4, n)
	for _, id := range large {
		require.Equal(t, outbox.StatusPending, e.get(t, id).Status)
	}
	require.Equal(t, outbox.StatusDead, e.get(t, refused[0]).Status, "another cause stays dead")
	n, err = e.store.DiscardCause(e.ctx, outbox.DeadFilter{Scope: outbox.Scope{Namespace: "other"}}, c.Causes[1].Fingerprint)
	require.NoError(t, err)
	require.Zero(t, n, "the filter still applies")
	n, err = e.store.DiscardCause(e.ctx, outbox.DeadFilter{}, c.Causes[1].Fingerprint)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	c, err = e.store.DeadCauses(e.ctx, outbox.DeadGroupsOptions{Limit: 1})
	require.NoError(t, err)
	require.EqualValues(t, 1, c.Total)
	require.Len(t, c.Causes, 1)
}

func testDeadGroups(t *testing.T, h Harness) {
	e := setup(t, h)
	needInspect(t, e)
	s := e.errorSeed(t)
	g, err := e.store.DeadGroups(e.ctx, outbox.DeadGroupsOptions{})
	skipUnsupported(t, err)
	require.EqualValues(t, 6, g.Total)
	require.Len(t, g.Groups, 3)
	want := []struct {
		err string
		n   int64
		ids []uuid.UUID
	}{{"permanent: timeout after 5s", 3, s.timeout}, {"permanent: schema: field total missing", 2, s.schema}, {"permanent: refused", 1, s.refused}}
	newest := time.Time{}
	for i, w := range want {
		got := g.Groups[i]
		require.Equal(t, w.err, got.LastError, "most rows first")
		require.Equal(t, w.n, got.Count)
		first, last := e.get(t, w.ids[0]).UpdatedAt, e.get(t, w.ids[0]).UpdatedAt
		for _, id := range w.ids {
			u := e.get(t, id).UpdatedAt
			first, last = minTime(first, u), maxTime(last, u)
		}
		require.True(t, got.FirstDied.Equal(first), "first death %s, want %s", got.FirstDied, first)
		require.True(t, got.LastDied.Equal(last), "last death %s, want %s", got.LastDied, last)
		newest = maxTime(newest, last)
	}
	require.True(t, g.Newest.Equal(newest), "newest death of all")

	g, err = e.store.DeadGroups(e.ctx, outbox.DeadGroupsOptions{Limit: 1, DeadFilter: outbox.DeadFilter{Scope: outbox.Scope{Namespace: "orders", Topics: []string{"b"}}}})
	require.NoError(t, err)
	require.EqualValues(t, 2, g.Total, "the total counts every group, also those past the limit")
	require.Len(t, g.Groups, 1)
	require.Equal(t, int64(1), g.Groups[0].Count)
	require.Equal(t, "permanent: refused", g.Groups[0].LastError, "ties by error text")

	g, err = e.store.DeadGroups(e.ctx, outbox.DeadGroupsOptions{DeadFilter: outbox.DeadFilter{Scope: outbox.Scope{Namespace: "billing"}}})
	require.NoError(t, err)
	require.Zero(t, g.Total)
	require.Empty(t, g.Groups)
	require.True(t, g.Newest.IsZero())

	// Until just after the newest death selects exactly the rows counted, even after more die.
	g, err = e.store.DeadGroups(e.ctx, outbox.DeadGroupsOptions{})
	require.NoError(t, err)
	// SQLite's clock has millisecond steps: let the database clock pass the newest death.
	eventually(t, 10*time.Second, "the database clock to pass the newest death", func() bool {
		a, err := e.store.Activity(e.ctx, outbox.ActivityOptions{Minutes: 1})
		require.NoError(t, err)
		return a.Now.After(g.Newest.Add(time.Millisecond))
	})
	e.deadWith(t, "later", topicMsg("orders", "c", 9))
	g2, err := e.store.DeadGroups(e.ctx, outbox.DeadGroupsOptions{DeadFilter: outbox.DeadFilter{Until: g.Newest.Add(time.Microsecond)}})
	require.NoError(t, err)
	require.Equal(t, g.Total, g2.Total)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func testErrorFilters(t *testing.T, h Harness) {
	e := setup(t, h)
	needInspect(t, e)
	s := e.errorSeed(t)
	list := func(f outbox.DeadFilter) []uuid.UUID {
		recs, _ := e.listAll(t, outbox.ListDeadOptions{DeadFilter: f, Limit: 2})
		return ids(recs)
	}
	require.ElementsMatch(t, s.timeout, list(outbox.DeadFilter{ErrorContains: "timeout"}))
	require.ElementsMatch(t, slices.Concat(s.timeout, s.schema, s.refused), list(outbox.DeadFilter{ErrorContains: "permanent"}))
	require.Empty(t, list(outbox.DeadFilter{ErrorContains: "TIMEOUT"}), "case-sensitive")
	require.Empty(t, list(outbox.DeadFilter{ErrorContains: "%"}), "no pattern syntax")
	require.Empty(t, list(outbox.DeadFilter{ErrorContains: "_"}), "no pattern syntax")
	require.ElementsMatch(t, s.schema, list(outbox.DeadFilter{ErrorContains: "schema: field"}))
	require.ElementsMatch(t, s.refused, list(outbox.DeadFilter{LastError: "permanent: refused"}))
	require.Empty(t, list(outbox.DeadFilter{LastError: "refused"}), "LastError is the whole text")
	require.ElementsMatch(t, s.timeout[2:], list(outbox.DeadFilter{ErrorContains: "timeout", Scope: outbox.Scope{Topics: []string{"b"}}}))

	g, err := e.store.DeadGroups(e.ctx, outbox.DeadGroupsOptions{DeadFilter: outbox.DeadFilter{ErrorContains: "e"}})
	require.NoError(t, err)
	require.EqualValues(t, 6, g.Total)
	g, err = e.store.DeadGroups(e.ctx, outbox.DeadGroupsOptions{DeadFilter: outbox.DeadFilter{ErrorContains: "schema"}})
	require.NoError(t, err)
	require.EqualValues(t, 2, g.Total)
	require.Len(t, g.Groups, 1)
}

func testWhereByError(t *testing.T, h Harness) {
	e := setup(t, h)
	needInspect(t, e)
	s := e.errorSeed(t)
	n, err := e.store.ReplayWhere(e.ctx, outbox.DeadFilter{LastError: "permanent: timeout after 5s"})
	skipUnsupported(t, err)
	require.EqualValues(t, 3, n)
	for _, id := range s.timeout {
		require.Equal(t, outbox.StatusPending, e.get(t, id).Status)
	}
	n, err = e.store.DiscardWhere(e.ctx, outbox.DeadFilter{ErrorContains: "schema"})
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	for _, id := range s.schema {
		_, err := e.store.Get(e.ctx, id)
		require.ErrorIs(t, err, outbox.ErrNotFound)
	}
	require.Equal(t, outbox.StatusDead, e.get(t, s.refused[0]).Status, "the other group is untouched")
	require.Equal(t, 1, e.count(t, outbox.StatusDead))
	require.Equal(t, 1, e.count(t, outbox.StatusDelivered))
}

func testActivity(t *testing.T, h Harness) {
	e := setup(t, h)
	needAdmin(t, e)
	a, err := e.store.Activity(e.ctx, outbox.ActivityOptions{})
	skipUnsupported(t, err)
	require.Len(t, a.Minutes, outbox.DefaultActivityMinutes)
	for _, m := range a.Minutes {
		require.Zero(t, m.Delivered+m.Dead, "an empty table")
	}
	before := time.Now().UTC().Truncate(time.Minute)
	e.settled(t, outbox.StatusDelivered, topicMsg("orders", "a", 1), topicMsg("orders", "a", 2), topicMsg("orders", "c", 3))
	e.deadWith(t, "boom", topicMsg("orders", "a", 4), topicMsg("orders", "b", 5))
	e.enqueue(t, topicMsg("orders", "a", 6))
	a, err = e.store.Activity(e.ctx, outbox.ActivityOptions{Minutes: 5})
	require.NoError(t, err)
	require.Len(t, a.Minutes, 5)
	require.True(t, a.ExactSince.IsZero(), "a handful of rows is counted exactly")
	var delivered, dead int64
	for i, m := range a.Minutes {
		require.Equal(t, time.UTC, m.Start.Location())
		require.Zero(t, m.Start.Second())
		if i > 0 {
			require.Equal(t, time.Minute, m.Start.Sub(a.Minutes[i-1].Start), "consecutive minutes")
		}
		delivered += m.Delivered
		dead += m.Dead
	}
	require.Equal(t, [2]int64{3, 2}, [2]int64{delivered, dead}, "every settled row in the window, once")
	last := a.Minutes[len(a.Minutes)-1].Start
	// The database clock and this process's are the same host's: allow a minute of slack.
	require.WithinDuration(t, before, last, time.Minute, "the last minute is the current one")
}

func testGetByDedupeKey(t *testing.T, h Harness) {
	e := setup(t, h)
	needAdmin(t, e)
	keyed := topicMsg("orders", "a", 1)
	keyed.DedupeKey = "order-42"
	res := e.enqueue(t, keyed, topicMsg("orders", "a", 2))
	got, err := e.store.GetByDedupeKey(e.ctx, "orders", "a", "order-42")
	skipUnsupported(t, err)
	require.Equal(t, res[0].ID, got.ID)
	require.Equal(t, "order-42", got.DedupeKey)
	require.NoError(t, got.Integrity(), "the whole row, payload included")
	for _, k := range [][3]string{{"orders", "b", "order-42"}, {"billing", "a", "order-42"}, {"orders", "a", "order-43"}, {"orders", "a", "ORDER-42"}} {
		_, err = e.store.GetByDedupeKey(e.ctx, k[0], k[1], k[2])
		require.ErrorIs(t, err, outbox.ErrNotFound, "%v", k)
	}
	// A discarded row frees its key: not found any more.
	other := topicMsg("orders", "k", 3)
	other.DedupeKey = "gone"
	id := e.deadWith(t, "boom", other)[0]
	_, err = e.store.GetByDedupeKey(e.ctx, "orders", "k", "gone")
	require.NoError(t, err)
	_, err = e.store.Discard(e.ctx, id)
	require.NoError(t, err)
	_, err = e.store.GetByDedupeKey(e.ctx, "orders", "k", "gone")
	require.ErrorIs(t, err, outbox.ErrNotFound)
}

func testInspectValidation(t *testing.T, h Harness) {
	e := setup(t, h)
	needInspect(t, e)
	e.errorSeed(t)
	cases := map[string]error{}
	_, cases["groups limit"] = e.store.DeadGroups(e.ctx, outbox.DeadGroupsOptions{Limit: outbox.MaxBatch + 1})
	_, cases["groups negative limit"] = e.store.DeadGroups(e.ctx, outbox.DeadGroupsOptions{Limit: -1})
	_, cases["groups scope"] = e.store.DeadGroups(e.ctx, outbox.DeadGroupsOptions{DeadFilter: outbox.DeadFilter{Scope: outbox.Scope{Topics: []string{""}}}})
	_, cases["error text"] = e.store.ListDead(e.ctx, outbox.ListDeadOptions{DeadFilter: outbox.DeadFilter{ErrorContains: "a\x00b"}})
	_, cases["error length"] = e.store.DeadGroups(e.ctx, outbox.DeadGroupsOptions{DeadFilter: outbox.DeadFilter{LastError: string(make([]byte, outbox.MaxLastErrorBytes+1))}})
	_, cases["replay where error"] = e.store.ReplayWhere(e.ctx, outbox.DeadFilter{ErrorContains: "\xff"})
	_, cases["discard where error"] = e.store.DiscardWhere(e.ctx, outbox.DeadFilter{LastError: "\xff"})
	_, cases["activity minutes"] = e.store.Activity(e.ctx, outbox.ActivityOptions{Minutes: outbox.MaxActivityMinutes + 1})
	_, cases["activity negative"] = e.store.Activity(e.ctx, outbox.ActivityOptions{Minutes: -1})
	_, cases["dedupe no namespace"] = e.store.GetByDedupeKey(e.ctx, "", "a", "k")
	_, cases["dedupe no key"] = e.store.GetByDedupeKey(e.ctx, "orders", "a", "")
	for name, err := range cases {
		require.ErrorIs(t, err, outbox.ErrInvalid, name)
	}
	require.Equal(t, 6, e.count(t, outbox.StatusDead), "bad input changed nothing")
}
