package outbox

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// retryDue: retries noted from a batch's outcomes shorten the idle pause to their due
// time, are due once it passed, and a claim made then takes the earliest, leaving one
// more claim for the latest; delivered, dead and lost rows are no retries.
func TestRetryDue(t *testing.T) {
	retry := func(d time.Duration) settlement {
		return settlement{out: Outcome{Lease: Lease{ID: uuid.New()}, Status: StatusPending, Delay: d}}
	}
	lost := retry(time.Millisecond)
	out := &outcomes{
		items: []settlement{retry(time.Hour), retry(2 * time.Hour), lost,
			{out: Outcome{Lease: Lease{ID: uuid.New()}, Status: StatusDelivered}}},
		lost: map[uuid.UUID]bool{lost.out.ID: true},
	}
	var d retryDue
	require.Equal(t, time.Minute, d.pause(time.Minute), "nothing noted: the pause stays")
	require.False(t, d.due())
	d.note(out)
	require.Equal(t, time.Minute, d.pause(time.Minute), "due in an hour: a minute's pause stays")
	require.InDelta(t, time.Hour, d.pause(3*time.Hour), float64(time.Second), "the pause ends when the first retry is due")
	require.False(t, d.due())
	d.claimed(time.Now())
	require.False(t, d.first.IsZero(), "a claim before the due time takes nothing")

	d.first = time.Now().Add(-time.Second) // the first retries are due
	require.True(t, d.due())
	require.Zero(t, d.pause(time.Minute))
	d.claimed(time.Now())
	require.False(t, d.due(), "one more claim, for the latest")
	require.Equal(t, d.last, d.first)
	d.claimed(d.last)
	require.True(t, d.first.IsZero() && d.last.IsZero(), "every retry claimed")
}
