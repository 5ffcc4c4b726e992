package outbox

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// claimGate is the hook through which a [Relay] schedules the claim loops of its stores'
// publishers. A Publisher of its own has none. The claim loop consults it at two points:
// before each claim (acquire, or tryAcquire for a claim made while a batch is in the
// transport) and after each batch is recorded (release); see loopGate for the counting.
//
// The circuit breaker belongs to the relay as a whole (a relay has one transport): every
// store's publisher shares the relay's circuit (Publisher.circ), which the claim loop asks
// before it asks the gate, so every store pauses together; a probe takes a slot like any
// claim.
type claimGate interface {
	// acquire waits for a slot of the relay's budget, in FIFO order with every other
	// store's loops. probe says the loop's last claim found nothing and no wake-up came
	// since: the claim is an idle probe, admitted first by the relay's probe budget, a
	// wait that a wake-up on w ends early (woken). A store that is down waits for its
	// backoff first. ok is false when ctx ended.
	acquire(ctx context.Context, w waker, probe bool) (woken, ok bool)
	// tryAcquire takes a slot only if one is free and no loop waits for one.
	tryAcquire() bool
	// contended reports whether loops wait for a slot: a loop then lets its finished
	// batch's slot go instead of passing it to its next claim.
	contended() bool
	// release returns n slots.
	release(n int)
	// claimed reports the outcome of a claim: n rows, or err (the store's health).
	claimed(n int, err error)
	// background admits a sweep through the probe budget; false when ctx ended.
	background(ctx context.Context) bool
}

// loopGate is one claim loop's side of a claimGate: it counts the slots the loop holds,
// one per batch claimed and not yet recorded (plus the one of a claim under way), so that
// the loop returns them all when it stops. Its methods do nothing on a nil *loopGate: a
// Publisher of its own claims as it always did.
type loopGate struct {
	g         claimGate
	held      int
	lastEmpty bool // the last claim returned no rows
}

func newLoopGate(g claimGate) *loopGate {
	if g == nil {
		return nil
	}
	return &loopGate{g: g}
}

// acquire takes a slot for the next claim; chasing says the loop is chasing a wake-up.
func (l *loopGate) acquire(ctx context.Context, w waker, chasing bool) (woken, ok bool) {
	woken, ok = l.g.acquire(ctx, w, l.lastEmpty && !chasing)
	if ok {
		l.held++
	}
	return woken, ok
}

// ahead decides whether the loop claims while a batch is in the transport. With a batch
// to record (hasPrev) the claim takes over that batch's slot, unless other loops wait;
// without one it needs a free slot that no other loop waits for.
func (l *loopGate) ahead(hasPrev bool) bool {
	switch {
	case l == nil:
		return true
	case hasPrev:
		return !l.g.contended()
	case l.g.tryAcquire():
		l.held++
		return true
	}
	return false
}

func (l *loopGate) contended() bool { return l.g.contended() }

// release returns the slot of a batch just recorded (or left to its lease).
func (l *loopGate) release() {
	if l == nil || l.held == 0 {
		return
	}
	l.held--
	l.g.release(1)
}

// claimed reports a claim's outcome; a claim that brought no rows returns its slot.
func (l *loopGate) claimed(n int, err error) {
	if l == nil {
		return
	}
	l.g.claimed(n, err)
	l.lastEmpty = err == nil && n == 0
	if err != nil || n == 0 {
		l.release()
	}
}

func (l *loopGate) releaseAll() {
	if l == nil || l.held == 0 {
		return
	}
	l.g.release(l.held)
	l.held = 0
}

// relaySched is a relay's budget: MaxInFlight slots handed out first come, first served,
// to the claim loops of every store, and a pace for idle probes (claims that follow an
// empty claim with no wake-up since, and sweeps) shared by all stores.
type relaySched struct {
	mu      sync.Mutex
	free    int
	waiters list.List // of chan struct{}, closed when granted; FIFO

	// Idle probes are spaced probeEvery apart (a virtual schedule: nextProbe is the time
	// of the next free turn), so they never exceed 1/probeEvery a second, however many
	// stores there are; each store is probed less often as stores are added.
	probeEvery time.Duration
	nextProbe  time.Time
	probes     atomic.Int64

	// greedy (tests only) breaks the fairness on purpose: a loop keeps its slot for its
	// next claim even while others wait, as first-come greed would. The fairness test
	// fails with it.
	greedy bool
}

func newRelaySched(slots int, probesPerSecond float64) *relaySched {
	return &relaySched{free: slots, probeEvery: time.Duration(float64(time.Second) / probesPerSecond)}
}

func (s *relaySched) acquire(ctx context.Context) bool {
	s.mu.Lock()
	if s.free > 0 && s.waiters.Len() == 0 {
		s.free--
		s.mu.Unlock()
		return true
	}
	ready := make(chan struct{})
	e := s.waiters.PushBack(ready)
	s.mu.Unlock()
	select {
	case <-ready:
		return true
	case <-ctx.Done():
		s.mu.Lock()
		select {
		case <-ready: // granted meanwhile: give it back
			s.releaseLocked(1)
		default:
			s.waiters.Remove(e)
		}
		s.mu.Unlock()
		return false
	}
}

func (s *relaySched) tryAcquire() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.free > 0 && (s.waiters.Len() == 0 || s.greedy) {
		s.free--
		return true
	}
	return false
}

func (s *relaySched) contended() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiters.Len() > 0 && !s.greedy
}

func (s *relaySched) release(n int) {
	s.mu.Lock()
	s.releaseLocked(n)
	s.mu.Unlock()
}

// releaseLocked frees n slots, handing them to the longest waiters first.
func (s *relaySched) releaseLocked(n int) {
	s.free += n
	for s.free > 0 && s.waiters.Len() > 0 {
		e := s.waiters.Front()
		s.waiters.Remove(e)
		s.free--
		close(e.Value.(chan struct{}))
	}
}

// usage returns the slots held and the loops waiting.
func (s *relaySched) usage(slots int) (held, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slots - s.free, s.waiters.Len()
}

// reserveProbe books the next turn of the probe pace and returns how long to wait for it.
// A turn booked by a loop that a wake-up then starts early is not given back: the pace
// errs on the side of fewer queries.
func (s *relaySched) reserveProbe() time.Duration {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	turn := s.nextProbe
	if turn.Before(now) {
		turn = now
	}
	s.nextProbe = turn.Add(s.probeEvery)
	s.probes.Add(1)
	return turn.Sub(now)
}

// memberGate is the claimGate of one store of a relay.
type memberGate struct {
	m *relayMember
	s *relaySched
}

func (g memberGate) acquire(ctx context.Context, w waker, probe bool) (woken, ok bool) {
	if d := g.m.health.retryIn(); d > 0 {
		// Down: retry after the store's backoff. Wake-ups do not cut it short; an enqueue
		// on a database that cannot be reached fails anyway.
		if !sleep(ctx, d) {
			return false, false
		}
	} else if probe {
		if d := g.s.reserveProbe(); d > 0 {
			woken = w.wait(ctx, d)
		}
	}
	if ctx.Err() != nil || !g.s.acquire(ctx) {
		return false, false
	}
	g.m.inFlight.Add(1)
	return woken, true
}

func (g memberGate) tryAcquire() bool {
	if !g.s.tryAcquire() {
		return false
	}
	g.m.inFlight.Add(1)
	return true
}

func (g memberGate) contended() bool { return g.s.contended() }

func (g memberGate) release(n int) {
	g.m.inFlight.Add(-int64(n))
	g.s.release(n)
}

func (g memberGate) claimed(_ int, err error) {
	switch {
	case err == nil:
		g.m.healthy()
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
	default:
		g.m.failed(StoreDown, err)
	}
}

func (g memberGate) background(ctx context.Context) bool {
	if g.m.health.retryIn() > 0 {
		return true // a sweep of a store that is down fails at once, at no cost to the server
	}
	if d := g.s.reserveProbe(); d > 0 {
		return sleep(ctx, d)
	}
	return ctx.Err() == nil
}
