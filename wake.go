package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxgo/outbox/dialect"
)

// hubs holds one wakeHub per pool and table that something in this process publishes from,
// so that publishers of any number of Stores on one *sql.DB and table share one listener
// and hear each other's enqueues.
var hubs = struct {
	mu sync.Mutex
	m  map[hubKey]*wakeHub
	// held counts, per pool, the connections the library's listeners hold for good.
	held map[*sql.DB]int
}{m: map[hubKey]*wakeHub{}, held: map[*sql.DB]int{}}

type hubKey struct {
	db *sql.DB
	t  dialect.Table
}

// wakeHub connects the enqueues and the listener of one pool and table to the publishers
// running on it: an enqueue in this process, or a signal the listener hears from another
// process, wakes the publishers of its namespace at once instead of leaving its rows to the
// next poll.
type wakeHub struct {
	key hubKey
	// listening is true while the listener is connected.
	listening atomic.Bool

	mu   sync.Mutex
	subs map[*wakeSub]struct{}
	seq  int
	// stop ends the listener; nil while none runs.
	stop context.CancelFunc
	// done is closed when the listener that stop ends has returned.
	done chan struct{}
	// off is set when the listener cannot run on this pool (the driver cannot listen, or
	// the pool has no connection to spare), so that later subscribers do not retry or warn.
	off bool
}

// wakeSub is one subscriber: a running publisher, woken for the namespace it serves. A
// subscriber with a notifier wants the listener to run.
type wakeSub struct {
	seq       int
	namespace string
	wake      func()
	notifier  dialect.Notifier
	// listenDB is the pool the listener takes its connection from; nil for the hub's.
	listenDB *sql.DB
	log      *slog.Logger
}

// hubFor returns the hub of db and t when one exists: nobody publishes from them otherwise.
func hubFor(db *sql.DB, t dialect.Table) *wakeHub {
	hubs.mu.Lock()
	defer hubs.mu.Unlock()
	return hubs.m[hubKey{db, t}]
}

// subscribe adds s to the hub of db and t, creating the hub and starting its listener as
// needed, and returns the hub and the function that removes s again: the last subscriber
// out stops the listener and drops the hub.
func subscribe(db *sql.DB, t dialect.Table, s *wakeSub) (*wakeHub, func()) {
	k := hubKey{db, t}
	hubs.mu.Lock()
	h := hubs.m[k]
	if h == nil {
		h = &wakeHub{key: k, subs: map[*wakeSub]struct{}{}}
		hubs.m[k] = h
	}
	h.mu.Lock()
	h.seq++
	s.seq = h.seq
	h.subs[s] = struct{}{}
	var refused string
	if s.notifier != nil && h.stop == nil && !h.off {
		refused = h.startListener(s)
	}
	h.mu.Unlock()
	hubs.mu.Unlock()
	if refused != "" {
		s.log.Warn(refused)
	}

	var once sync.Once
	return h, func() { once.Do(func() { h.unsubscribe(s) }) }
}

func (h *wakeHub) unsubscribe(s *wakeSub) {
	hubs.mu.Lock()
	h.mu.Lock()
	delete(h.subs, s)
	var stop context.CancelFunc
	var done chan struct{}
	if h.stop != nil && !h.wantsListener() {
		stop, done = h.stop, h.done
		h.stop, h.done = nil, nil
	}
	if len(h.subs) == 0 {
		delete(hubs.m, h.key)
	}
	h.mu.Unlock()
	hubs.mu.Unlock()
	if stop != nil {
		stop()
		<-done // the listener's connection is closed before the last publisher's Run returns
	}
}

func (h *wakeHub) wantsListener() bool {
	for s := range h.subs {
		if s.notifier != nil {
			return true
		}
	}
	return false
}

// startListener starts the hub's listener with s's notifier when the pool can spare it a
// connection, and otherwise returns the warning that says why not; hubs.mu and h.mu are
// held. The library never takes a pool's last connection: the application, the claims and
// the settles need one.
func (h *wakeHub) startListener(s *wakeSub) (refused string) {
	db := h.key.db
	if s.listenDB != nil {
		db = s.listenDB // a pool of its own: nothing of the Store's pool to budget
	}
	if db == h.key.db {
		held := hubs.held[db]
		if max := db.Stats().MaxOpenConnections; max > 0 && held+1 >= max {
			h.off = true
			return fmt.Sprintf("outbox publisher: not listening for wake-ups from other processes: a listener holds "+
				"one connection of the pool for good, and this pool (db.SetMaxOpenConns(%d)) has %d held by the "+
				"library's listeners already and needs one for everything else, so rows enqueued elsewhere are found "+
				"by polling; allow the pool %d connections or more for wake-ups, or set outbox.Options.DisableNotify",
				max, held, held+2)
		}
		hubs.held[db]++
	}
	ctx, stop := context.WithCancel(context.Background())
	h.stop, h.done = stop, make(chan struct{})
	go h.listen(ctx, s.notifier, db, h.done)
	return ""
}

// logger is the logger of the oldest subscriber that wants the listener, which speaks for
// the hub.
func (h *wakeHub) logger() *slog.Logger {
	h.mu.Lock()
	defer h.mu.Unlock()
	var first *wakeSub
	for s := range h.subs {
		if s.notifier != nil && (first == nil || s.seq < first.seq) {
			first = s
		}
	}
	if first == nil {
		return slog.New(slog.DiscardHandler)
	}
	return first.log
}

// listen keeps the listener connected until ctx ends, waking the subscribers on every
// signal for their namespace, and all of them once after each (re)connection, for what was
// committed while it was away. A listener that cannot listen (the driver cannot, or it
// hears nothing behind a transaction-pooling proxy) is warned about once and left to
// polling. A listener that stops is logged once, as a warning, however often it then fails
// to come back (the claim loops poll meanwhile), and once more when it is back.
func (h *wakeHub) listen(ctx context.Context, n dialect.Notifier, db *sql.DB, done chan struct{}) {
	defer close(done)
	if db == h.key.db { // startListener counted the connection against the pool
		defer func() {
			hubs.mu.Lock()
			if hubs.held[h.key.db]--; hubs.held[h.key.db] <= 0 {
				delete(hubs.held, h.key.db)
			}
			hubs.mu.Unlock()
		}()
	}
	const firstDelay = 100 * time.Millisecond
	delay := firstDelay
	lost := false
	for ctx.Err() == nil {
		err := n.Listen(ctx, db, h.key.t, func() {
			h.listening.Store(true)
			delay = firstDelay
			if lost {
				lost = false
				h.logger().Info(msgListenerBack)
			}
			h.wakeAll()
		}, h.signal)
		h.listening.Store(false)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, errors.ErrUnsupported):
			h.mu.Lock()
			h.off = true
			h.mu.Unlock()
			h.logger().Warn("outbox publisher: no wake-ups from other processes; polling finds their rows", "err", err)
			return
		}
		level := slog.LevelDebug
		if !lost {
			lost, level = true, slog.LevelWarn
		}
		h.logger().Log(ctx, level, msgListenerLost, "err", err, "retry_in", delay)
		if !sleep(ctx, delay) {
			return
		}
		delay = min(delay*2, DefaultIdleBackoffMax)
	}
}

// state is the listener's state as its subscribers see it: connected, running and not
// connected, or not running.
func (h *wakeHub) state() ListenerState {
	if h.listening.Load() {
		return ListenerConnected
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stop != nil && !h.off { // off: it could not listen and returned for good
		return ListenerDown
	}
	return ListenerNone
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

func (h *wakeHub) wakeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		s.wake()
	}
}

// heldConns is the number of db's connections that the library's listeners hold for good.
func heldConns(db *sql.DB) int {
	hubs.mu.Lock()
	defer hubs.mu.Unlock()
	return hubs.held[db]
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
// namespace: PostgreSQL serialises the commits of transactions that sent a NOTIFY, so
// signalling on every enqueue would slow concurrent enqueuers. The transactions that skip
// their signal mostly commit within the chase the previous signal started; the next poll
// finds the others.
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
