package conformance

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
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
