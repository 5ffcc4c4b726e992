package conformance

import (
	"bytes"
	"cmp"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

var claimTests = []test{
	{"Order", testClaimOrder},
	{"OrderIsNotIDOrder", testClaimOrderNotIDs},
	{"DueOrder", testClaimDueOrder},
	{"Fields", testClaimFields},
	{"Scope", testClaimScope},
	{"EmptyIsNotAnError", testClaimEmpty},
	{"AttemptLimitExcludes", testClaimAttemptLimit},
	{"BuryExhausted", func(t *testing.T, h Harness) { testBuryExhausted(t, h, (*outbox.Store).Bury) }},
	{"BuryExpiredExhausted", func(t *testing.T, h Harness) { testBuryExhausted(t, h, (*outbox.Store).BuryExpired) }},
	{"BuryRespectsScope", testBuryScope},
	{"ExpiredLeaseAtLimitIsNotReclaimed", testExpiredAtLimit},
	{"DamagedRowsFailOnlyThemselves", testDamagedRows},
}

func testClaimOrder(t *testing.T, h Harness) {
	e := setup(t, h)
	want := e.enqueueN(t, 3) // three transactions: created_at increases
	for _, r := range e.enqueue(t, msg(3), msg(4), msg(5)) {
		want = append(want, r.ID) // one transaction: same created_at, id order
	}
	first := e.claim(t, claimOpts(4, time.Minute))
	rest := e.claim(t, claimOpts(10, time.Minute))
	require.Equal(t, want[:4], ids(first), "claims take the oldest rows first, in (created_at, id) order")
	require.Equal(t, want[4:], ids(rest))
	require.Empty(t, e.claim(t, claimOpts(10, time.Minute)))
}

// testClaimDueOrder: behind many rows delayed for later, claims take the rows that are due,
// in the order they became due (next_attempt_at, then id), whatever order they were
// created in: a row put back for a retry, and a row delayed briefly that has fallen due,
// come after the rows that were due before them.
func testClaimDueOrder(t *testing.T, h Harness) {
	e := setup(t, h)
	delayed := make([]outbox.Message, 50)
	for i := range delayed {
		delayed[i] = msg(100 + i)
		delayed[i].Delay = time.Hour
	}
	e.enqueue(t, delayed...)
	retried := e.enqueue(t, msg(0))[0].ID
	first := e.claim(t, claimOpts(1, time.Minute))
	require.Equal(t, []uuid.UUID{retried}, ids(first), "the one due row, not the delayed ones")
	brief := msg(1)
	brief.Delay = time.Second
	briefID := e.enqueue(t, brief)[0].ID
	due := e.enqueueN(t, 3)
	// Back to pending, due now: after the three rows above, though created before them.
	require.NoError(t, e.store.Complete(e.ctx, outbox.Outcome{Lease: first[0].Lease(), Status: outbox.StatusPending}))
	want := append(due, retried)
	if b, r := e.get(t, briefID), e.get(t, retried); b.NextAttemptAt.After(r.NextAttemptAt) {
		// Due once its second has passed (on the process clock; the database's may lag,
		// which the eventually below allows for).
		time.Sleep(time.Until(b.NextAttemptAt) + 50*time.Millisecond)
	} else {
		// The enqueues and the put-back took over a second: the briefly delayed row fell
		// due before the retried one, and takes its place in the order by due time.
		t.Logf("the enqueues took over a second: the briefly delayed row fell due before the retried one")
		recs := []outbox.Record{b, r}
		for _, id := range due {
			recs = append(recs, e.get(t, id))
		}
		slices.SortFunc(recs, func(x, y outbox.Record) int {
			return cmp.Or(x.NextAttemptAt.Compare(y.NextAttemptAt), bytes.Compare(x.ID[:], y.ID[:]))
		})
		want = nil
		for _, rec := range recs {
			want = append(want, rec.ID)
		}
	}
	var got []uuid.UUID
	for range want {
		got = append(got, ids(e.claim(t, claimOpts(1, time.Minute)))...)
	}
	require.Equal(t, want, got, "claims take rows in the order they became due, one at a time")
	if !slices.Contains(want, briefID) {
		eventually(t, 10*time.Second, "the briefly delayed row to fall due", func() bool {
			recs := e.claim(t, claimOpts(1, time.Minute))
			if len(recs) == 0 {
				return false
			}
			require.Equal(t, briefID, recs[0].ID, "the row fallen due, not a delayed one")
			return true
		})
	}
	require.Empty(t, e.claim(t, claimOpts(10, time.Minute)), "the rows delayed an hour wait")
}

// testClaimOrderNotIDs: claims are returned in (created_at, id) order even where that is not
// the ids' order, which a dialect that returns rows as its UPDATE ... RETURNING met them
// (in the primary key's order, say) gets wrong. Transaction a begins first and enqueues
// last (with Harness.Reopen, on another pool); where created_at is the transaction's start
// (PostgreSQL's now()), its row is older than b's rows while its id is newer. Where
// created_at is the statement's time, the rows are in id order and the test checks the
// order of what it got.
func testClaimOrderNotIDs(t *testing.T, h Harness) {
	e := setup(t, h)
	var (
		b   []uuid.UUID
		res []outbox.Result
	)
	if h.Reopen != nil {
		// a on a pool of its own, as another process: a single-writer database may lock at
		// BEGIN, and a pool of one connection could not serve both.
		other, err := outbox.New(h.Reopen(t, e.db), h.Dialect, outbox.Options{Table: e.table})
		require.NoError(t, err)
		a, err := other.DB().BeginTx(e.ctx, nil)
		require.NoError(t, err)
		defer func() { _ = a.Rollback() }()
		b = resultIDs(e.enqueue(t, msg(1), msg(2)))
		res, err = other.EnqueueBatch(e.ctx, a, []outbox.Message{msg(0)})
		require.NoError(t, err)
		require.NoError(t, a.Commit())
	} else {
		b = resultIDs(e.enqueue(t, msg(1), msg(2)))
		res = e.enqueue(t, msg(0))
	}
	rows := []outbox.Record{e.get(t, res[0].ID), e.get(t, b[0]), e.get(t, b[1])}
	slices.SortFunc(rows, claimOrder)
	want := ids(rows)
	if want[0] == res[0].ID {
		t.Logf("created_at is the transaction's start: the oldest row has the newest id")
	} else {
		t.Logf("created_at is the statement's time: the rows are in id order")
	}
	// The dialect itself, as the engine calls it: Store.Claim sorts what it returns again,
	// which would hide the dialect's order from a test through the Store alone.
	tbl, err := dialect.NewTable(e.table)
	require.NoError(t, err)
	got, err := e.store.Dialect().Claim(e.ctx, e.db, tbl, dialect.ClaimParams{
		Limit: 3, Lease: time.Minute, MaxAttempts: 5, WorkerID: "worker-a", Token: uuid.New()})
	require.NoError(t, err)
	require.Equal(t, want, ids(got), "Dialect.Claim returns rows in (created_at, id) order, not the ids' order "+
		"(rule 4 of dialect.Dialect: RETURNING has no order of its own, sort with dialect.SortClaimed)")
	require.NoError(t, e.store.Ack(e.ctx, got[0].Lease(), got[1].Lease(), got[2].Lease()))

	b = resultIDs(e.enqueue(t, msg(3), msg(4)))
	require.Equal(t, b, ids(e.claim(t, claimOpts(3, time.Minute))), "Store.Claim in (created_at, id) order")
}

// requireUTC checks that the times of a record that are set are in UTC (rule 12 of
// dialect.Dialect); require.Equal alone passes a time in another zone that a dialect
// returned consistently.
func requireUTC(t *testing.T, from string, r outbox.Record) {
	t.Helper()
	for what, ts := range map[string]time.Time{"created_at": r.CreatedAt, "updated_at": r.UpdatedAt,
		"next_attempt_at": r.NextAttemptAt, "locked_until": r.LockedUntil, "delivered_at": r.DeliveredAt} {
		if !ts.IsZero() {
			require.Equal(t, time.UTC, ts.Location(), "%s returns %s in UTC", from, what)
		}
	}
}

// claimOrder orders records by (created_at, id), the claim order.
func claimOrder(x, y outbox.Record) int {
	return cmp.Or(x.CreatedAt.Compare(y.CreatedAt), bytes.Compare(x.ID[:], y.ID[:]))
}

func testClaimFields(t *testing.T, h Harness) {
	e := setup(t, h)
	m, tenant := msg(1), uuid.New()
	m.TenantID, m.DedupeKey, m.PartitionKey = tenant, tenant.String()+"/claim-fields", "pk-1"
	m.Headers = outbox.Headers{"traceparent": "00-abc-def-01"}
	id := e.enqueue(t, m)[0].ID
	before := e.get(t, id)
	const lease = 90 * time.Second
	recs := e.claim(t, outbox.ClaimOptions{Limit: 5, Lease: lease, MaxAttempts: 3, WorkerID: "worker-fields"})
	require.Len(t, recs, 1)
	r := recs[0]
	require.Equal(t, id, r.ID)
	require.Equal(t, outbox.StatusProcessing, r.Status)
	require.Equal(t, 1, r.Attempts)
	require.Equal(t, "worker-fields", r.LockedBy)
	require.NotEqual(t, uuid.Nil, r.LeaseToken)
	require.True(t, r.UpdatedAt.After(before.UpdatedAt), "claim sets updated_at")
	within(t, r.LockedUntil.Sub(r.UpdatedAt), lease, lease, "locked_until - updated_at")
	require.Equal(t, before.Payload, r.Payload)
	require.Equal(t, before.CreatedAt, r.CreatedAt)

	// What the claim returned is what it stored.
	stored := e.get(t, id)
	require.Equal(t, r.Status, stored.Status)
	require.Equal(t, r.Attempts, stored.Attempts)
	require.Equal(t, r.LockedBy, stored.LockedBy)
	require.Equal(t, r.LeaseToken, stored.LeaseToken)
	require.True(t, r.LockedUntil.Equal(stored.LockedUntil), "locked_until %s vs stored %s", r.LockedUntil, stored.LockedUntil)
	require.True(t, r.UpdatedAt.Equal(stored.UpdatedAt))
	require.Equal(t, stored, r, "every field of the claimed record is as stored")
	requireUTC(t, "Claim", r)
	requireUTC(t, "Get", stored)

	// A second claim in one call gets a different token.
	id2 := e.enqueue(t, msg(2))[0].ID
	r2 := e.claim(t, claimOpts(5, lease))
	require.Equal(t, []uuid.UUID{id2}, ids(r2))
	require.NotEqual(t, r.LeaseToken, r2[0].LeaseToken)
}

func testClaimScope(t *testing.T, h Harness) {
	e := setup(t, h)
	tenant := uuid.New()
	mk := func(ns, topic string, tenantID uuid.UUID) outbox.Message {
		m := msg(0)
		m.Namespace, m.Topic, m.TenantID = ns, topic, tenantID
		return m
	}
	res := e.enqueue(t,
		mk("a", "x", uuid.Nil), // 0
		mk("a", "y", uuid.Nil), // 1
		mk("b", "x", uuid.Nil), // 2
		mk("a", "x", tenant),   // 3
		mk("a", "z", uuid.Nil), // 4
	)
	scoped := func(sc outbox.Scope) []uuid.UUID {
		o := claimOpts(10, time.Minute)
		o.Scope = sc
		return ids(e.claim(t, o))
	}
	require.Equal(t, []uuid.UUID{res[2].ID}, scoped(outbox.Scope{Namespace: "b"}))
	require.Equal(t, []uuid.UUID{res[1].ID}, scoped(outbox.Scope{Namespace: "a", Topics: []string{"y"}}))
	require.Equal(t, []uuid.UUID{res[3].ID}, scoped(outbox.Scope{Namespace: "a", TenantID: tenant}))
	require.Empty(t, scoped(outbox.Scope{Namespace: "c"}))
	require.ElementsMatch(t, []uuid.UUID{res[0].ID, res[4].ID}, scoped(outbox.Scope{Topics: []string{"x", "z"}}))
}

func testClaimEmpty(t *testing.T, h Harness) {
	e := setup(t, h)
	recs, err := e.store.Claim(e.ctx, claimOpts(10, time.Minute))
	require.NoError(t, err)
	require.Empty(t, recs)
}

func testClaimAttemptLimit(t *testing.T, h Harness) {
	e := setup(t, h)
	id := e.enqueue(t, msg(1))[0].ID
	recs := e.claim(t, claimOpts(1, time.Minute))
	require.Len(t, recs, 1)
	// Back to pending and due at once, with attempts = 1.
	require.NoError(t, e.store.Nack(e.ctx, outbox.RetryPolicy{MaxAttempts: 5},
		outbox.Failure{Lease: recs[0].Lease(), Attempts: 1, Err: outbox.RetryAfter(nil, 0)}))

	o := claimOpts(1, time.Minute)
	o.MaxAttempts = 1
	require.Empty(t, e.claim(t, o), "a row at the attempt limit is not claimable")
	o.MaxAttempts = 2
	recs = e.claim(t, o)
	require.Equal(t, []uuid.UUID{id}, ids(recs))
	require.Equal(t, 2, recs[0].Attempts)
}

// sweep is Store.Bury or Store.BuryExpired.
type sweep func(s *outbox.Store, ctx context.Context, scope outbox.Scope, maxAttempts, limit int) ([]uuid.UUID, error)

// testBuryExhausted runs both sweeps through the same rows. Both bury an expired lease on
// the last attempt and spare a live lease and an unattempted row. A pending row at the
// limit (the limit was lowered) is buried by Store.Bury; Store.BuryExpired may leave it,
// since a dialect may ignore BuryParams.ExpiredOnly.
func testBuryExhausted(t *testing.T, h Harness, bury sweep) {
	e := setup(t, h)
	// "lowered": attempted once and back to pending, at the limit of 1 below.
	lowered := e.enqueue(t, msg(0))[0].ID
	recs := e.claim(t, claimOpts(1, time.Minute))
	require.Equal(t, []uuid.UUID{lowered}, ids(recs))
	require.NoError(t, e.store.Nack(e.ctx, outbox.RetryPolicy{MaxAttempts: 5},
		outbox.Failure{Lease: recs[0].Lease(), Attempts: 1, Err: outbox.RetryAfter(nil, time.Hour)}))
	expired := e.enqueue(t, msg(1))[0].ID
	o := claimOpts(1, 200*time.Millisecond)
	o.MaxAttempts = 1
	require.Len(t, e.claim(t, o), 1)
	live := e.enqueue(t, msg(2))[0].ID
	o.Lease = time.Hour
	require.Len(t, e.claim(t, o), 1)
	fresh := e.enqueue(t, msg(3))[0].ID

	// The worker holding "expired" crashed on its last attempt: once the lease runs out,
	// the row is buried; the row under a live lease and the unattempted row are not.
	var buried []uuid.UUID
	eventually(t, 10*time.Second, "the expired row to be buried", func() bool {
		got, err := bury(e.store, e.ctx, outbox.Scope{}, 1, 10)
		require.NoError(t, err)
		buried = append(buried, got...)
		return slices.Contains(buried, expired)
	})
	if slices.Contains(buried, lowered) {
		require.ElementsMatch(t, []uuid.UUID{lowered, expired}, buried)
	} else {
		require.Equal(t, []uuid.UUID{expired}, buried)
		require.Equal(t, outbox.StatusPending, e.get(t, lowered).Status)
		got, err := e.store.Bury(e.ctx, outbox.Scope{}, 1, 10)
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{lowered}, got, "the full sweep buries a pending row at the limit")
	}
	require.Equal(t, outbox.StatusDead, e.get(t, lowered).Status)
	r := e.get(t, expired)
	require.Equal(t, outbox.StatusDead, r.Status)
	require.Contains(t, r.LastError, "attempt limit")
	require.Empty(t, r.LockedBy)
	require.True(t, r.LockedUntil.IsZero())
	require.Equal(t, outbox.StatusProcessing, e.get(t, live).Status)
	require.Equal(t, outbox.StatusPending, e.get(t, fresh).Status)

	got, err := bury(e.store, e.ctx, outbox.Scope{}, 1, 10)
	require.NoError(t, err)
	require.Empty(t, got, "dead rows are not buried twice")
	_, err = bury(e.store, e.ctx, outbox.Scope{}, 0, 10)
	require.ErrorIs(t, err, outbox.ErrInvalid)
}

// within asserts lo <= d <= hi, allowing 2ms for the microsecond rounding of stored times.
func within(t *testing.T, d, lo, hi time.Duration, what string) {
	t.Helper()
	const slack = 2 * time.Millisecond
	require.True(t, d >= lo-slack && d <= hi+slack, "%s = %s, want within [%s, %s]", what, d, lo, hi)
}

func testBuryScope(t *testing.T, h Harness) {
	e := setup(t, h)
	other := msg(1)
	other.Namespace = "billing"
	res := e.enqueue(t, msg(0), other)
	o := claimOpts(2, time.Millisecond)
	o.MaxAttempts = 1
	require.Len(t, e.claim(t, o), 2)
	time.Sleep(50 * time.Millisecond) // only guarantees the 1ms leases have run out

	buried, err := e.store.Bury(e.ctx, outbox.Scope{Namespace: "orders"}, 1, 10)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{res[0].ID}, buried, "a scoped sweep buries only its scope")
	require.Equal(t, outbox.StatusProcessing, e.get(t, res[1].ID).Status)
	buried, err = e.store.Bury(e.ctx, outbox.Scope{Namespace: "billing", Topics: []string{"elsewhere"}}, 1, 10)
	require.NoError(t, err)
	require.Empty(t, buried, "topics narrow the sweep")
}

func testExpiredAtLimit(t *testing.T, h Harness) {
	e := setup(t, h)
	id := e.enqueueN(t, 1)[0]
	o := claimOpts(1, time.Millisecond)
	o.MaxAttempts = 1
	require.Len(t, e.claim(t, o), 1)
	time.Sleep(50 * time.Millisecond) // only guarantees the 1ms lease has run out
	o.Lease = time.Minute
	require.Empty(t, e.claim(t, o), "an expired lease on the last attempt is not reclaimed")
	o.MaxAttempts = 2
	recs := e.claim(t, o)
	require.Equal(t, []uuid.UUID{id}, ids(recs), "the lease had expired: a higher limit reclaims it")
	require.Equal(t, 2, recs[0].Attempts)
}

func testDamagedRows(t *testing.T, h Harness) {
	e := setup(t, h)
	good, headers, payload := msg(1), msg(2), msg(3)
	headers.Topic, headers.Headers = "damaged.headers", outbox.Headers{"a": "b"}
	payload.Topic = "damaged.payload"
	res := e.enqueue(t, good, headers, payload)
	// Someone edits the table by hand: headers that are not a string map, a changed payload.
	require.NoError(t, e.h.corrupt(e.ctx, e.db, e.table, res[1].ID, "headers"), "Harness.Corrupt headers")
	require.NoError(t, e.h.corrupt(e.ctx, e.db, e.table, res[2].ID, "payload"), "Harness.Corrupt payload")

	recs := e.claim(t, claimOpts(10, time.Minute))
	require.Equal(t, []uuid.UUID{res[0].ID, res[1].ID, res[2].ID}, ids(recs), "a damaged row does not fail the claim")
	require.NoError(t, recs[0].Integrity())
	require.ErrorIs(t, recs[1].Integrity(), outbox.ErrIntegrity)
	require.ErrorIs(t, recs[2].Integrity(), outbox.ErrIntegrity)
	got, err := e.store.Get(e.ctx, res[1].ID)
	require.NoError(t, err, "a damaged row can still be read")
	require.ErrorIs(t, got.Integrity(), outbox.ErrIntegrity, "Get reports damaged headers too")
}
