package outbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// testCircuit is a circuit on a clock the test moves, with a jitter of d/4 (the largest).
func testCircuit(t *testing.T, o CircuitOptions) (*circuit, *time.Time) {
	t.Helper()
	o = o.withDefaults()
	require.NoError(t, o.validate())
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	c := newCircuit(o)
	c.now = func() time.Time { return now }
	c.jitter = func(d time.Duration) time.Duration { return d / 4 }
	return c, &now
}

func requireState(t *testing.T, c *circuit, want circuitState) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Equal(t, want, c.state, "state")
}

// requireWait asserts that a loop may not claim, and must wait d or a change of state.
func requireWait(t *testing.T, c *circuit, d time.Duration) <-chan struct{} {
	t.Helper()
	g := c.allow()
	require.False(t, g.claim, "a loop may not claim")
	require.Equal(t, d, g.wait)
	require.NotNil(t, g.changed)
	return g.changed
}

func requireClosedCh(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	default:
		t.Fatal("the waiting loops were not woken")
	}
}

func TestCircuitTransitions(t *testing.T) {
	t.Parallel()
	c, now := testCircuit(t, CircuitOptions{ProbeMin: time.Second, ProbeMax: 3 * time.Second})

	// closed -> closed: a good batch, and any batch with a message that got through.
	require.Equal(t, permit{claim: true}, c.allow())
	require.Equal(t, transition{}, c.afterBatch(false, false, *now))
	requireState(t, c, circuitClosed)

	// closed -> open: one all-Unavailable batch (Threshold 1), first probe after
	// ProbeMin plus jitter.
	tr := c.afterBatch(true, false, *now)
	require.True(t, tr.opened)
	require.Equal(t, 1250*time.Millisecond, tr.probeIn)
	requireState(t, c, circuitOpen)
	open, since := c.snapshot()
	require.True(t, open)
	require.Equal(t, *now, since)
	require.False(t, c.closed(), "no claiming ahead while open")

	// open -> open: loops wait until the probe is due; in-flight batches that fail change
	// nothing.
	changed := requireWait(t, c, 1250*time.Millisecond)
	require.Equal(t, transition{}, c.afterBatch(true, false, *now))
	requireState(t, c, circuitOpen)
	*now = now.Add(time.Second)
	requireWait(t, c, 250*time.Millisecond)

	// open -> half-open: exactly one loop gets the probe; the others wait for it.
	*now = now.Add(250 * time.Millisecond)
	require.Equal(t, permit{claim: true, probe: true}, c.allow())
	requireClosedCh(t, changed)
	requireState(t, c, circuitHalfOpen)
	changed = requireWait(t, c, 3*time.Second)
	requireWait(t, c, 3*time.Second)

	// half-open -> open: the probe failed; the interval doubles.
	require.Equal(t, transition{}, c.afterBatch(true, true, *now))
	requireClosedCh(t, changed)
	requireState(t, c, circuitOpen)
	requireWait(t, c, 2500*time.Millisecond)

	// ... and doubles up to ProbeMax.
	*now = now.Add(2500 * time.Millisecond)
	require.True(t, c.allow().probe)
	c.afterBatch(true, true, *now)
	requireWait(t, c, 3750*time.Millisecond) // 3s cap plus a quarter
	*now = now.Add(3750 * time.Millisecond)
	require.True(t, c.allow().probe)
	c.afterBatch(true, true, *now)
	requireWait(t, c, 3750*time.Millisecond)

	// half-open -> open without doubling: the probe claimed nothing, or its claim failed.
	*now = now.Add(3750 * time.Millisecond)
	require.True(t, c.allow().probe)
	c.probeVoid()
	requireState(t, c, circuitOpen)
	requireWait(t, c, 3750*time.Millisecond)
	// The reset of the interval comes only with closing: probe once more.
	*now = now.Add(3750 * time.Millisecond)
	require.True(t, c.allow().probe)

	// half-open -> closed: the probe got through. The transition reports how long it was
	// open, and the waiting loops wake.
	changed = requireWait(t, c, 3*time.Second)
	tr = c.afterBatch(false, true, *now)
	require.True(t, tr.closed)
	require.Equal(t, now.Sub(since), tr.openFor)
	requireClosedCh(t, changed)
	requireState(t, c, circuitClosed)
	open, since = c.snapshot()
	require.False(t, open)
	require.True(t, since.IsZero())
	require.True(t, c.closed())
	require.Equal(t, permit{claim: true}, c.allow())

	// Closed again, a new outage starts over from ProbeMin.
	require.Equal(t, 1250*time.Millisecond, c.afterBatch(true, false, *now).probeIn)
}

// A batch that reaches the destination closes an open circuit even when it is not the
// probe, if it began after the circuit opened.
func TestCircuitOpenClosesOnAnySuccess(t *testing.T) {
	t.Parallel()
	c, now := testCircuit(t, CircuitOptions{})
	before := now.Add(-time.Millisecond)
	require.True(t, c.afterBatch(true, false, *now).opened)
	// A batch that began before the circuit opened and got through says nothing of now.
	require.Equal(t, transition{}, c.afterBatch(false, false, before))
	requireState(t, c, circuitOpen)
	*now = now.Add(time.Millisecond)
	tr := c.afterBatch(false, false, *now)
	require.True(t, tr.closed)
	requireState(t, c, circuitClosed)
	// A probe that fails after another batch closed the circuit counts as a new failure.
	require.True(t, c.afterBatch(true, true, *now).opened)
}

// Threshold N: N-1 all-Unavailable batches keep it closed, a batch that got through resets
// the count, and the Nth in a row opens it.
func TestCircuitThreshold(t *testing.T) {
	t.Parallel()
	c, now := testCircuit(t, CircuitOptions{Threshold: 3})
	require.False(t, c.afterBatch(true, false, *now).opened)
	require.False(t, c.afterBatch(true, false, *now).opened)
	require.False(t, c.afterBatch(false, false, *now).closed, "closed stays closed")
	require.False(t, c.afterBatch(true, false, *now).opened)
	require.False(t, c.afterBatch(true, false, *now).opened)
	requireState(t, c, circuitClosed)
	require.True(t, c.afterBatch(true, false, *now).opened)
}

// A nil circuit (Disabled) always lets loops claim and never opens.
func TestCircuitDisabled(t *testing.T) {
	t.Parallel()
	var c *circuit
	require.Equal(t, permit{claim: true}, c.allow())
	require.Equal(t, transition{}, c.afterBatch(true, false, time.Now()))
	c.probeVoid()
	require.True(t, c.closed())
	open, _ := c.snapshot()
	require.False(t, open)
}

func TestCircuitOptionsValidate(t *testing.T) {
	t.Parallel()
	o := CircuitOptions{}.withDefaults()
	require.NoError(t, o.validate())
	require.Equal(t, CircuitOptions{Threshold: 1, ProbeMin: time.Second, ProbeMax: 30 * time.Second}, o)
	o = CircuitOptions{ProbeMin: time.Minute}.withDefaults()
	require.NoError(t, o.validate())
	require.Equal(t, time.Minute, o.ProbeMax, "the default ProbeMax is at least ProbeMin")
	for _, bad := range []CircuitOptions{
		{Threshold: -1},
		{ProbeMin: time.Microsecond},
		{ProbeMin: time.Second, ProbeMax: time.Millisecond},
	} {
		require.ErrorIs(t, bad.withDefaults().validate(), ErrInvalid, "%+v", bad)
	}
	// The real jitter adds at most a quarter, never subtracts.
	c := newCircuit(CircuitOptions{})
	for range 100 {
		j := c.jitter(time.Second)
		require.True(t, j >= 0 && j <= 250*time.Millisecond, "%s", j)
	}
}

// A probe whose loop stopped without a result (its publisher left a relay, or shut down past
// its deadline) is handed out again after probeLost, so the circuit never stays half-open
// for good; until then the other loops wait for it.
func TestCircuitLostProbe(t *testing.T) {
	c, now := testCircuit(t, CircuitOptions{ProbeMin: time.Second, ProbeMax: 3 * time.Second})
	c.afterBatch(true, false, *now)
	*now = now.Add(2 * time.Second)
	require.True(t, c.allow().probe)
	requireState(t, c, circuitHalfOpen)
	requireWait(t, c, 3*time.Second)
	*now = now.Add(probeLost - time.Second)
	requireWait(t, c, time.Second)
	*now = now.Add(time.Second)
	require.Equal(t, permit{claim: true, probe: true}, c.allow(), "the lost probe is handed out again")
	requireWait(t, c, 3*time.Second)
	require.True(t, c.afterBatch(false, true, *now).closed)
	requireState(t, c, circuitClosed)
}
