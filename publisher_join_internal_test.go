package outbox

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// TestOutcomesJoin: two batches recorded together keep what each was: their items and lost
// leases, and whether one of them was partly unavailable, which decides whether the
// unavailable messages are logged at Warn (part of a batch) or left to the circuit breaker
// (a whole batch). A delivered batch joined with one that failed whole is not "partly
// unavailable", though the sums (5 of 10) would say so.
func TestOutcomesJoin(t *testing.T) {
	t.Parallel()
	batch := func(published, unavailable int) *outcomes {
		b := &outcomes{lost: map[uuid.UUID]bool{}, published: published, unavailable: unavailable,
			partly: unavailable > 0 && unavailable < published} // as publishBatch sets it
		for range published {
			b.items = append(b.items, settlement{out: Outcome{Lease: Lease{ID: uuid.New()}}})
		}
		return b
	}
	delivered, whole, partly := batch(5, 0), batch(5, 5), batch(5, 2)
	require.False(t, whole.partly)
	require.True(t, partly.partly)

	j := delivered.join(whole)
	require.Len(t, j.items, 10)
	require.Equal(t, 10, j.published)
	require.Equal(t, 5, j.unavailable)
	require.False(t, j.partly, "a delivered batch and one that failed whole")
	require.True(t, delivered.join(partly).partly)
	require.True(t, partly.join(whole).partly)

	lost := batch(2, 0)
	lost.lost[lost.items[0].out.ID] = true
	j = lost.join(delivered)
	require.True(t, j.lost[lost.items[0].out.ID])
	require.Len(t, j.pending(), 6, "the lost lease stays out of what is recorded")
}
