package conformance

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
)

var settleTests = []test{
	{"Ack", testAck},
	{"AckReportsOnlyLostRows", testAckPartial},
	{"NackBackoffWithinJitterBounds", testNackBackoff},
	{"NackRetryAfter", testNackRetryAfter},
	{"NackPermanent", testNackPermanent},
	{"AttemptLimitLeadsToDead", testAttemptLimitDead},
	{"MixedBatchInOneCall", testMixedComplete},
	{"TerminalStatesNeverMove", testTerminal},
	{"UpdatedAtAdvances", testUpdatedAtAdvances},
	{"UpdatedAtAdvancesWithinATick", testUpdatedAtTick},
	{"UnavailableRefundsAttempt", testUnavailableRefund},
	{"UnavailableNeverDies", testUnavailableNeverDies},
}

func testAck(t *testing.T, h Harness) {
	e := setup(t, h)
	e.enqueueN(t, 3)
	recs := e.claim(t, claimOpts(3, time.Minute))
	require.Len(t, recs, 3)
	require.NoError(t, e.store.Ack(e.ctx, recs[0].Lease(), recs[1].Lease()))
	for _, r := range recs[:2] {
		got := e.get(t, r.ID)
		require.Equal(t, outbox.StatusDelivered, got.Status)
		require.False(t, got.DeliveredAt.IsZero())
		require.True(t, got.DeliveredAt.Equal(got.UpdatedAt))
		require.False(t, got.UpdatedAt.Before(r.UpdatedAt))
		require.Empty(t, got.LockedBy, "ack clears the lease")
		require.True(t, got.LockedUntil.IsZero())
		require.Equal(t, 1, got.Attempts)
	}
	require.Equal(t, outbox.StatusProcessing, e.get(t, recs[2].ID).Status)
	require.Equal(t, 2, e.count(t, outbox.StatusDelivered))
}

func testAckPartial(t *testing.T, h Harness) {
	e := setup(t, h)
	e.enqueueN(t, 2)
	recs := e.claim(t, claimOpts(2, time.Minute))
	forged := recs[1].Lease()
	forged.Token = uuid.New()
	err := e.store.Ack(e.ctx, recs[0].Lease(), forged)
	require.ErrorIs(t, err, outbox.ErrLeaseLost)
	var lost *outbox.LeaseLostError
	require.True(t, errors.As(err, &lost))
	require.Equal(t, []uuid.UUID{recs[1].ID}, lost.IDs)
	require.Equal(t, outbox.StatusDelivered, e.get(t, recs[0].ID).Status, "the valid lease was acked")
	r := e.get(t, recs[1].ID)
	require.Equal(t, outbox.StatusProcessing, r.Status, "a wrong token changes nothing")
	require.Equal(t, recs[1].LeaseToken, r.LeaseToken)
}

func testNackBackoff(t *testing.T, h Harness) {
	e := setup(t, h)
	// attempts -> delay before jitter: 10s, 20s, 40s, then clamped to 50s before jitter. The
	// shortest jittered delay, 5s, outlasts the reads below on a loaded machine (with a
	// base of 1s, half a second passed before the last claim under the race detector).
	policy := outbox.RetryPolicy{BaseDelay: 10 * time.Second, MaxDelay: 50 * time.Second, MaxAttempts: 100}
	cases := []struct {
		attempts int
		delay    time.Duration
	}{{1, 10 * time.Second}, {2, 20 * time.Second}, {3, 40 * time.Second}, {4, 50 * time.Second}, {30, 50 * time.Second}}
	const perCase = 6
	e.enqueue(t, messages(len(cases)*perCase)...)
	recs := e.claim(t, claimOpts(len(cases)*perCase, time.Minute))
	require.Len(t, recs, len(cases)*perCase)
	var failures []outbox.Failure
	for i, r := range recs {
		failures = append(failures, outbox.Failure{Lease: r.Lease(), Attempts: cases[i/perCase].attempts, Err: errors.New("broker unavailable")})
	}
	require.NoError(t, e.store.Nack(e.ctx, policy, failures...))

	delays := map[time.Duration]bool{}
	for i, r := range recs {
		c := cases[i/perCase]
		got := e.get(t, r.ID)
		require.Equal(t, outbox.StatusPending, got.Status)
		require.Equal(t, "broker unavailable", got.LastError)
		require.Equal(t, 1, got.Attempts, "nack does not count an attempt; the claim did")
		require.Empty(t, got.LockedBy)
		require.True(t, got.LockedUntil.IsZero())
		d := got.NextAttemptAt.Sub(got.UpdatedAt)
		within(t, d, c.delay/2, c.delay, "next_attempt_at - updated_at")
		delays[d] = true
	}
	require.Greater(t, len(delays), len(cases), "delays are jittered, not fixed per attempt")
	require.Empty(t, e.claim(t, claimOpts(100, time.Minute)), "rescheduled rows are not due yet")
}

func messages(n int) []outbox.Message {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = msg(i)
	}
	return msgs
}

func testNackRetryAfter(t *testing.T, h Harness) {
	e := setup(t, h)
	e.enqueueN(t, 1)
	recs := e.claim(t, claimOpts(1, time.Minute))
	err := outbox.RetryAfter(errors.New("429 too many requests"), 90*time.Second)
	require.NoError(t, e.store.Nack(e.ctx, outbox.RetryPolicy{}, outbox.Failure{Lease: recs[0].Lease(), Attempts: 1, Err: err}))
	got := e.get(t, recs[0].ID)
	require.Equal(t, outbox.StatusPending, got.Status)
	within(t, got.NextAttemptAt.Sub(got.UpdatedAt), 90*time.Second, 90*time.Second, "retry-after delay")
	require.Contains(t, got.LastError, "429")
}

func testNackPermanent(t *testing.T, h Harness) {
	e := setup(t, h)
	e.enqueueN(t, 1)
	recs := e.claim(t, claimOpts(1, time.Minute))
	err := outbox.Permanent(errors.New("schema rejected"))
	require.NoError(t, e.store.Nack(e.ctx, outbox.RetryPolicy{MaxAttempts: 10}, outbox.Failure{Lease: recs[0].Lease(), Attempts: 1, Err: err}))
	got := e.get(t, recs[0].ID)
	require.Equal(t, outbox.StatusDead, got.Status)
	require.Contains(t, got.LastError, "schema rejected")
	require.Empty(t, got.LockedBy)
	require.Empty(t, e.claim(t, claimOpts(1, time.Minute)))
}

func testAttemptLimitDead(t *testing.T, h Harness) {
	e := setup(t, h)
	id := e.enqueueN(t, 1)[0]
	policy := outbox.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond, MaxAttempts: 2}
	o := claimOpts(1, time.Minute)
	o.MaxAttempts = policy.MaxAttempts
	for attempt := 1; attempt <= 2; attempt++ {
		var recs []outbox.Record
		eventually(t, 5*time.Second, "the retry to be due", func() bool {
			recs = e.claim(t, o)
			return len(recs) == 1
		})
		require.Equal(t, attempt, recs[0].Attempts)
		require.NoError(t, e.store.Nack(e.ctx, policy, outbox.Failure{Lease: recs[0].Lease(), Attempts: recs[0].Attempts, Err: errors.New("boom")}))
	}
	got := e.get(t, id)
	require.Equal(t, outbox.StatusDead, got.Status)
	require.Contains(t, got.LastError, "attempt limit")
	require.Contains(t, got.LastError, "boom")
	require.Equal(t, 2, got.Attempts)
}

func testMixedComplete(t *testing.T, h Harness) {
	e := setup(t, h)
	e.enqueueN(t, 3)
	recs := e.claim(t, claimOpts(3, time.Minute))
	require.NoError(t, e.store.Complete(e.ctx,
		outbox.Outcome{Lease: recs[0].Lease(), Status: outbox.StatusDelivered},
		outbox.Outcome{Lease: recs[1].Lease(), Status: outbox.StatusPending, Delay: time.Hour, Error: "later"},
		outbox.Outcome{Lease: recs[2].Lease(), Status: outbox.StatusDead, Error: "never"},
	))
	require.Equal(t, outbox.StatusDelivered, e.get(t, recs[0].ID).Status)
	r1 := e.get(t, recs[1].ID)
	require.Equal(t, outbox.StatusPending, r1.Status)
	require.Equal(t, "later", r1.LastError)
	within(t, r1.NextAttemptAt.Sub(r1.UpdatedAt), time.Hour, time.Hour, "delay")
	r2 := e.get(t, recs[2].ID)
	require.Equal(t, outbox.StatusDead, r2.Status)
	require.Equal(t, "never", r2.LastError)
}

func testTerminal(t *testing.T, h Harness) {
	e := setup(t, h)
	e.enqueueN(t, 2)
	recs := e.claim(t, claimOpts(2, 200*time.Millisecond))
	delivered, dead := recs[0], recs[1]
	require.NoError(t, e.store.Ack(e.ctx, delivered.Lease()))
	require.NoError(t, e.store.Nack(e.ctx, outbox.RetryPolicy{}, outbox.Failure{Lease: dead.Lease(), Attempts: 1, Err: outbox.Permanent(nil)}))
	before := map[uuid.UUID]outbox.Record{delivered.ID: e.get(t, delivered.ID), dead.ID: e.get(t, dead.ID)}

	for _, r := range recs {
		require.ErrorIs(t, e.store.Ack(e.ctx, r.Lease()), outbox.ErrLeaseLost)
		require.ErrorIs(t, e.store.Nack(e.ctx, outbox.RetryPolicy{}, outbox.Failure{Lease: r.Lease(), Attempts: 1, Err: errors.New("x")}), outbox.ErrLeaseLost)
		require.ErrorIs(t, e.store.Complete(e.ctx, outbox.Outcome{Lease: r.Lease(), Status: outbox.StatusPending}), outbox.ErrLeaseLost)
		require.ErrorIs(t, e.store.Extend(e.ctx, time.Hour, r.Lease()), outbox.ErrLeaseLost)
	}
	// Well past the original 200ms lease, nothing reclaims or buries them.
	time.Sleep(300 * time.Millisecond)
	o := claimOpts(10, time.Minute)
	o.MaxAttempts = 1000
	require.Empty(t, e.claim(t, o))
	buried, err := e.store.Bury(e.ctx, outbox.Scope{}, 1, 10)
	require.NoError(t, err)
	require.Empty(t, buried)
	for id, b := range before {
		require.Equal(t, b, e.get(t, id), "a terminal row never changes")
	}
}

func testUpdatedAtAdvances(t *testing.T, h Harness) {
	e := setup(t, h)
	id := e.enqueueN(t, 1)[0]
	last := e.get(t, id).UpdatedAt
	step := func(what string) {
		t.Helper()
		now := e.get(t, id).UpdatedAt
		require.True(t, now.After(last), "%s must advance updated_at: %s then %s", what, last, now)
		last = now
	}
	recs := e.claim(t, claimOpts(1, time.Minute))
	step("claim")
	require.NoError(t, e.store.Extend(e.ctx, time.Minute, recs[0].Lease()))
	step("extend")
	require.NoError(t, e.store.Nack(e.ctx, outbox.RetryPolicy{}, outbox.Failure{Lease: recs[0].Lease(), Attempts: 1, Err: outbox.RetryAfter(nil, 0)}))
	step("nack")
	recs = e.claim(t, claimOpts(1, time.Minute))
	require.Len(t, recs, 1)
	step("reclaim")
	require.NoError(t, e.store.Ack(e.ctx, recs[0].Lease()))
	step("ack")
}

// testUpdatedAtTick: changes of one row that follow each other as fast as they can, many
// within one tick of a clock (a millisecond, on SQLite's), each strictly advance
// updated_at (rule 10 of dialect.Dialect): a dialect that writes the clock's now alone ties
// them. It extends one lease again and again for half a second, or 500 times.
func testUpdatedAtTick(t *testing.T, h Harness) {
	e := setup(t, h)
	id := e.enqueueN(t, 1)[0]
	recs := e.claim(t, claimOpts(1, time.Minute))
	require.Len(t, recs, 1)
	last := recs[0].UpdatedAt
	start := time.Now()
	for i := 0; i < 500 && time.Since(start) < 500*time.Millisecond; i++ {
		require.NoError(t, e.store.Extend(e.ctx, time.Minute, recs[0].Lease()))
		now := e.get(t, id).UpdatedAt
		require.True(t, now.After(last), "extend %d must advance updated_at: %s then %s (rule 10: every change strictly "+
			"advances updated_at, also within one tick of the database clock)", i, last.Format(time.RFC3339Nano), now.Format(time.RFC3339Nano))
		last = now
	}
	require.NoError(t, e.store.Ack(e.ctx, recs[0].Lease()))
	require.True(t, e.get(t, id).UpdatedAt.After(last), "the ack advances updated_at")
}

// testUnavailableRefund: an outcome with RefundAttempt goes back to pending with the
// claim's attempt given back, last_error recorded, the lease cleared, next_attempt_at set
// and updated_at advanced; in the same call a plain retry keeps its attempt and an ack is
// acked. RefundAttempt with another status is refused.
func testUnavailableRefund(t *testing.T, h Harness) {
	e := setup(t, h)
	e.enqueueN(t, 3)
	recs := e.claim(t, claimOpts(3, time.Minute))
	require.Len(t, recs, 3)
	for _, r := range recs {
		require.Equal(t, 1, r.Attempts)
	}
	require.NoError(t, e.store.Complete(e.ctx,
		outbox.Outcome{Lease: recs[0].Lease(), Status: outbox.StatusPending, Delay: time.Hour, Error: "unavailable: broker down", RefundAttempt: true},
		outbox.Outcome{Lease: recs[1].Lease(), Status: outbox.StatusPending, Delay: time.Hour, Error: "500"},
		outbox.Outcome{Lease: recs[2].Lease(), Status: outbox.StatusDelivered},
	))
	got := e.get(t, recs[0].ID)
	require.Equal(t, outbox.StatusPending, got.Status)
	require.Equal(t, 0, got.Attempts, "the claim's attempt is given back")
	require.Equal(t, "unavailable: broker down", got.LastError)
	require.Empty(t, got.LockedBy, "the lease is cleared")
	require.True(t, got.LockedUntil.IsZero())
	require.True(t, got.UpdatedAt.After(recs[0].UpdatedAt), "updated_at advances")
	within(t, got.NextAttemptAt.Sub(got.UpdatedAt), time.Hour, time.Hour, "delay")
	plain := e.get(t, recs[1].ID)
	require.Equal(t, outbox.StatusPending, plain.Status)
	require.Equal(t, 1, plain.Attempts, "a plain retry keeps the attempt it spent")
	require.Equal(t, outbox.StatusDelivered, e.get(t, recs[2].ID).Status)
	require.Equal(t, 1, e.get(t, recs[2].ID).Attempts)

	// Through Nack: an Unavailable failure at the attempt limit is not dead-lettered.
	e.enqueueN(t, 1)
	o := claimOpts(1, time.Minute)
	one := e.claim(t, o)
	require.Len(t, one, 1)
	policy := outbox.RetryPolicy{BaseDelay: time.Minute, MaxDelay: time.Minute, MaxAttempts: 1}
	require.NoError(t, e.store.Nack(e.ctx, policy, outbox.Failure{Lease: one[0].Lease(), Attempts: one[0].Attempts,
		Err: outbox.Unavailable(errors.New("connection refused"))}))
	nacked := e.get(t, one[0].ID)
	require.Equal(t, outbox.StatusPending, nacked.Status, "an outage never dead-letters")
	require.Equal(t, 0, nacked.Attempts)
	require.Contains(t, nacked.LastError, "connection refused")
	within(t, nacked.NextAttemptAt.Sub(nacked.UpdatedAt), 30*time.Second, time.Minute, "the attempt's backoff")

	for _, st := range []outbox.Status{outbox.StatusDelivered, outbox.StatusDead} {
		err := e.store.Complete(e.ctx, outbox.Outcome{Lease: recs[0].Lease(), Status: st, RefundAttempt: true})
		require.ErrorIs(t, err, outbox.ErrInvalid, "RefundAttempt with %s", st)
	}
}

// testUnavailableNeverDies: a row whose deliveries all fail Unavailable is claimable again
// and again under an attempt limit of 2, never reaching it, and a plain failure after the
// outage still counts: the limit then dead-letters it.
func testUnavailableNeverDies(t *testing.T, h Harness) {
	e := setup(t, h)
	id := e.enqueueN(t, 1)[0]
	o := claimOpts(1, time.Minute)
	o.MaxAttempts = 2
	policy := outbox.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond, MaxAttempts: 2}
	claimOne := func() outbox.Record {
		t.Helper()
		var recs []outbox.Record
		eventually(t, 5*time.Second, "the retry to be due", func() bool {
			recs = e.claim(t, o)
			return len(recs) == 1
		})
		return recs[0]
	}
	for range 5 {
		r := claimOne()
		require.Equal(t, 1, r.Attempts, "an outage spent no attempt")
		require.NoError(t, e.store.Nack(e.ctx, policy, outbox.Failure{Lease: r.Lease(), Attempts: r.Attempts, Err: outbox.Unavailable(nil)}))
	}
	for attempt := 1; attempt <= 2; attempt++ {
		r := claimOne()
		require.Equal(t, attempt, r.Attempts)
		require.NoError(t, e.store.Nack(e.ctx, policy, outbox.Failure{Lease: r.Lease(), Attempts: r.Attempts, Err: errors.New("500")}))
	}
	got := e.get(t, id)
	require.Equal(t, outbox.StatusDead, got.Status)
	require.Equal(t, 2, got.Attempts)
}

var leaseTests = []test{
	{"ExpiredLeaseIsReclaimed", testLeaseReclaim},
	{"ExpiredButUnclaimedCanStillAck", testLeaseExpiredAck},
	{"ExtendKeepsTheRow", testLeaseExtend},
}

func testLeaseReclaim(t *testing.T, h Harness) {
	e := setup(t, h)
	id := e.enqueueN(t, 1)[0]
	const lease = time.Second
	began := time.Now()
	a := e.claim(t, outbox.ClaimOptions{Limit: 1, Lease: lease, MaxAttempts: 5, WorkerID: "worker-a"})
	require.Len(t, a, 1)
	ob := outbox.ClaimOptions{Limit: 1, Lease: time.Minute, MaxAttempts: 5, WorkerID: "worker-b"}
	// A claim that returns before the lease can have run out must find nothing. On a stalled
	// machine the lease may run out first: then this claim is the reclaim awaited below.
	b := e.claim(t, ob)
	if len(b) > 0 && time.Since(began) < lease {
		require.Empty(t, b, "a live lease is not claimable")
	}

	eventually(t, 10*time.Second, "worker-b to reclaim the expired lease", func() bool {
		if len(b) == 0 {
			b = e.claim(t, ob)
		}
		return len(b) == 1
	})
	require.Equal(t, id, b[0].ID)
	require.Equal(t, 2, b[0].Attempts, "a reclaim counts an attempt")
	require.Equal(t, "worker-b", b[0].LockedBy)
	require.NotEqual(t, a[0].LeaseToken, b[0].LeaseToken)

	// The stale worker finishes late: every write it tries is refused and changes nothing.
	require.ErrorIs(t, e.store.Ack(e.ctx, a[0].Lease()), outbox.ErrLeaseLost)
	require.ErrorIs(t, e.store.Nack(e.ctx, outbox.RetryPolicy{}, outbox.Failure{Lease: a[0].Lease(), Attempts: 1, Err: errors.New("late")}), outbox.ErrLeaseLost)
	require.ErrorIs(t, e.store.Extend(e.ctx, time.Hour, a[0].Lease()), outbox.ErrLeaseLost)
	got := e.get(t, id)
	require.Equal(t, outbox.StatusProcessing, got.Status)
	require.Equal(t, "worker-b", got.LockedBy)
	require.Equal(t, b[0].LeaseToken, got.LeaseToken)
	require.True(t, got.LockedUntil.Equal(b[0].LockedUntil))
	require.Empty(t, got.LastError)

	require.NoError(t, e.store.Ack(e.ctx, b[0].Lease()))
	require.Equal(t, outbox.StatusDelivered, e.get(t, id).Status)
}

func testLeaseExpiredAck(t *testing.T, h Harness) {
	e := setup(t, h)
	id := e.enqueueN(t, 1)[0]
	a := e.claim(t, claimOpts(1, time.Millisecond))
	require.Len(t, a, 1)
	time.Sleep(50 * time.Millisecond) // not a race: only guarantees the 1ms lease has run out
	// Nobody reclaimed the row, so its token still names the holder, whose ack is honoured.
	require.NoError(t, e.store.Ack(e.ctx, a[0].Lease()))
	require.Equal(t, outbox.StatusDelivered, e.get(t, id).Status)
}

func testLeaseExtend(t *testing.T, h Harness) {
	e := setup(t, h)
	id := e.enqueueN(t, 1)[0]
	a := e.claim(t, claimOpts(1, 300*time.Millisecond))
	require.Len(t, a, 1)
	// Let the clock move past the claim, so that an Extend that forgets updated_at shows.
	eventually(t, 5*time.Second, "the clock to pass the claim", func() bool {
		return time.Since(a[0].UpdatedAt) > 20*time.Millisecond
	})
	require.NoError(t, e.store.Extend(e.ctx, time.Hour, a[0].Lease()))
	got := e.get(t, id)
	require.True(t, got.UpdatedAt.After(a[0].UpdatedAt), "Extend advances updated_at: claimed at %v, extended at %v", a[0].UpdatedAt, got.UpdatedAt)
	within(t, got.LockedUntil.Sub(got.UpdatedAt), time.Hour, time.Hour, "extended lease: locked_until - updated_at")
	require.Equal(t, a[0].LeaseToken, got.LeaseToken, "extending keeps the token")
	time.Sleep(400 * time.Millisecond) // only guarantees the original lease has run out
	b := claimOpts(1, time.Minute)
	b.WorkerID = "worker-b"
	require.Empty(t, e.claim(t, b), "an extended lease is still held")
	require.NoError(t, e.store.Ack(e.ctx, a[0].Lease()))
}
