package conformance

import (
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

// A continued key whose run ends short of the batch leaves the rest to the search for
// heads, which must not find the continued rows again: they are still pending in the
// claim's own view until it leases them, and the first of them is its key's head there.
// The batch holds each row once, and the other key's head with its run.
func testRunsContinueThenHeads(t *testing.T, h Harness) {
	e := continueSetup(t, h)
	k := resultIDs(e.enqueue(t, keyed("a", 0), keyed("a", 1), keyed("b", 0), keyed("b", 1)))
	first := e.claim(t, runOpts(1))
	require.Equal(t, k[:1], ids(first))
	next, lost, err := e.store.CompleteAndClaim(e.ctx, acks(first), continueOpts(4))
	require.NoError(t, err)
	require.Empty(t, lost)
	require.ElementsMatch(t, []uuid.UUID{k[1], k[2], k[3]}, ids(next), "the key's last row, then the other key's head and run, each once")
}

// continueSetup is runsSetup for the tests of ClaimParams.Continue, which CompleteAndClaim
// reads: it skips when the dialect does not settle and claim in one call.
func continueSetup(t *testing.T, h Harness) *env {
	t.Helper()
	e := runsSetup(t, h)
	if _, ok := e.h.Dialect.(dialect.SettleClaimer); !ok {
		t.Skipf("dialect %s does not implement dialect.SettleClaimer", h.Dialect.Name())
	}
	return e
}

func continueOpts(limit int) outbox.ClaimOptions {
	o := runOpts(limit)
	o.Continue = true
	return o
}

// With Continue, settling a key's rows all delivered and claiming in one call takes the
// key's next run first, though another key's head is older than its rows; it skips, saying
// so, when the dialect ignores Continue, which the contract allows.
func testRunsContinue(t *testing.T, h Harness) {
	e := continueSetup(t, h)
	k := resultIDs(e.enqueue(t, keyed("a", 0), keyed("a", 1), keyed("b", 0), keyed("b", 1), keyed("a", 2), keyed("a", 3), keyed("a", 4)))
	a, b := []uuid.UUID{k[0], k[1], k[4], k[5], k[6]}, k[2:4]
	first := e.claim(t, orderedOpts(1))
	require.Equal(t, a[:1], ids(first))
	next, lost, err := e.store.CompleteAndClaim(e.ctx, acks(first), continueOpts(3))
	require.NoError(t, err)
	require.Empty(t, lost)
	for _, r := range next {
		if slices.Contains(b, r.ID) {
			t.Skipf("dialect %s looks for heads first (it ignores ClaimParams.Continue)", h.Dialect.Name())
		}
	}
	require.Equal(t, a[1:4], ids(next), "the key's next run, before the other key's older head")
}

// Continue continues only a key whose settled rows were all delivered: a key with a row
// put back for a retry (due at once) is found again from its head, which is that row, not
// continued after its last settled row.
func testRunsContinueOnlyDelivered(t *testing.T, h Harness) {
	e := continueSetup(t, h)
	k := resultIDs(e.enqueue(t, keyed("k", 0), keyed("k", 1), keyed("k", 2), keyed("k", 3)))
	first := e.claim(t, runOpts(2))
	require.Equal(t, k[:2], ids(first))
	outs := []outbox.Outcome{
		{Lease: first[0].Lease(), Status: outbox.StatusDelivered},
		{Lease: first[1].Lease(), Status: outbox.StatusPending, Error: "try again"},
	}
	next, lost, err := e.store.CompleteAndClaim(e.ctx, outs, continueOpts(2))
	require.NoError(t, err)
	require.Empty(t, lost)
	require.Equal(t, k[1:3], ids(next), "the row put back is the key's head again, with its run after it")
}

// Continue never continues a key whose outcome lost its lease: the row was taken over and
// is in flight again, so the rows after it wait for it.
func testRunsContinueNotLost(t *testing.T, h Harness) {
	e := continueSetup(t, h)
	k := resultIDs(e.enqueue(t, keyed("k", 0), keyed("k", 1), keyed("k", 2)))
	short := orderedOpts(1)
	short.Lease = time.Millisecond
	first := e.claim(t, short)
	require.Equal(t, k[:1], ids(first))
	var again []outbox.Record
	eventually(t, 10*time.Second, "the row's lease runs out and another claim takes it over", func() bool {
		again = e.claim(t, orderedOpts(1))
		return len(again) == 1
	})
	require.Equal(t, k[:1], ids(again))
	next, lost, err := e.store.CompleteAndClaim(e.ctx, acks(first), continueOpts(2))
	require.NoError(t, err)
	require.Equal(t, k[:1], lost)
	require.Empty(t, next, "the key's head is in flight under the other claim")
}
