package outbox_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
)

func TestRetryPolicyBackoff(t *testing.T) {
	t.Parallel()
	p := outbox.RetryPolicy{BaseDelay: time.Second, MaxDelay: time.Minute}
	for attempts, want := range map[int]time.Duration{
		0: time.Second, 1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second,
		6: 32 * time.Second, 7: time.Minute, 1000: time.Minute, math.MaxInt: time.Minute,
	} {
		require.Equal(t, want, p.Backoff(attempts), "attempts %d", attempts)
	}
	// Doubling must clamp, never overflow into a negative or zero delay.
	huge := outbox.RetryPolicy{BaseDelay: time.Second, MaxDelay: math.MaxInt64}
	prev := time.Duration(0)
	for attempts := 1; attempts < 200; attempts++ {
		d := huge.Backoff(attempts)
		require.GreaterOrEqual(t, d, prev, "attempts %d: backoff must never shrink", attempts)
		prev = d
		j := huge.Jittered(attempts)
		require.True(t, j >= d/2 && j <= d, "attempts %d: jittered %s outside [%s, %s]", attempts, j, d/2, d)
	}
	require.Equal(t, time.Duration(math.MaxInt64), huge.Backoff(199))
}
