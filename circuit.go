package outbox

import (
	"cmp"
	"math/rand/v2"
	"sync"
	"time"
)

// Defaults of [CircuitOptions].
const (
	DefaultCircuitThreshold = 1
	DefaultProbeMin         = time.Second
	DefaultProbeMax         = 30 * time.Second
)

// CircuitOptions configure the circuit breaker of a [Publisher], which stops claiming while
// the destination is down. The zero value is the default, and a user need not touch it.
//
// The circuit is closed while deliveries reach the destination. When Threshold batches in
// a row come back with every message [Unavailable], it opens: the claim loops stop
// claiming, and once per probe interval one of them (one for the whole publisher, not one
// per loop) claims a single message and publishes it, the circuit being half-open meanwhile.
// If that probe reaches the destination the circuit closes and every loop claims at full
// speed again; if it fails Unavailable the circuit opens again for twice the interval, up
// to ProbeMax. Wake-ups ([Publisher.Wake], enqueues, NOTIFY) do not bypass an open circuit.
// The messages of a failed batch or probe keep their attempt count (see [Unavailable]), so
// an outage of any length dead-letters nothing, and costs the database one claim of one
// row per probe interval instead of a claim loop's polling.
type CircuitOptions struct {
	// Disabled turns the breaker off: every batch is claimed and published as if the
	// destination were up. Unavailable messages still keep their attempts.
	Disabled bool

	// Threshold is the number of consecutive all-Unavailable batches (of any claim loop)
	// that opens the circuit. Default [DefaultCircuitThreshold], 1: a batch whose every
	// message failed to reach the destination already says the destination is down, and
	// every further batch would be claimed, published and given back for nothing. A batch
	// where some messages got through resets the count and never opens the circuit.
	Threshold int

	// ProbeMin is the pause before the first probe after the circuit opens. Each failed
	// probe doubles it, up to ProbeMax; a jitter of up to a quarter of the pause is added,
	// never subtracted, so that publishers that saw the same outage do not probe in step,
	// and no publisher probes more than once per ProbeMin. Default [DefaultProbeMin].
	ProbeMin time.Duration

	// ProbeMax caps the pause between probes (before jitter); it bounds how long delivery
	// may wait after the destination is back. At least ProbeMin. Default
	// [DefaultProbeMax].
	ProbeMax time.Duration
}

// withDefaults returns o with its zero fields set to the defaults.
func (o CircuitOptions) withDefaults() CircuitOptions {
	o.Threshold = cmp.Or(o.Threshold, DefaultCircuitThreshold)
	o.ProbeMin = cmp.Or(o.ProbeMin, DefaultProbeMin)
	if o.ProbeMax == 0 {
		o.ProbeMax = max(DefaultProbeMax, o.ProbeMin)
	}
	return o
}

// validate checks options whose defaults are applied (withDefaults).
func (o CircuitOptions) validate() error {
	switch {
	case o.Threshold < 1:
		return invalid("Circuit.Threshold", "must be at least 1, got %d", o.Threshold)
	case o.ProbeMin < time.Millisecond:
		return invalid("Circuit.ProbeMin", "must be at least 1ms, got %s", o.ProbeMin)
	case o.ProbeMax < o.ProbeMin:
		return invalid("Circuit.ProbeMax", "must be at least ProbeMin (%s), got %s", o.ProbeMin, o.ProbeMax)
	}
	return nil
}

// circuitState is the state of a circuit: closed, open or half-open, as in sony/gobreaker.
type circuitState int

const (
	circuitClosed   circuitState = iota // claiming as usual
	circuitOpen                         // not claiming until the next probe is due
	circuitHalfOpen                     // one probe in flight; the other loops wait for it
)

func (s circuitState) String() string {
	return [...]string{"closed", "open", "half-open"}[s]
}

// circuit is the breaker's state, shared by a publisher's claim loops. It only decides;
// the publisher logs and reports the transitions it returns.
type circuit struct {
	opts CircuitOptions
	now  func() time.Time
	// jitter returns the extra pause added to a probe interval d, in [0, d/4].
	jitter func(d time.Duration) time.Duration

	mu        sync.Mutex
	state     circuitState
	failures  int           // consecutive all-Unavailable batches while closed
	interval  time.Duration // the current probe interval, before jitter
	nextProbe time.Time     // when open: when the next probe may start
	openedAt  time.Time     // when it last opened from closed; zero while closed
	probeAt   time.Time     // when half-open: when the probe was handed out
	changed   chan struct{} // closed and replaced on every change of state
}

// probeLost is how long a probe may stay out before the circuit hands out another: its
// loop may have stopped without a result (its publisher was removed from a relay, or shut
// down past its deadline), and the circuit must not stay half-open for good. It is longer
// than any probe's publish and settle (PublishTimeout defaults to a minute).
const probeLost = 3 * time.Minute

func newCircuit(o CircuitOptions) *circuit {
	return &circuit{
		opts: o, now: time.Now, changed: make(chan struct{}),
		jitter: func(d time.Duration) time.Duration { return rand.N(d/4 + 1) },
	}
}

// permit is what a claim loop may do now.
type permit struct {
	// claim: claim as usual (closed), or, with probe, claim one message as the probe.
	claim, probe bool
	// wait, when claim is false: wait until changed is closed or wait passes, then ask
	// again.
	wait    time.Duration
	changed <-chan struct{}
}

// allow tells a claim loop whether to claim. When the circuit is open and the next probe is
// due, the one loop that asks first gets the probe, and the circuit turns half-open.
func (c *circuit) allow() permit {
	if c == nil {
		return permit{claim: true}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch c.state {
	case circuitClosed:
		return permit{claim: true}
	case circuitOpen:
		if d := c.nextProbe.Sub(c.now()); d > 0 {
			return permit{wait: d, changed: c.changed}
		}
		c.set(circuitHalfOpen)
		c.probeAt = c.now()
		return permit{claim: true, probe: true}
	default: // half-open: the probe decides, unless it was lost
		if d := c.probeAt.Add(probeLost).Sub(c.now()); d > 0 {
			return permit{wait: min(d, c.opts.ProbeMax), changed: c.changed}
		}
		c.probeAt = c.now()
		return permit{claim: true, probe: true}
	}
}

// closed reports whether the circuit lets loops claim as usual (and claim ahead).
func (c *circuit) closed() bool {
	if c == nil {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state == circuitClosed
}

// transition is a change that the publisher logs: the circuit opened from closed, or
// closed after having been open (for openFor).
type transition struct {
	opened, closed bool
	openFor        time.Duration
	probeIn        time.Duration // when opened: the first probe's pause
}

// afterBatch takes the result of one published batch: allUnavailable when every message it
// published failed [Unavailable]; began is when its publish began, and probe says it was
// the probe. A batch that reached the destination closes the circuit, the probe or any
// other that began after the circuit opened; one that began before says nothing about the
// destination since (another loop's batch, in flight when the outage began, may have got
// through just before it), so it leaves an open circuit to its probe.
func (c *circuit) afterBatch(allUnavailable, probe bool, began time.Time) transition {
	if c == nil {
		return transition{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !allUnavailable {
		if c.state == circuitClosed {
			c.failures = 0
			return transition{}
		}
		if !probe && began.Before(c.openedAt) {
			return transition{}
		}
		c.failures = 0
		t := transition{closed: true, openFor: c.now().Sub(c.openedAt)}
		c.openedAt = time.Time{}
		c.set(circuitClosed)
		return t
	}
	switch {
	case c.state == circuitClosed:
		c.failures++
		if c.failures < c.opts.Threshold {
			return transition{}
		}
		c.failures = 0
		c.openedAt = c.now()
		c.interval = c.opts.ProbeMin
		return transition{opened: true, probeIn: c.reopen()}
	case probe && c.state == circuitHalfOpen:
		c.interval = min(c.interval*2, c.opts.ProbeMax)
		c.reopen()
	}
	// Open already: a batch claimed before it opened failed too. Nothing changes.
	return transition{}
}

// probeVoid ends a probe that tested nothing: its claim failed or found no due message.
// The circuit opens again for the same interval, not a doubled one: the destination was
// not asked.
func (c *circuit) probeVoid() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == circuitHalfOpen {
		c.reopen()
	}
}

// reopen opens the circuit for the current interval plus jitter and returns that pause.
// The caller holds mu.
func (c *circuit) reopen() time.Duration {
	d := c.interval + c.jitter(c.interval)
	c.nextProbe = c.now().Add(d)
	c.set(circuitOpen)
	return d
}

// set changes the state and wakes the loops waiting for a change. The caller holds mu.
func (c *circuit) set(s circuitState) {
	c.state = s
	close(c.changed)
	c.changed = make(chan struct{})
}

// snapshot returns whether the circuit is open (or half-open) and since when.
func (c *circuit) snapshot() (open bool, since time.Time) {
	if c == nil {
		return false, time.Time{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state != circuitClosed, c.openedAt
}
