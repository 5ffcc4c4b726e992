package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// Defaults of [RelayOptions].
const (
	DefaultRelayMaxInFlight         = 32
	DefaultRelayIdleProbesPerSecond = 50
	DefaultRelayDownBackoffMax      = 10 * time.Second
)

// MaxRelayStoreName is the longest name [Relay.Add] accepts, in bytes.
const MaxRelayStoreName = 128

var (
	// ErrRelayRunning is returned by [Relay.Run] when the same Relay is already running.
	ErrRelayRunning = errors.New("outbox: relay is already running")

	// ErrStoreExists is returned by [Relay.Add] for a name the relay already has.
	ErrStoreExists = errors.New("outbox: relay: a store of that name was added already")

	// ErrUnknownStore is returned by [Relay.Remove] for a name the relay does not have.
	ErrUnknownStore = errors.New("outbox: relay: no store of that name")
)

// RelayOptions configure a [Relay]. Zero fields take the documented defaults; [NewRelay]
// refuses inconsistent settings with a [*ValidationError].
type RelayOptions struct {
	// Publisher are the publisher options of every store added without options of its own
	// (see [Relay.Add]). Namespace is required, as for [NewPublisher]. Its Logger receives
	// the relay's own lines too, and its WorkerID, random by default, is the relay's: every
	// store's rows are claimed under it.
	Publisher PublisherOptions

	// MaxInFlight is the relay's budget: how many claims and batches may be under way at
	// once, over all stores. A slot is taken before a claim and returned when the claim
	// finds nothing or when the batch it claimed is settled, so it bounds the connections
	// the relay's claims hold at once and the messages in the transport (MaxInFlight ×
	// BatchSize). Slots go to the stores' claim loops in the order they asked (first in,
	// first out), and a store whose batch is settled while others wait queues behind them,
	// so a store with a large backlog delays a claim of another store by about one batch.
	// Default [DefaultRelayMaxInFlight].
	MaxInFlight int

	// IdleProbesPerSecond bounds the relay's idle queries: claims that follow an empty
	// claim of the same store with no wake-up since, and the stores' sweeps. They are
	// spaced 1/IdleProbesPerSecond apart over all stores, so an idle relay costs at most
	// this many queries a second however many stores it has; with more stores each is
	// probed less often (every stores/IdleProbesPerSecond seconds at most), which is how
	// long a row enqueued by another process, on a store that cannot send wake-ups, may
	// wait. Claims after work or a wake-up are not paced. Default
	// [DefaultRelayIdleProbesPerSecond].
	IdleProbesPerSecond float64

	// DownBackoffMax caps the pause between two tries on a store that is down (its
	// claims fail) or misconfigured (its [Store.Check] fails): the pause starts at 100ms
	// and doubles up to this. Default [DefaultRelayDownBackoffMax].
	DownBackoffMax time.Duration
}

// withDefaults returns a copy of o with its zero fields set to their defaults, and the
// relay's own WorkerID and Logger in Publisher. The other Publisher fields keep their zero
// values: each store's publisher applies their defaults itself ([Relay.Add]).
func (o RelayOptions) withDefaults() RelayOptions {
	o.Publisher.Topics = append([]string(nil), o.Publisher.Topics...) // the caller may reuse its slice
	o.MaxInFlight = cmp.Or(o.MaxInFlight, DefaultRelayMaxInFlight)
	o.IdleProbesPerSecond = cmp.Or(o.IdleProbesPerSecond, DefaultRelayIdleProbesPerSecond)
	o.DownBackoffMax = cmp.Or(o.DownBackoffMax, DefaultRelayDownBackoffMax)
	if o.Publisher.WorkerID == "" {
		o.Publisher.WorkerID = uuid.NewString()
	}
	if o.Publisher.Logger == nil {
		o.Publisher.Logger = slog.Default()
	}
	return o
}

// validate checks options whose defaults are applied (withDefaults).
func (o RelayOptions) validate() error {
	if err := o.Publisher.withDefaults().validate(); err != nil {
		return err
	}
	switch {
	case o.MaxInFlight < 0:
		return invalid("MaxInFlight", "must be at least 1, got %d", o.MaxInFlight)
	case o.IdleProbesPerSecond < 0, math.IsNaN(o.IdleProbesPerSecond), math.IsInf(o.IdleProbesPerSecond, 0):
		return invalid("IdleProbesPerSecond", "must be a positive number, got %v", o.IdleProbesPerSecond)
	case o.IdleProbesPerSecond < 0.001 || o.IdleProbesPerSecond > 1e6:
		return invalid("IdleProbesPerSecond", "must be between 0.001 and 1e6, got %v", o.IdleProbesPerSecond)
	case o.DownBackoffMax < 0:
		return invalid("DownBackoffMax", "must not be negative, got %s", o.DownBackoffMax)
	}
	return nil
}

// StoreState is the health of one store of a [Relay], as [Relay.Stats] reports it.
type StoreState string

// States of a relay's store.
const (
	// StoreStarting: added, its first check not answered yet.
	StoreStarting StoreState = "starting"
	// StoreHealthy: its check passed and its last claim succeeded.
	StoreHealthy StoreState = "healthy"
	// StoreDown: its database cannot be reached, or its claims fail; retried with backoff.
	StoreDown StoreState = "down"
	// StoreMisconfigured: its [Store.Check] reports a setup problem ([ErrMisconfigured]);
	// checked again with backoff, so that a migration run meanwhile is picked up.
	StoreMisconfigured StoreState = "misconfigured"
)

// RelayStoreStats are one store's figures in [RelayStats].
type RelayStoreStats struct {
	// PublisherStats are the counters of the store's publisher; Errors also counts its
	// failed checks.
	PublisherStats
	// State is the store's health, since Since; LastError the error that made it down
	// or misconfigured.
	State     StoreState
	Since     time.Time
	LastError string
	// InFlight is the relay slots the store holds: claims under way and batches claimed
	// and not yet settled.
	InFlight int
}

// RelayStats are a [Relay]'s figures, as returned by [Relay.Stats].
type RelayStats struct {
	// Stores holds each current store's figures by name.
	Stores map[string]RelayStoreStats
	// Total sums the counters of every store, including stores since removed.
	Total PublisherStats
	// InFlight is the slots of RelayOptions.MaxInFlight in use; Waiting the claim loops
	// queued for one.
	InFlight, Waiting int
	// IdleProbes counts the idle claims and sweeps admitted by the probe pace.
	IdleProbes int64
}

// Relay delivers the rows of many Stores (a database per tenant or shard, each with its
// outbox table) through one [Transport]. Each store is served by a [Publisher] of its own,
// with all that a Publisher does (pipelined claims, lease renewal, retries, sweeps,
// wake-ups), and the relay schedules their claims:
//
//   - a budget of claims and batches in flight over all stores (MaxInFlight), handed out
//     first come, first served, so that a store with a million pending rows delays a single
//     event of another store by about one batch;
//   - a pace for idle claims and sweeps over all stores (IdleProbesPerSecond), so that idle
//     stores cost a bounded number of queries a second; enqueues on the same [*Store] wake
//     its publisher at once, and on PostgreSQL so do commits anywhere (one listening
//     connection per store: see [Relay.Add]);
//   - per-store health: a store whose database is down, or whose check fails, is logged
//     once, reported in [Relay.Stats], and retried with its own backoff, while the others
//     keep delivering.
//
// Stores are added and removed while the relay runs. Create one with [NewRelay], add stores
// with [Relay.Add] and run it with [Relay.Run].
//
// The API takes names and Stores rather than DSNs: the application opens and closes its
// pools (it knows their sizes, credentials and drivers), and the name is how stats, logs
// and [Relay.Remove] refer to a store.
type Relay struct {
	tr    Transport
	opts  RelayOptions
	log   *slog.Logger
	sched *relaySched
	circ  *circuit // shared by every store's publisher; nil when disabled

	running atomic.Bool
	wg      sync.WaitGroup // the stores' runs

	mu      sync.Mutex
	ctx     context.Context // Run's context while it runs, else nil
	members map[string]*relayMember
	gone    PublisherStats // the counters of removed stores
}

// NewRelay returns a Relay that publishes through tr. Invalid options return a
// [*ValidationError] (matching [ErrInvalid]).
func NewRelay(tr Transport, opts RelayOptions) (*Relay, error) {
	if tr == nil {
		return nil, invalid("transport", "is nil")
	}
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	r := &Relay{
		tr:      tr,
		opts:    opts,
		log:     opts.Publisher.Logger.With("component", "outbox.relay", "worker_id", opts.Publisher.WorkerID),
		sched:   newRelaySched(opts.MaxInFlight, opts.IdleProbesPerSecond),
		members: map[string]*relayMember{},
	}
	// One circuit breaker for the relay: its stores share one transport, so an outage of
	// the destination is one outage, probed by one store at a time, not by every store.
	if co := opts.Publisher.Circuit; !co.Disabled {
		r.circ = newCircuit(co.withDefaults()) // validate checked it
	}
	return r, nil
}

// Add adds store under name (1 to [MaxRelayStoreName] bytes), and starts serving it at
// once when the relay runs. A name already in use returns an error matching
// [ErrStoreExists]. opts, at most one, replaces RelayOptions.Publisher for this store (a
// store in another namespace, a larger batch); its zero Logger and WorkerID take the
// relay's. Invalid options return a [*ValidationError].
//
// Connections: the store's publisher shares its pool with the application, holding one
// connection per claim or settle, except on PostgreSQL with cross-process wake-ups, whose
// listener keeps one connection of the store's pool for as long as the relay runs. A
// relay over many PostgreSQL databases of one server therefore holds one server connection
// per store for listening: keep the server's max_connections in mind, or create those
// Stores with [Options.DisableNotify] and let the probe pace find other processes' rows.
func (r *Relay) Add(name string, store *Store, opts ...PublisherOptions) error {
	if err := checkText("name", name, 1, MaxRelayStoreName); err != nil {
		return err
	}
	if store == nil {
		return invalid("store", "is nil")
	}
	o := r.opts.Publisher
	switch len(opts) {
	case 0:
	case 1:
		o = opts[0]
		if o.WorkerID == "" {
			o.WorkerID = r.opts.Publisher.WorkerID
		}
		if o.Logger == nil {
			o.Logger = r.opts.Publisher.Logger
		}
	default:
		return invalid("opts", "takes at most one PublisherOptions, got %d", len(opts))
	}
	m := &relayMember{name: name, store: store, relay: r}
	m.health.state, m.health.since = StoreStarting, time.Now()
	o.Logger = slog.New(quietHandler{Handler: o.Logger.With("store", name).Handler(), m: m})
	p, err := NewPublisher(store, r.tr, o)
	if err != nil {
		return err
	}
	p.slots = &storeSlots{m: m, s: r.sched}
	p.circ = r.circ
	m.pub = p

	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.members[name]; ok {
		return fmt.Errorf("%w: %q", ErrStoreExists, name)
	}
	r.members[name] = m
	if r.ctx != nil {
		r.start(m)
	}
	return nil
}

// Remove stops serving the store added under name and forgets it; an unknown name returns
// an error matching [ErrUnknownStore]. It waits, as [Publisher.Run] does at shutdown, up to
// the store's ShutdownTimeout for its batches in flight to be published and settled; rows
// still unsettled then keep their lease and are claimed again once it expires, by the
// relay if the store is added again or by any publisher of the table. Nothing is lost.
// Rows that were never claimed stay pending.
func (r *Relay) Remove(name string) error {
	r.mu.Lock()
	m, ok := r.members[name]
	if ok {
		delete(r.members, name)
	}
	cancel, done := m.cancelAndDone()
	r.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownStore, name)
	}
	if cancel != nil {
		cancel()
		<-done
	}
	st := m.stats()
	r.mu.Lock()
	r.gone = addStats(r.gone, st.PublisherStats)
	r.mu.Unlock()
	if m.runErr != nil {
		return m.runErr
	}
	return nil
}

// Run serves every store until ctx is cancelled, then stops them all, each as
// [Publisher.Run] does (waiting up to its ShutdownTimeout for batches in flight), and
// returns once none runs. Stores added meanwhile start at once.
//
// A store is first checked with [Store.Check]. A store whose database cannot be reached,
// or whose check reports a setup problem, is logged once and reported in [Relay.Stats],
// and checked again with backoff (up to DownBackoffMax); so is a store whose claims start
// to fail, until one succeeds. Other stores are not held up by it.
//
// Run returns an error only when a transport call or OnDead hook ignored its cancelled
// context at shutdown (see [Publisher.Run]). A concurrent second call returns
// [ErrRelayRunning]; Run may be called again after it returned.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrRelayRunning
	}
	defer r.running.Store(false)
	r.mu.Lock()
	r.ctx = ctx
	for _, m := range r.members {
		r.start(m)
	}
	n := len(r.members)
	r.mu.Unlock()
	r.log.Info("outbox relay started", "stores", n, "max_in_flight", r.opts.MaxInFlight,
		"idle_probes_per_second", r.opts.IdleProbesPerSecond)

	<-ctx.Done()
	r.mu.Lock()
	r.ctx = nil
	members := make([]*relayMember, 0, len(r.members))
	for _, m := range r.members {
		members = append(members, m)
	}
	r.mu.Unlock()
	r.wg.Wait()
	var errs []error
	for _, m := range members {
		if m.runErr != nil {
			errs = append(errs, fmt.Errorf("store %q: %w", m.name, m.runErr))
		}
	}
	r.log.Info("outbox relay stopped")
	return errors.Join(errs...)
}

// start runs m under r.ctx; r.mu is held.
func (r *Relay) start(m *relayMember) {
	ctx, cancel := context.WithCancel(r.ctx)
	m.cancel, m.done, m.runErr = cancel, make(chan struct{}), nil
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer cancel()
		m.run(ctx)
	}()
}

// Stats returns a snapshot of the relay's figures.
func (r *Relay) Stats() RelayStats {
	r.mu.Lock()
	members := make([]*relayMember, 0, len(r.members))
	for _, m := range r.members {
		members = append(members, m)
	}
	st := RelayStats{Stores: make(map[string]RelayStoreStats, len(members)), Total: r.gone}
	r.mu.Unlock()
	for _, m := range members {
		ms := m.stats()
		st.Stores[m.name] = ms
		st.Total = addStats(st.Total, ms.PublisherStats)
	}
	// The circuit is the relay's, shared by every store: its state is the relay's too.
	st.Total.CircuitOpen, st.Total.CircuitOpenedAt = r.circ.snapshot()
	st.InFlight, st.Waiting = r.sched.usage(r.opts.MaxInFlight)
	st.IdleProbes = r.sched.probes.Load()
	return st
}

func addStats(a, b PublisherStats) PublisherStats {
	return PublisherStats{
		Claimed:   a.Claimed + b.Claimed,
		Delivered: a.Delivered + b.Delivered,
		Retried:   a.Retried + b.Retried,
		Dead:      a.Dead + b.Dead,
		LeaseLost: a.LeaseLost + b.LeaseLost,
		Errors:    a.Errors + b.Errors,
		// Unavailable outcomes, and the openings of the relay's circuit each counted by the
		// store whose batch opened it.
		Unavailable:  a.Unavailable + b.Unavailable,
		CircuitOpens: a.CircuitOpens + b.CircuitOpens,
	}
}

// relayMember is one store of a relay and its publisher.
type relayMember struct {
	name  string
	store *Store
	pub   *Publisher
	relay *Relay

	// Set by Relay.start under the relay's mutex.
	cancel context.CancelFunc
	done   chan struct{}
	runErr error // what the last run returned; read after done

	inFlight  atomic.Int64
	checkErrs atomic.Int64
	health    storeHealth
}

// cancelAndDone returns m's cancel function and done channel, nil when m is nil or not
// running; the relay's mutex is held.
func (m *relayMember) cancelAndDone() (context.CancelFunc, chan struct{}) {
	if m == nil {
		return nil, nil
	}
	return m.cancel, m.done
}

// run checks the store and runs its publisher until ctx ends, checking again with backoff
// while the database is down or misconfigured.
func (m *relayMember) run(ctx context.Context) {
	defer close(m.done)
	for ctx.Err() == nil {
		err := m.store.Check(ctx)
		if err == nil || errors.Is(err, errors.ErrUnsupported) {
			err = m.pub.Run(ctx)
			if err == nil || !errors.Is(err, ErrMisconfigured) {
				m.runErr = err // nil, or calls abandoned at shutdown
				return
			}
		}
		if ctx.Err() != nil {
			return
		}
		m.checkErrs.Add(1)
		state := StoreDown
		if errors.Is(err, ErrMisconfigured) {
			state = StoreMisconfigured
		}
		m.failed(state, err)
		if !sleep(ctx, m.health.retryIn()) {
			return
		}
	}
}

func (m *relayMember) stats() RelayStoreStats {
	ps := m.pub.Stats()
	ps.Errors += m.checkErrs.Load()
	state, since, lastErr := m.health.snapshot()
	return RelayStoreStats{PublisherStats: ps, State: state, Since: since, LastError: lastErr, InFlight: int(m.inFlight.Load())}
}

// failed records a failed check or claim: the first of a run of failures is logged, and
// each one doubles the pause before the next try.
func (m *relayMember) failed(state StoreState, err error) {
	if m.health.fail(state, err, m.relay.opts.DownBackoffMax) {
		m.relay.log.Warn("outbox relay: store "+string(state)+"; retrying with backoff, other stores are not affected",
			"store", m.name, "err", err, "retry_in", m.health.retryIn())
	}
}

// healthy records a successful claim, and logs the recovery of a store that was down.
func (m *relayMember) healthy() {
	if was, ok := m.health.ok(); ok {
		m.relay.log.Info("outbox relay: store back", "store", m.name, "was", string(was))
	}
}

// storeHealth is a store's state and, while it fails, its backoff.
type storeHealth struct {
	mu      sync.Mutex
	state   StoreState
	since   time.Time
	lastErr string
	backoff time.Duration
	retryAt time.Time
	down    atomic.Bool // state is down or misconfigured; read without the mutex
}

// firstBackoff is the first pause before trying a failing store again.
const firstBackoff = 100 * time.Millisecond

// fail records a failure and reports whether it changed the state (to be logged).
func (h *storeHealth) fail(state StoreState, err error, ceiling time.Duration) (changed bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	changed = h.state != state
	if changed {
		h.state, h.since = state, time.Now()
	}
	h.lastErr = err.Error()
	if h.backoff == 0 {
		h.backoff = min(firstBackoff, ceiling)
	} else {
		h.backoff = min(h.backoff*2, ceiling)
	}
	h.retryAt = time.Now().Add(h.backoff)
	h.down.Store(true)
	return changed
}

// ok records a success and returns the state it ends, and whether that was a failure.
func (h *storeHealth) ok() (was StoreState, recovered bool) {
	if !h.down.Load() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.state == StoreStarting {
			h.state, h.since = StoreHealthy, time.Now()
		}
		return h.state, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	was = h.state
	h.state, h.since, h.lastErr, h.backoff, h.retryAt = StoreHealthy, time.Now(), "", 0, time.Time{}
	h.down.Store(false)
	return was, true
}

// retryIn returns how long a failing store still waits before its next try.
func (h *storeHealth) retryIn() time.Duration {
	if !h.down.Load() {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return time.Until(h.retryAt)
}

func (h *storeHealth) snapshot() (StoreState, time.Time, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state, h.since, h.lastErr
}

// quietHandler passes a store's publisher's log lines on, except the per-retry lines of a
// failing database while the relay reports the store down: the relay logs the failure
// once, and Stats counts the rest.
type quietHandler struct {
	slog.Handler
	m *relayMember
}

func (h quietHandler) Handle(ctx context.Context, rec slog.Record) error {
	if (rec.Message == msgClaimFailed || rec.Message == msgListenerLost) && h.m.health.down.Load() {
		return nil
	}
	return h.Handler.Handle(ctx, rec)
}

func (h quietHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return quietHandler{Handler: h.Handler.WithAttrs(attrs), m: h.m}
}

func (h quietHandler) WithGroup(name string) slog.Handler {
	return quietHandler{Handler: h.Handler.WithGroup(name), m: h.m}
}
