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

	j, _ := delivered.join(whole)
	require.Len(t, j.items, 10)
	require.Equal(t, 10, j.published)
	require.Equal(t, 5, j.unavailable)
	require.False(t, j.partly, "a delivered batch and one that failed whole")
	j, _ = delivered.join(partly)
	require.True(t, j.partly)
	j, _ = partly.join(whole)
	require.True(t, j.partly)

	lost := batch(2, 0)
	lost.lost[lost.items[0].out.ID] = true
	j, _ = lost.join(delivered)
	require.True(t, j.lost[lost.items[0].out.ID])
	require.Len(t, j.pending(), 6, "the lost lease stays out of what is recorded")
}

// TestOutcomesJoinReclaimed: a row whose lease ran out while its outcome was carried, and
// which the publisher then claimed again, is in both batches. The later lease is the one
// that holds: the stale outcome is left out and reported as a lost lease (once, not again
// when renewal had already found it lost), and the new one is settled even when the old
// lease was marked lost. Settled by id alone, the stale outcome passed for applied: a
// SQLite drain under load counted 42 deliveries twice (TestPublisherConcurrentDrain).
func TestOutcomesJoinReclaimed(t *testing.T) {
	t.Parallel()
	x, y, z := uuid.New(), uuid.New(), uuid.New()
	item := func(id uuid.UUID, token uuid.UUID, st Status) settlement {
		return settlement{out: Outcome{Lease: Lease{ID: id, Token: token}, Status: st}}
	}
	t1, t2 := uuid.New(), uuid.New()
	old := &outcomes{items: []settlement{item(x, t1, StatusDelivered), item(y, t1, StatusPending), item(z, t1, StatusDelivered)},
		lost: map[uuid.UUID]bool{y: true}, published: 3}
	again := &outcomes{items: []settlement{item(x, t2, StatusDelivered), item(y, t2, StatusDelivered)},
		lost: map[uuid.UUID]bool{}, published: 2}

	j, reclaimed := old.join(again)
	require.Equal(t, []uuid.UUID{x}, reclaimed, "y's lease was found lost by renewal, and counted then")
	require.Equal(t, []Outcome{old.items[2].out, again.items[0].out, again.items[1].out}, j.pending(),
		"each row once, under the lease that holds; y settles though its old lease was lost")
	require.Equal(t, 5, j.published)
}
