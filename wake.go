package outbox

import (
	"context"
	"sync"
	"time"
)

// wakeHub connects a Store's enqueues to the publishers running on it in the same process:
// an enqueue wakes them at once instead of leaving its rows to the next poll.
type wakeHub struct {
	mu   sync.Mutex
	subs map[*wakeSub]struct{}
}

// wakeSub is one subscriber: a running publisher, woken for the namespace it serves.
type wakeSub struct {
	namespace string
	wake      func()
}

func (h *wakeHub) subscribe(namespace string, wake func()) (unsubscribe func()) {
	s := &wakeSub{namespace: namespace, wake: wake}
	h.mu.Lock()
	if h.subs == nil {
		h.subs = map[*wakeSub]struct{}{}
	}
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		delete(h.subs, s)
		h.mu.Unlock()
	}
}

// signal wakes the subscribers that serve namespace.
func (h *wakeHub) signal(namespace string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		if s.namespace == namespace {
			s.wake()
		}
	}
}

// chaseDelays are the pauses between the claims that follow a wake-up that may come before
// its rows are visible: an in-process enqueue wakes the publisher before the caller has
// committed, which typically takes a few milliseconds more. The claims chase the commit
// with growing pauses, about 150ms in all, after which the poll interval takes over.
var chaseDelays = []time.Duration{
	time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond, 8 * time.Millisecond,
	16 * time.Millisecond, 32 * time.Millisecond, 64 * time.Millisecond,
}

// waker is the wake-up channel of one claim loop: a send never blocks, and wake-ups that
// come while the loop is busy fold into one.
type waker chan struct{}

func newWaker() waker { return make(waker, 1) }

func (w waker) wake() {
	select {
	case w <- struct{}{}:
	default:
	}
}

// wait pauses for d, and reports whether it was woken early: by w, or by ctx ending.
func (w waker) wait(ctx context.Context, d time.Duration) (woken bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return false
	case <-w:
		return true
	}
}

// signalEvery is the least time between two cross-process signals of one Store for one
// namespace. PostgreSQL serialises the commits of transactions that sent a NOTIFY (each
// holds a database-wide lock until its commit is flushed), which cost concurrent
// enqueuers 40 % of their throughput when every transaction signalled. Most of the
// transactions that skip their signal commit within the chase that the previous signal
// started (chaseDelays, about 130ms); the others are found by the next poll.
const signalEvery = 50 * time.Millisecond

// signalLimiter decides, per namespace, which enqueues send a cross-process signal.
type signalLimiter struct {
	mu   sync.Mutex
	last map[string]time.Time
}

func (l *signalLimiter) allow(namespace string) bool {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.last[namespace]) < signalEvery {
		return false
	}
	if l.last == nil || len(l.last) > 1024 {
		l.last = map[string]time.Time{} // bounded: forgetting only lets a signal through
	}
	l.last[namespace] = now
	return true
}
