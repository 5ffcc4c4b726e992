package conformance

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

// settleClaimTests check [dialect.SettleClaimer] through Store.CompleteAndClaim; each is
// skipped, saying so, for a dialect without the ability.
var settleClaimTests = []test{
	{"SettlesAndClaimsNext", testCompleteAndClaim},
	{"MixedOutcomes", testCompleteAndClaimMixed},
	{"ExpiredLeaseNotReclaimed", testCompleteAndClaimExpired},
	{"NothingLeftToClaim", testCompleteAndClaimNothingLeft},
	{"OrderedSeesReleasedKeys", testCompleteAndClaimOrdered},
	{"UnavailableRefundsAttempt", testCompleteAndClaimRefund},
	{"RetryClaimedAgainAdvances", testCompleteAndClaimRetryAgain},
}

func needSettleClaimer(t *testing.T, e *env) {
	t.Helper()
	if _, ok := e.h.Dialect.(dialect.SettleClaimer); !ok {
		_, _, err := e.store.CompleteAndClaim(e.ctx, nil, claimOpts(1, time.Minute))
		require.ErrorIs(t, err, errors.ErrUnsupported)
		t.Skipf("dialect %s does not implement dialect.SettleClaimer", e.h.Dialect.Name())
	}
}

func acks(recs []outbox.Record) []outbox.Outcome {
	out := make([]outbox.Outcome, len(recs))
	for i, r := range recs {
		out[i] = outbox.Outcome{Lease: r.Lease(), Status: outbox.StatusDelivered}
	}
	return out
}

// testCompleteAndClaim: the outcomes are recorded, a forged lease is reported lost and
// changes nothing, and the next rows are claimed in order under a new token.
func testCompleteAndClaim(t *testing.T, h Harness) {
	e := setup(t, h)
	needSettleClaimer(t, e)
	all := e.enqueueN(t, 5)
	first := e.claim(t, claimOpts(2, time.Minute))
	require.Equal(t, all[:2], ids(first))
	outs := acks(first)
	outs[1].Token = uuid.New()

	next, lost, err := e.store.CompleteAndClaim(e.ctx, outs, claimOpts(2, time.Minute))
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{all[1]}, lost, "the forged lease is reported lost")
	require.Equal(t, all[2:4], ids(next), "the next rows, in order")
	for _, r := range next {
		require.Equal(t, outbox.StatusProcessing, r.Status)
		require.Equal(t, 1, r.Attempts)
		require.NotEqual(t, first[0].LeaseToken, r.LeaseToken, "a new claim, a new token")
		got := e.get(t, r.ID)
		require.Equal(t, r.LeaseToken, got.LeaseToken)
		require.Equal(t, outbox.StatusProcessing, got.Status)
	}
	require.Equal(t, outbox.StatusDelivered, e.get(t, all[0]).Status)
	kept := e.get(t, all[1])
	require.Equal(t, outbox.StatusProcessing, kept.Status, "a wrong token changes nothing")
	require.Equal(t, first[1].LeaseToken, kept.LeaseToken)
	require.Equal(t, outbox.StatusPending, e.get(t, all[4]).Status)
	require.NoError(t, e.store.Ack(e.ctx, next[0].Lease(), next[1].Lease()), "the claimed leases are valid")
}

// testCompleteAndClaimMixed: a retry, a dead letter and an ack in one call, applied as
// Complete applies them; the retried row is not claimed again before it is due.
func testCompleteAndClaimMixed(t *testing.T, h Harness) {
	e := setup(t, h)
	needSettleClaimer(t, e)
	all := e.enqueueN(t, 4)
	first := e.claim(t, claimOpts(3, time.Minute))
	outs := []outbox.Outcome{
		{Lease: first[0].Lease(), Status: outbox.StatusDelivered},
		{Lease: first[1].Lease(), Status: outbox.StatusPending, Delay: time.Hour, Error: "broker down"},
		{Lease: first[2].Lease(), Status: outbox.StatusDead, Error: "rejected"},
	}
	next, lost, err := e.store.CompleteAndClaim(e.ctx, outs, claimOpts(10, time.Minute))
	require.NoError(t, err)
	require.Empty(t, lost)
	require.Equal(t, all[3:], ids(next), "only the untouched row is claimed")
	require.Equal(t, outbox.StatusDelivered, e.get(t, all[0]).Status)
	retried := e.get(t, all[1])
	require.Equal(t, outbox.StatusPending, retried.Status)
	require.Equal(t, "broker down", retried.LastError)
	require.True(t, retried.NextAttemptAt.After(retried.UpdatedAt.Add(59*time.Minute)), "due in an hour")
	dead := e.get(t, all[2])
	require.Equal(t, outbox.StatusDead, dead.Status)
	require.Equal(t, "rejected", dead.LastError)
}

// testCompleteAndClaimExpired: rows whose lease expired while they were being published
// are settled by their holder (the token still matches), never handed out again by the
// claim of the same call.
func testCompleteAndClaimExpired(t *testing.T, h Harness) {
	e := setup(t, h)
	needSettleClaimer(t, e)
	all := e.enqueueN(t, 3)
	first := e.claim(t, claimOpts(2, 20*time.Millisecond))
	require.Len(t, first, 2)
	until := first[0].LockedUntil
	eventually(t, 10*time.Second, "the lease to expire", func() bool { return time.Now().After(until.Add(50 * time.Millisecond)) })

	next, lost, err := e.store.CompleteAndClaim(e.ctx, acks(first), claimOpts(10, time.Minute))
	require.NoError(t, err)
	require.Empty(t, lost, "nobody took the rows over, so their holder settles them")
	require.Equal(t, all[2:], ids(next), "the settled rows are not claimed again")
	for _, id := range all[:2] {
		r := e.get(t, id)
		require.Equal(t, outbox.StatusDelivered, r.Status)
		require.Equal(t, 1, r.Attempts)
	}
}

// testCompleteAndClaimNothingLeft: with nothing to claim, the outcomes are still recorded.
func testCompleteAndClaimNothingLeft(t *testing.T, h Harness) {
	e := setup(t, h)
	needSettleClaimer(t, e)
	e.enqueueN(t, 2)
	first := e.claim(t, claimOpts(2, time.Minute))
	next, lost, err := e.store.CompleteAndClaim(e.ctx, acks(first), claimOpts(2, time.Minute))
	require.NoError(t, err)
	require.Empty(t, lost)
	require.Empty(t, next)
	require.Equal(t, 2, e.count(t, outbox.StatusDelivered), "committed though nothing was claimed")

	_, _, err = e.store.CompleteAndClaim(e.ctx, []outbox.Outcome{{Status: "lost"}}, claimOpts(2, time.Minute))
	require.ErrorIs(t, err, outbox.ErrInvalid)
	_, _, err = e.store.CompleteAndClaim(e.ctx, nil, claimOpts(0, time.Minute))
	require.ErrorIs(t, err, outbox.ErrInvalid)
}

// testCompleteAndClaimOrdered: an ordered claim in the same call sees the keys that the
// outcomes released: the next row of a delivered head is claimed at once.
func testCompleteAndClaimOrdered(t *testing.T, h Harness) {
	e := setup(t, h)
	needSettleClaimer(t, e)
	if _, ok := e.h.Dialect.(dialect.OrderedClaimer); !ok {
		t.Skipf("dialect %s does not implement dialect.OrderedClaimer", e.h.Dialect.Name())
	}
	var all []uuid.UUID
	for i := range 4 {
		m := msg(i)
		m.PartitionKey = []string{"a", "b"}[i%2]
		all = append(all, e.enqueue(t, m)[0].ID)
	}
	o := claimOpts(10, time.Minute)
	o.Namespace, o.Ordered = "orders", true
	heads := e.claim(t, o)
	require.Equal(t, all[:2], ids(heads), "one row per key")

	next, lost, err := e.store.CompleteAndClaim(e.ctx, acks(heads), o)
	require.NoError(t, err)
	require.Empty(t, lost)
	require.Equal(t, all[2:], ids(next), "the delivered heads released their keys")
}

// testCompleteAndClaimRefund: an outcome with RefundAttempt, recorded with the next claim,
// gives the attempt back as Complete does, next to a plain retry that keeps it.
func testCompleteAndClaimRefund(t *testing.T, h Harness) {
	e := setup(t, h)
	needSettleClaimer(t, e)
	all := e.enqueueN(t, 4)
	first := e.claim(t, claimOpts(3, time.Minute))
	require.Len(t, first, 3)
	outs := []outbox.Outcome{
		{Lease: first[0].Lease(), Status: outbox.StatusPending, Delay: time.Hour, Error: "unavailable: down", RefundAttempt: true},
		{Lease: first[1].Lease(), Status: outbox.StatusPending, Delay: time.Hour, Error: "500"},
		{Lease: first[2].Lease(), Status: outbox.StatusDelivered},
	}
	next, lost, err := e.store.CompleteAndClaim(e.ctx, outs, claimOpts(10, time.Minute))
	require.NoError(t, err)
	require.Empty(t, lost)
	require.Equal(t, all[3:], ids(next))
	refunded := e.get(t, all[0])
	require.Equal(t, outbox.StatusPending, refunded.Status)
	require.Equal(t, 0, refunded.Attempts, "the claim's attempt is given back")
	require.Equal(t, "unavailable: down", refunded.LastError)
	require.Empty(t, refunded.LockedBy)
	require.True(t, refunded.NextAttemptAt.After(refunded.UpdatedAt.Add(59*time.Minute)), "due in an hour")
	require.Equal(t, 1, e.get(t, all[1]).Attempts, "a plain retry keeps the attempt it spent")
	require.Equal(t, outbox.StatusDelivered, e.get(t, all[2]).Status)
}

// testCompleteAndClaimRetryAgain: a retry without delay may be claimed again by the same
// call, two changes of one row in one transaction, and each strictly advances updated_at
// (rule 10 of dialect.Dialect): the settle's now (next_attempt_at, due at once) is before
// the claim's (updated_at). A dialect that settles and claims in one transaction with the
// transaction's now (PostgreSQL's now(), say) for both ties them.
func testCompleteAndClaimRetryAgain(t *testing.T, h Harness) {
	e := setup(t, h)
	needSettleClaimer(t, e)
	retryAgain(t, e, msg(0), claimOpts(1, time.Minute))
	if _, ok := h.Dialect.(dialect.OrderedClaimer); ok {
		// An ordered claim may take another way through the dialect (the built-in
		// PostgreSQL dialect settles, then claims, in one transaction).
		m := msg(1)
		m.PartitionKey = "k"
		o := claimOpts(1, time.Minute)
		o.Namespace, o.Ordered = "orders", true
		retryAgain(t, e, m, o)
	}
}

// retryAgain enqueues m, claims it with o, and twice retries it without delay in a
// CompleteAndClaim that claims with o.
func retryAgain(t *testing.T, e *env, m outbox.Message, o outbox.ClaimOptions) {
	t.Helper()
	id := e.enqueue(t, m)[0].ID
	prev := e.claim(t, o)
	require.Equal(t, []uuid.UUID{id}, ids(prev))
	for attempt := 2; attempt <= 3; attempt++ {
		out := outbox.Outcome{Lease: prev[0].Lease(), Status: outbox.StatusPending, Error: "again"}
		next, lost, err := e.store.CompleteAndClaim(e.ctx, []outbox.Outcome{out}, o)
		require.NoError(t, err)
		require.Empty(t, lost)
		if len(next) == 0 {
			// The dialect leaves the rows it settles to the next claim (the built-in
			// PostgreSQL dialect's one statement does): no two changes share a transaction.
			if attempt == 2 {
				t.Logf("dialect %s does not claim a retried row again in the call that settled it (ordered: %t)", e.h.Dialect.Name(), o.Ordered)
			}
			next = e.claim(t, o)
		}
		require.Equal(t, []uuid.UUID{id}, ids(next), "a retry without delay is claimable at once")
		r := next[0]
		require.Equal(t, attempt, r.Attempts)
		require.NotEqual(t, prev[0].LeaseToken, r.LeaseToken)
		require.True(t, r.UpdatedAt.After(prev[0].UpdatedAt), "the claim advances updated_at")
		require.True(t, r.UpdatedAt.After(r.NextAttemptAt), "the claim's updated_at (%s) must be after the retry's "+
			"(next_attempt_at %s, due at once): rule 10, every change strictly advances updated_at, also two changes "+
			"in one transaction (ordered: %t)", r.UpdatedAt.Format(time.RFC3339Nano), r.NextAttemptAt.Format(time.RFC3339Nano), o.Ordered)
		within(t, r.LockedUntil.Sub(r.UpdatedAt), time.Minute, time.Minute, "locked_until - updated_at")
		require.Equal(t, r, e.get(t, id), "the claimed record is as stored")
		prev = next
	}
	require.NoError(t, e.store.Ack(e.ctx, prev[0].Lease()))
}
