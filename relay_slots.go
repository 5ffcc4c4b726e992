package outbox

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// slotAdmission admits the claims of one claim loop of a [Relay]'s store by the relay's
// budget of slots (relaySched), shared by every store's loops. It counts the slots the loop
// holds, one per batch claimed and not yet settled (plus the one of a claim under way), so
// that the loop gives them all back when it stops.
//
// The circuit breaker belongs to the relay as a whole (a relay has one transport): every
// store's publisher shares the relay's circuit (Publisher.circ), whose admission the loop
// asks first (admissions), so every store pauses together; a probe takes a slot like any
// claim.
type slotAdmission struct {
	ctx       context.Context // Run's
	slots     storeSlots
	w         waker
	held      int
	lastEmpty bool // the last claim returned no rows
}

// admit takes a slot for the next claim, in FIFO order with every other store's loops.
// A loop that carries a batch passes that batch's slot on to the claim that settles it,
// unless other loops wait for one: it then settles the batch alone and queues. A claim
// that follows an empty claim, unless the loop chases a wake-up, is an idle probe, paced
// by the relay (storeSlots.acquire).
func (a *slotAdmission) admit(s *settler, chasing bool) (ticket, bool) {
	if s.carrying() {
		if !a.slots.contended() {
			return ticket{}, true
		}
		s.settle()
	}
	woken, ok := a.slots.acquire(a.ctx, a.w, a.lastEmpty && !chasing)
	if !ok {
		return ticket{}, false
	}
	a.held++
	return ticket{woken: woken}, true
}

// ahead lets a claim made while a batch is in the transport take over the slot of the
// batch it settles, unless other loops wait; without one it needs a free slot that no
// other loop waits for.
func (a *slotAdmission) ahead(s *settler) bool {
	if s.carrying() {
		return !a.slots.contended()
	}
	if a.slots.tryAcquire() {
		a.held++
		return true
	}
	return false
}

// claimed reports a claim's outcome to the store's health; a claim that brought no rows
// gives its slot back.
func (a *slotAdmission) claimed(_ ticket, n int, err error) {
	a.slots.claimed(err)
	a.lastEmpty = err == nil && n == 0
	if err != nil || n == 0 {
		a.released()
	}
}

func (a *slotAdmission) published(*outcomes, ticket) {}

// released gives back the slot of a batch just settled (or left to its lease), or joined
// with one that holds a slot of its own.
func (a *slotAdmission) released() {
	if a.held == 0 {
		return
	}
	a.held--
	a.slots.release(1)
}

func (a *slotAdmission) close() {
	if a.held == 0 {
		return
	}
	a.slots.release(a.held)
	a.held = 0
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

// storeSlots is one store's side of its relay's budget: the slots its claim loops take and
// the probe pace its idle claims and sweeps follow.
type storeSlots struct {
	m *relayMember
	s *relaySched
}

// acquire waits for a slot of the relay's budget. probe says the claim is an idle probe: it
// waits for its turn of the relay's probe pace first, a wait that a wake-up on w ends early
// (woken). A store that is down waits for its backoff first. ok is false when ctx ended.
func (g storeSlots) acquire(ctx context.Context, w waker, probe bool) (woken, ok bool) {
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

// tryAcquire takes a slot only if one is free and no loop waits for one.
func (g storeSlots) tryAcquire() bool {
	if !g.s.tryAcquire() {
		return false
	}
	g.m.inFlight.Add(1)
	return true
}

// contended reports whether loops wait for a slot.
func (g storeSlots) contended() bool { return g.s.contended() }

// release returns n slots.
func (g storeSlots) release(n int) {
	g.m.inFlight.Add(-int64(n))
	g.s.release(n)
}

// claimed reports the outcome of a claim to the store's health.
func (g storeSlots) claimed(err error) {
	switch {
	case err == nil:
		g.m.healthy()
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
	default:
		g.m.failed(StoreDown, err)
	}
}

// background admits a sweep through the probe pace; false when ctx ended.
func (g storeSlots) background(ctx context.Context) bool {
	if g.m.health.retryIn() > 0 {
		return true // a sweep of a store that is down fails at once, at no cost to the server
	}
	if d := g.s.reserveProbe(); d > 0 {
		return sleep(ctx, d)
	}
	return ctx.Err() == nil
}
