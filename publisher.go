package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// Defaults of [PublisherOptions].
const (
	DefaultBatchSize       = 100
	DefaultPollInterval    = 200 * time.Millisecond // it bounds latency when idle
	DefaultIdleBackoffMax  = time.Second            // idle pause while a listener brings wake-ups
	DefaultLease           = 30 * time.Second
	DefaultShutdownTimeout = 10 * time.Second
	DefaultSweepInterval   = time.Minute
	DefaultPublishTimeout  = time.Minute
)

// MinLease is the shortest lease a [Publisher] accepts: its renewal runs every Lease/3.
const MinLease = 3 * time.Millisecond

var (
	// ErrPublisherRunning is returned by [Publisher.Run] when the same Publisher is already
	// running. Start more claim loops with [PublisherOptions.Concurrency], or more
	// Publishers, instead.
	ErrPublisherRunning = errors.New("outbox: publisher is already running")

	// ErrPublishTimeout marks the messages of a batch whose [Transport.Publish] call ran
	// past [PublisherOptions.PublishTimeout]: its context was cancelled and the messages it
	// did not report delivered are retried.
	ErrPublishTimeout = errors.New("outbox: publish timed out")

	// ErrAttemptLimit marks a message dead-lettered because it used all the attempts of its
	// [RetryPolicy]. [DeadLetter.Err] matches it, and also the last transport error when the
	// publisher saw one.
	ErrAttemptLimit = errors.New("outbox: attempt limit reached")
)

// Internal timings that are not worth an option.
const (
	// settleAttempts is how often the publisher tries to settle a batch's outcomes before
	// leaving the rows to their lease (they are then redelivered: at least once).
	settleAttempts = 4
	// settleRetryDelay is the first pause between those tries; it doubles.
	settleRetryDelay = 50 * time.Millisecond
	// abandonAfter is how long a publish may outlive its context, cancelled at the shutdown
	// deadline, before Run stops waiting for it.
	abandonAfter = time.Second
	// maxLoggedIDs bounds the ids written in one log line.
	maxLoggedIDs = 20
)

// PublisherOptions configure a [Publisher]. Zero fields take the documented defaults;
// [NewPublisher] refuses inconsistent settings with a [*ValidationError].
type PublisherOptions struct {
	// Scope is what the publisher serves. Namespace is required, so that a publisher never
	// takes another module's events from a shared table; Topics (any of them) and TenantID
	// narrow it further when set.
	Scope

	// BatchSize is the most rows one claim takes and one Complete settles, 1..[MaxBatch].
	// Default [DefaultBatchSize].
	BatchSize int

	// PollInterval is the pause after a claim that found less than a full batch, and the
	// first pause when idle. It must not exceed Lease/3. Default [DefaultPollInterval], or
	// Lease/3 when that is shorter.
	//
	// While nothing wakes the publisher for rows that other processes commit (MySQL and
	// SQLite, or PostgreSQL while its listener is away), a partial batch is followed by a
	// pause of 10ms instead (or PollInterval, when shorter), doubling while claims come back
	// empty: rows that keep coming from another process are claimed within about 10ms, at
	// one claim per batch found, and an idle publisher still polls every PollInterval.
	PollInterval time.Duration

	// IdleBackoffMax caps the idle pause: while claims come back empty the pause doubles
	// from PollInterval up to this ceiling, and any work or wake-up resets it. It also caps
	// the pause after database errors. At least PollInterval.
	//
	// The default depends on what wakes the publisher. Enqueues in the same process (on
	// the same pool and table) always wake it, and so do enqueues anywhere while the
	// listener is connected ([dialect.Notifier]: PostgreSQL's LISTEN/NOTIFY with the pgx
	// driver, SQLite's and MySQL's listeners, which watch for committed rows). Then polling
	// is a safety net (for a PostgreSQL signal folded into an earlier one, a Store signals
	// at most every 50ms, or a row committed long after its enqueue) and the default is
	// [DefaultIdleBackoffMax]; otherwise (no listener: DisableNotify, a pool of one
	// connection, a driver that cannot listen, a Relay's SQLite and MySQL stores) polling
	// is how rows enqueued by other processes are found, and the default is PollInterval,
	// so that they wait at most that long. Rows put back for a retry are claimed when they
	// fall due either way. An empty claim reads a few index entries, however many rows
	// are delayed or waiting for a retry (an ordered claim walks further).
	IdleBackoffMax time.Duration

	// Lease is how long a claim reserves its rows. While a publish is in flight the
	// publisher renews the leases every Lease/3; a worker that dies leaves its rows to be
	// reclaimed once the lease expires. At least [MinLease]. Default [DefaultLease].
	Lease time.Duration

	// Retry decides the delay before a failed message is tried again and the attempt limit
	// after which it is dead-lettered. Zero fields take the values of [DefaultRetryPolicy].
	Retry RetryPolicy

	// WorkerID is written to locked_by on the rows this publisher claims (1..128 bytes).
	// Default: a random UUID. Every claim loop of the publisher uses it; lease tokens, not
	// worker ids, keep claims apart.
	WorkerID string

	// Concurrency is the number of claim loops, each claiming, publishing and settling its
	// own batches. Default 1.
	//
	// Any pool size works with any Concurrency: a loop holds one connection of the Store's
	// pool during a claim or a settle and none while its batch is in the transport, and never
	// waits for a second while it holds one, so loops (and the sweeper, retention and your
	// application) queue for the pool's connections instead of deadlocking on them; more
	// loops than connections still publish in parallel. All publishers of one pool and table
	// in the process share one wake-up listener, which keeps one connection while any of
	// them runs; it never takes the pool's last connection (on db.SetMaxOpenConns(1) the
	// publishers poll, and one warning says so). A claim or settle that waits more than 5 s
	// logs one warning with the pool's counters and the connections the listeners hold.
	Concurrency int

	// PublishTimeout bounds one [Transport.Publish] call. When it passes, the call's context
	// is cancelled, a warning names the batch, and every message the transport did not
	// report delivered is retried under the [RetryPolicy] (the error matches
	// [ErrPublishTimeout]). A transport that ignores the cancellation is abandoned one
	// second later and logged as an error. Without it, a broker that hangs would keep its
	// batch's leases renewed forever. Default [DefaultPublishTimeout].
	PublishTimeout time.Duration

	// ShutdownTimeout is how long [Publisher.Run] waits, once its context is cancelled, for
	// in-flight publishes and their settlement. When it passes, the transport's context is
	// cancelled and rows not yet settled keep their lease until it expires. Default
	// [DefaultShutdownTimeout].
	ShutdownTimeout time.Duration

	// SweepInterval is how often the publisher dead-letters rows that reached the attempt
	// limit and whose worker crashed during the last attempt, with [Store.BuryExpired]. The
	// first sweep comes one SweepInterval after start, not at start, so that a backlog
	// waiting for a restarted publisher is delivered first. The first sweep, repeated until
	// one succeeds, and then every 60th use [Store.Bury], which also buries pending rows at
	// the limit (they appear when the limit is lowered, for example by a rolling deploy) but
	// walks the whole pending backlog. Default [DefaultSweepInterval].
	SweepInterval time.Duration

	// Retention, when set, makes the publisher delete old delivered and dead rows as it
	// runs. Off by default; see [Retention] for why, and [DefaultRetention].
	Retention Retention

	// Logger receives the publisher's log lines. They carry message ids and errors, never
	// payloads. Failed deliveries are logged at Warn and dead letters at Error, each as one
	// line per batch (the count, the first message's id, topic, attempt, error and next
	// attempt time, and up to 20 ids), so a failing broker shows at the default level
	// without a line per message. Database errors are logged at Error once per retry,
	// which backs off. Default [slog.Default], so that outages are not silent; pass
	// slog.New(slog.DiscardHandler) to turn logging off.
	Logger *slog.Logger

	// Circuit configures the circuit breaker that stops claiming while the destination is
	// down: after a batch whose every message failed [Unavailable], the publisher claims
	// one message per probe interval (1 s doubling to 30 s) until one gets through, then
	// drains the backlog at full speed. The defaults need no tuning; see [CircuitOptions].
	Circuit CircuitOptions

	// OnDead, when set, is called once for every message this publisher dead-letters: a
	// [Permanent] error, the attempt limit, a failed integrity check, or a row buried by the
	// sweep. It runs on a claim loop's goroutine after the row is recorded as dead, so it
	// should be quick (alert, count, enqueue a ticket). The row stays in the table, readable
	// with [Store.Get]. A panic in OnDead is recovered and logged.
	OnDead func(ctx context.Context, dl DeadLetter)

	// Observer, when set, watches every publish and every recorded outcome (and, when it
	// implements them, claims and the circuit breaker's changes), for telemetry. Default
	// none. See [PublisherObserver].
	Observer PublisherObserver

	// Ordered delivers the events of each namespace and partition key one at a time, in
	// enqueue order ((created_at, id) at insert), across every publisher of the table and
	// through retries: a row is claimed only when every earlier row of its key was
	// delivered, so a row waiting for its retry holds back the rows after it. Events without
	// a partition key are not held back. Head of line: a row of the key that went dead holds
	// the key back too, until an operator replays or discards it ([Store.BlockedKeys] lists
	// such keys); set OrderedSkipDead to pass over dead rows instead. Every publisher that
	// serves the same rows must set it alike: an unordered publisher ignores the order.
	// With a transport that keeps key order ([TransportKeyOrder]), a claim takes a key's
	// waiting rows together, in sequence, up to BatchSize ([ClaimOptions.Runs]), and when
	// one of them is not delivered the ones after it in the batch go back to pending
	// without spending an attempt, to follow it; with any other transport a batch holds at
	// most one row per key.
	// An ordered publisher settles a full batch's outcomes with its next claim, which it makes
	// only once the batch is published, not during its publish (see [Publisher.Run]).
	// It needs a dialect that implements [dialect.OrderedClaimer]; [NewPublisher] refuses another
	// dialect with an error matching [errors.ErrUnsupported]. It also needs the table's
	// order index, which the ordered migration set creates: it is opt in because it costs
	// every table that has it (migrations.Options.Ordered, `outbox migrate up --ordered`).
	// [Publisher.Run] checks for it at start and returns a [*CheckError] without it. See
	// docs/ordering.md for what the order means and costs.
	Ordered bool

	// OrderedSkipDead, with Ordered, stops a dead row from holding back the rows of its key
	// that follow it; they are delivered as if it had been delivered. A dead row that is
	// replayed later is then delivered after them, out of order.
	OrderedSkipDead bool
}

// withDefaults returns a copy of o with every zero field set to its default, except
// IdleBackoffMax, whose default depends on whether wake-ups come from other processes while
// the publisher runs (see idleCap); the copy owns its Topics.
func (o PublisherOptions) withDefaults() PublisherOptions {
	o.Topics = append([]string(nil), o.Topics...) // the caller may reuse its slice
	o.BatchSize = cmp.Or(o.BatchSize, DefaultBatchSize)
	o.Lease = cmp.Or(o.Lease, DefaultLease)
	o.PollInterval = cmp.Or(o.PollInterval, min(DefaultPollInterval, o.Lease/3))
	o.Retry = o.Retry.withDefaults()
	if o.WorkerID == "" {
		o.WorkerID = uuid.NewString()
	}
	o.Concurrency = cmp.Or(o.Concurrency, 1)
	o.PublishTimeout = cmp.Or(o.PublishTimeout, DefaultPublishTimeout)
	o.ShutdownTimeout = cmp.Or(o.ShutdownTimeout, DefaultShutdownTimeout)
	o.SweepInterval = cmp.Or(o.SweepInterval, DefaultSweepInterval)
	o.Retention = o.Retention.withDefaults()
	o.Circuit = o.Circuit.withDefaults()
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// validate checks options whose defaults are applied (withDefaults).
func (o PublisherOptions) validate() error {
	if err := checkText("Namespace", o.Namespace, 1, MaxNamespaceBytes); err != nil {
		return err
	}
	if err := validateScope(o.Scope); err != nil {
		return err
	}
	switch {
	case o.BatchSize < 1 || o.BatchSize > MaxBatch:
		return invalid("BatchSize", "must be between 1 and %d, got %d", MaxBatch, o.BatchSize)
	case o.Lease < MinLease:
		return invalid("Lease", "must be at least %s, got %s", MinLease, o.Lease)
	case o.PollInterval < 0:
		return invalid("PollInterval", "must be positive, got %s", o.PollInterval)
	case o.PollInterval > o.Lease/3:
		return invalid("PollInterval", "must be at most Lease/3 (%s), got %s", o.Lease/3, o.PollInterval)
	case o.IdleBackoffMax != 0 && o.IdleBackoffMax < o.PollInterval:
		return invalid("IdleBackoffMax", "must be at least PollInterval (%s), got %s", o.PollInterval, o.IdleBackoffMax)
	}
	if err := o.Retry.validate(); err != nil {
		return err
	}
	if err := checkText("WorkerID", o.WorkerID, 1, MaxWorkerIDBytes); err != nil {
		return err
	}
	switch {
	case o.Concurrency < 1:
		return invalid("Concurrency", "must be at least 1, got %d", o.Concurrency)
	case o.PublishTimeout < 0:
		return invalid("PublishTimeout", "must not be negative, got %s", o.PublishTimeout)
	case o.ShutdownTimeout < 0:
		return invalid("ShutdownTimeout", "must not be negative, got %s", o.ShutdownTimeout)
	case o.SweepInterval < 0:
		return invalid("SweepInterval", "must not be negative, got %s", o.SweepInterval)
	}
	if err := o.Retention.validate(); err != nil {
		return err
	}
	if err := o.Circuit.validate(); err != nil {
		return err
	}
	if o.OrderedSkipDead && !o.Ordered {
		return invalid("OrderedSkipDead", "applies to ordered publishers only; set Ordered too")
	}
	return nil
}

// backoffMax caps the pause after database errors: IdleBackoffMax, or PollInterval when
// it is left to its default.
func (o PublisherOptions) backoffMax() time.Duration {
	return cmp.Or(o.IdleBackoffMax, o.PollInterval)
}

// DeadLetter describes a message that a [Publisher] moved to dead, as passed to
// [PublisherOptions.OnDead]. The row stays in the table.
type DeadLetter struct {
	// Delivery is the message as it was claimed (Attempt is the attempts made). For a row
	// buried by the sweep it is read back after the fact, and holds only the ID if that
	// read failed.
	Delivery
	// Reason is what was recorded in the row's last_error.
	Reason string
	// Err is the cause: the transport's error (matching [IsPermanent] when it was marked
	// so), [ErrIntegrity] for a payload that failed its hash check, or an error matching
	// [ErrAttemptLimit] (and the last transport error, when known) for an exhausted row.
	Err error
}

// PublisherStats are a [Publisher]'s counters since it was created, as returned by
// [Publisher.Stats]. Each message outcome is counted once, when it is recorded in the table.
type PublisherStats struct {
	// Claimed counts rows claimed, redeliveries included.
	Claimed int64
	// Delivered counts rows acked as delivered.
	Delivered int64
	// Retried counts failed attempts rescheduled for another try.
	Retried int64
	// Unavailable counts deliveries that failed because the destination could not be
	// reached ([Unavailable]): rescheduled with their attempt given back, not counted in
	// Retried.
	Unavailable int64
	// Dead counts rows this publisher dead-lettered, by outcome or by sweep.
	Dead int64
	// LeaseLost counts rows whose lease another worker took over before this one could
	// renew it or record its outcome (see [ErrLeaseLost]).
	LeaseLost int64
	// Errors counts operational failures: database errors, transport panics and malformed
	// transport results, hook panics, and publishes abandoned at shutdown. Failed
	// deliveries are not errors here; they are Retried, Unavailable or Dead.
	Errors int64
	// CircuitOpen is true while the circuit breaker keeps the running publisher from
	// claiming because the destination is down (open or half-open; see [CircuitOptions]).
	CircuitOpen bool
	// CircuitOpenedAt is when the circuit last opened, while it is open; zero otherwise.
	CircuitOpenedAt time.Time
	// CircuitOpens counts the times the circuit opened.
	CircuitOpens int64
	// Listener is the state of the wake-up listener the running publisher relies on for
	// rows committed by other processes (see [ListenerState]).
	Listener ListenerState
}

// ListenerState is the state of a running publisher's wake-up listener, in
// [PublisherStats.Listener].
type ListenerState string

// States of a publisher's wake-up listener.
const (
	// ListenerNone: the publisher runs no listener, and polls by design: it is not running,
	// the store has no [dialect.Notifier] or sets DisableNotify, the driver cannot listen,
	// or the pool cannot spare the listener a connection (each of the last two is logged
	// once as a warning).
	ListenerNone ListenerState = ""
	// ListenerConnected: the listener is connected; rows committed anywhere wake the
	// publisher at once.
	ListenerConnected ListenerState = "connected"
	// ListenerDown: the listener is wanted and not connected (starting, or reconnecting
	// after a failure, which is logged as a warning); the publisher polls meanwhile, so
	// rows committed elsewhere wait up to IdleBackoffMax.
	ListenerDown ListenerState = "down"
)

// Publisher is the background worker that delivers committed outbox rows through a
// [Transport]: it claims batches from a [Store], checks each payload against its hash,
// publishes, and settles every outcome of a batch at once: delivered, rescheduled under its
// [RetryPolicy], or dead. Leases of in-flight batches are renewed, rows
// that exhausted their attempts are swept to dead, and database errors are logged and
// retried with backoff. Delivery is at least once.
//
// Create one with [NewPublisher] and start it with [Publisher.Run]. Any number of publishers,
// in one process or many, may serve the same table.
type Publisher struct {
	store   *Store
	tr      Transport
	opts    PublisherOptions
	log     *slog.Logger
	running atomic.Bool
	current atomic.Pointer[run] // the running Run's state, for Wake
	obs     *observer           // nil without PublisherOptions.Observer

	claimed, delivered, retried, dead, leaseLost, errs atomic.Int64
	unavailable, circuitOpens                          atomic.Int64

	// runs: the publisher is ordered and its transport keeps key order, so it claims each
	// key's waiting rows together ([ClaimOptions.Runs]).
	runs bool

	// slots, when set, schedule this publisher's claims among the stores of a [Relay]
	// (relay_slots.go); nil for a publisher of its own.
	slots *storeSlots
	// circ, when set, is a [Relay]'s circuit breaker, shared by all its stores; a publisher
	// of its own makes its own in Run.
	circ *circuit
}

// NewPublisher returns a Publisher that claims from store and publishes through tr. Invalid
// options return a [*ValidationError] (matching [ErrInvalid]).
func NewPublisher(store *Store, tr Transport, opts PublisherOptions) (*Publisher, error) {
	if store == nil {
		return nil, invalid("store", "is nil")
	}
	if tr == nil {
		return nil, invalid("transport", "is nil")
	}
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if err := opts.Retention.check(store); err != nil {
		return nil, err
	}
	if opts.Ordered {
		if _, err := store.orderedClaimer(); err != nil {
			return nil, err
		}
	}
	ko, keepsOrder := tr.(TransportKeyOrder)
	return &Publisher{
		store: store,
		tr:    tr,
		opts:  opts,
		runs:  opts.Ordered && keepsOrder && ko.KeepsKeyOrder(),
		obs:   newObserver(opts.Observer),
		log:   opts.Logger.With("component", "outbox.publisher", "worker_id", opts.WorkerID, "namespace", opts.Namespace),
	}, nil
}

// WorkerID returns the id this publisher writes to locked_by.
func (p *Publisher) WorkerID() string { return p.opts.WorkerID }

// Stats returns a snapshot of the publisher's counters.
func (p *Publisher) Stats() PublisherStats {
	st := PublisherStats{
		Claimed:      p.claimed.Load(),
		Delivered:    p.delivered.Load(),
		Retried:      p.retried.Load(),
		Unavailable:  p.unavailable.Load(),
		Dead:         p.dead.Load(),
		LeaseLost:    p.leaseLost.Load(),
		Errors:       p.errs.Load(),
		CircuitOpens: p.circuitOpens.Load(),
	}
	if r := p.current.Load(); r != nil {
		st.CircuitOpen, st.CircuitOpenedAt = r.circ.snapshot()
		st.Listener = r.hub.state()
	}
	return st
}

// Wake makes the running publisher claim now instead of at its next poll, and chase rows
// that are about to commit with a few quick claims. Enqueues on the publisher's [Store] do
// this by themselves, and so, on PostgreSQL, does a commit anywhere; call Wake when
// another signal of yours says new rows are committed (a message bus, a webhook). It never
// blocks, and does nothing when the publisher is not running.
func (p *Publisher) Wake() {
	if r := p.current.Load(); r != nil {
		r.wakeAll()
	}
}

// Run publishes until ctx is cancelled, then shuts down and returns nil.
//
// It first runs [Store.Check] and, with [PublisherOptions.Ordered], checks that the table
// has the order index of the ordered migration set. A setup problem (the table missing, the
// wrong dialect, SQLite without WAL, an ordered publisher without the order index) is
// returned at once as a [*CheckError]; a database that cannot be reached is waited for, with
// a warning and backoff, as are outages later on.
//
// It starts [PublisherOptions.Concurrency] claim loops and a sweeper. A claim loop claims a
// batch, dead-letters rows whose payload fails its hash check, publishes the rest while
// renewing their leases every Lease/3, and settles all outcomes in one statement. After a
// full batch it settles them together with the next claim, in one transaction
// ([Store.CompleteAndClaim], where the dialect is a [dialect.SettleClaimer]: every built-in one), so
// that a backlog drains at one commit per batch, and claims that batch while the full one
// is in the transport when the transport takes long enough for the overlap to pay (not
// ordered publishers); after a partial batch it settles them
// alone ([Store.Complete]) and waits PollInterval;
// while claims come back empty it waits longer each time, up to IdleBackoffMax. Database
// errors are logged, counted and retried after a backoff; they never stop Run.
//
// Shutdown: when ctx is cancelled Run stops claiming and waits up to ShutdownTimeout for
// in-flight batches to be published and settled. The transport's context is not cancelled
// with ctx, only when that deadline passes; rows still unsettled then keep their lease and
// are reclaimed by a publisher after it expires. Run returns once every goroutine it started
// has returned, with one exception: a transport call or OnDead hook that ignores its
// cancelled context is abandoned after a further second (its goroutine is left to finish on
// its own), and Run then reports an error.
//
// Run may be called again after it returned; a concurrent second call returns
// [ErrPublisherRunning].
func (p *Publisher) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return ErrPublisherRunning
	}
	defer p.running.Store(false)
	if err := p.awaitReady(ctx); err != nil {
		return err
	}

	work, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	r := &run{p: p, ctx: ctx, work: work, wakers: make([]waker, p.opts.Concurrency)}
	switch {
	case p.circ != nil:
		r.circ = p.circ
	case !p.opts.Circuit.Disabled:
		r.circ = newCircuit(p.opts.Circuit)
	}
	for i := range r.wakers {
		r.wakers[i] = newWaker()
	}
	sub := &wakeSub{namespace: p.opts.Namespace, wake: r.wakeAll, log: p.log}
	if p.listens() {
		sub.notifier, sub.listenDB = p.store.notifier, p.store.listenDB
	}
	hub, unsubscribe := subscribe(p.store.db, p.store.table, sub)
	r.hub = hub
	defer unsubscribe()
	p.current.Store(r) // once r.hub is set, which Stats reads
	defer p.current.Store(nil)

	var wg sync.WaitGroup
	for _, w := range r.wakers {
		wg.Go(func() { r.claimLoop(w) })
	}
	wg.Go(r.sweepLoop)
	wg.Go(r.retentionLoop)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	p.log.Info("outbox publisher started", "concurrency", p.opts.Concurrency, "batch_size", p.opts.BatchSize, "lease", p.opts.Lease)
	<-ctx.Done()
	deadline := time.NewTimer(p.opts.ShutdownTimeout)
	defer deadline.Stop()
	select {
	case <-done:
	case <-deadline.C:
		p.log.Warn("outbox publisher: shutdown deadline passed, cancelling in-flight publishes", "shutdown_timeout", p.opts.ShutdownTimeout)
		stopWork()
		<-done
	}
	if n := r.abandoned.Load(); n > 0 {
		return fmt.Errorf("outbox: publisher: %d transport or OnDead call(s) ignored their cancelled context and were abandoned", n)
	}
	p.log.Info("outbox publisher stopped")
	return nil
}

// awaitReady runs [Store.Check], and for an ordered publisher the check of the order index
// ([dialect.OrderedClaimer.CheckOrdered]), until they pass, and returns their error when they find
// a setup problem (a [*CheckError]): a missing table, the wrong dialect or a missing order
// index will not mend itself, and a publisher that claimed regardless would only log failed
// claims forever. A database that cannot be reached is waited for, with backoff, until ctx
// ends. A dialect that cannot check is not held against the publisher.
func (p *Publisher) awaitReady(ctx context.Context) error {
	delay := p.opts.PollInterval
	for {
		err := p.store.Check(ctx)
		if (err == nil || errors.Is(err, errors.ErrUnsupported)) && p.opts.Ordered {
			oc, oerr := p.store.orderedClaimer() // NewPublisher made sure there is one
			if oerr == nil {
				oerr = p.store.checkOrdered(ctx, oc)
			}
			if oerr != nil {
				err = oerr
			}
		}
		switch {
		case err == nil, errors.Is(err, errors.ErrUnsupported), ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrMisconfigured):
			return err // not logged as well: the caller prints it, and it would show twice
		}
		p.errs.Add(1)
		p.log.Warn("outbox publisher: database not reachable at start; retrying", "err", err, "retry_in", delay)
		if !sleep(ctx, delay) {
			return nil
		}
		delay = min(delay*2, p.opts.backoffMax())
	}
}

// run is the state of one call of Run.
type run struct {
	p *Publisher
	// ctx is Run's context: when it is done, no new work starts.
	ctx context.Context
	// work carries the database calls and publishes of work already started; it is
	// cancelled only at the shutdown deadline.
	work      context.Context
	abandoned atomic.Int64
	// wakers wake the claim loops, one each.
	wakers []waker
	// hub brings wake-ups from the store's enqueues and its listener.
	hub *wakeHub
	// slow is true from the warning about a slow claim until a claim returns in time.
	slow atomic.Bool
	// circ is the circuit breaker shared by the claim loops; nil when disabled.
	circ *circuit
	// refused remembers the messages refused while their destination answered
	// (chargeUnavailable).
	refused refusedSet
}

func (r *run) wakeAll() {
	for _, w := range r.wakers {
		w.wake()
	}
}

// idleCap is the longest idle pause: IdleBackoffMax, or, left to its default, one that
// depends on whether a listener brings wake-ups from other processes (see
// PublisherOptions.IdleBackoffMax).
func (r *run) idleCap() time.Duration {
	o := r.p.opts
	if o.IdleBackoffMax == 0 && r.hub.listening.Load() {
		return max(DefaultIdleBackoffMax, o.PollInterval)
	}
	return o.backoffMax()
}

// listens reports whether Run keeps a listener: when the store has a Notifier, except in a
// Relay for one that polls the database (sqlkit.PollingListener), whose idle queries the
// relay's probe pace bounds instead.
func (p *Publisher) listens() bool {
	if p.store.notifier == nil {
		return false
	}
	_, polls := p.store.notifier.(sqlkit.PollingListener)
	return p.slots == nil || !polls
}

// sleep waits d or until ctx is done, and reports whether the full wait elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Log messages that a Relay keeps quiet while it reports the store down (relay.go).
const (
	msgClaimFailed  = "outbox publisher: claim failed"
	msgListenerLost = "outbox publisher: wake-up listener stopped; polling until it is back"
	msgListenerBack = "outbox publisher: wake-up listener is back"
)

// slowCall is how long a claim or the settling of outcomes may take before the publisher
// warns that it waits, for a connection of the pool or for locks.
const slowCall = 5 * time.Second

// watch watches one database call of a claim loop (what: "a claim", ...) and returns the
// function that ends the watch. A call still running after slowCall logs one warning with
// the pool's counters, so that a publisher that waits for a connection, or for a lock some
// other transaction holds, is never silent; further slow calls stay quiet until one returns
// in time again, which is logged once at Info.
func (r *run) watch(what string) (done func()) {
	began := time.Now()
	timer := time.AfterFunc(slowCall, func() {
		if !r.slow.CompareAndSwap(false, true) {
			return
		}
		st := r.p.store.db.Stats()
		held := heldConns(r.p.store.db)
		msg := "outbox publisher: " + what + " has waited " + slowCall.String() + " for the database"
		if st.MaxOpenConnections > 0 && st.InUse >= st.MaxOpenConnections {
			msg += fmt.Sprintf("; every connection of the pool is in use (%d of db.SetMaxOpenConns(%d)): "+
				"the library's wake-up listeners hold %d, the other %d are in use by the application's transactions "+
				"and the publishers' claims and settles (Concurrency %d each, one connection at a time a loop); "+
				"look for transactions that stay open, or allow the pool more connections",
				st.InUse, st.MaxOpenConnections, held, st.InUse-held, r.p.opts.Concurrency)
		} else {
			msg += "; the pool has connections to spare, so it waits for locks or for a slow server"
		}
		r.p.log.Warn(msg, "pool_max_open", st.MaxOpenConnections, "pool_open", st.OpenConnections,
			"pool_in_use", st.InUse, "pool_held_by_listeners", held, "pool_idle", st.Idle,
			"pool_wait_count", st.WaitCount, "pool_wait_duration", st.WaitDuration)
	})
	return func() {
		if timer.Stop() && r.slow.CompareAndSwap(true, false) {
			r.p.log.Info("outbox publisher: the database answers in time again", "took", time.Since(began))
		}
	}
}

// awaitPublish waits for a batch's publish and returns its outcomes, renewing meanwhile the
// leases of ahead, the batch claimed during it, marking those it lost in lost, and those of
// carry, a batch published before whose outcomes wait to be settled with this one's.
func (r *run) awaitPublish(published <-chan *outcomes, ahead []Record, lost map[uuid.UUID]bool, carry *outcomes) *outcomes {
	if len(ahead) == 0 && carry == nil {
		return <-published
	}
	held := make([]Lease, 0, len(ahead))
	for i := range ahead {
		if !lost[ahead[i].ID] { // found lost by a late claim's renewal
			held = append(held, ahead[i].Lease())
		}
	}
	var carried []Lease
	if carry != nil {
		for _, it := range carry.items {
			if !carry.lost[it.out.ID] {
				carried = append(carried, it.out.Lease)
			}
		}
	}
	renew := time.NewTimer(r.p.opts.Lease / 3)
	defer renew.Stop()
	for {
		select {
		case out := <-published:
			return out
		case <-renew.C:
			var next, nextCarried time.Duration
			held, next = r.extend(held, lost)
			if carry != nil {
				carried, nextCarried = r.extend(carried, carry.lost)
				next = min(next, nextCarried)
			}
			renew.Reset(next)
		}
	}
}

// outcomes are the fates of one published batch, waiting to be settled.
type outcomes struct {
	items []settlement
	// lost marks the rows whose lease was lost while the batch was published.
	lost map[uuid.UUID]bool
	// published counts the messages handed to the transport, unavailable those of them
	// that failed [Unavailable], and unavailableErr is the first such error: what the
	// circuit breaker judges the batch by.
	published, unavailable int
	unavailableErr         error
	began                  time.Time     // when the publish began
	took                   time.Duration // how long the transport took
	// partly is set when some messages of a batch, not all, failed [Unavailable] (for two
	// batches settled together, of either one; their sums no longer tell).
	partly bool
	// sent is set once a settle of these outcomes failed in a way that may still have
	// applied it (the transaction committed, its reply was lost): a lost lease is then
	// checked against what this publisher sent (settledEarlier).
	sent bool
}

// settlement is the fate of one claimed row.
type settlement struct {
	rec *Record
	out Outcome
	// cause is the error behind a retry or dead outcome, for the hook.
	cause error
	// released: the row came in a key's run behind a row of its key that was not
	// delivered, and goes back to pending untried (release).
	released bool
}

// runShare is how many claim loops share the keys of claims with runs: its claim loops,
// so that a few keys' backlog keeps each of them busy (the first loop's claim would
// otherwise take every key's head and the others idle); 0 without runs.
func (p *Publisher) runShare() int {
	if !p.runs || p.opts.Concurrency < 2 {
		return 0
	}
	return p.opts.Concurrency
}

// runKey returns rec's key when rec may be part of a run.
func (p *Publisher) runKey(rec *Record) (partKey, bool) {
	return partKey{rec.Namespace, rec.PartitionKey}, p.runs && rec.PartitionKey != ""
}

// release puts a row of a run back untried: an earlier row of its key, behind, was not
// delivered, so delivering this one now would break the key's order. It spends no attempt
// and waits no delay (the row behind it holds the key until it is delivered), and it is not
// a failure: no retry, no circuit, no dead letter.
func release(it *settlement, behind uuid.UUID) {
	it.out = Outcome{Lease: it.rec.Lease(), Status: StatusPending, RefundAttempt: true,
		Error: "not published: waited behind row " + behind.String() + " of its key, which was not delivered"}
	it.cause, it.released = nil, true
}

// publishBatch publishes one claimed batch and returns its outcomes, or nil when the
// shutdown deadline passed first (the batch must then be left to its lease). lost holds the
// rows whose lease was lost before the publish began (the batch was claimed while the one
// before it was published); they are left to their new owner.
func (r *run) publishBatch(recs []Record, lost map[uuid.UUID]bool) *outcomes {
	p := r.p
	items := make([]settlement, len(recs))
	batch := make([]Delivery, 0, len(recs))
	idx := make([]int, 0, len(recs)) // batch position -> items position
	leases := make([]Lease, 0, len(recs))
	// blocked holds, for each key of a run whose row was not delivered, that row: the
	// rows of the key after it in the batch are released.
	var blocked map[partKey]uuid.UUID
	if p.runs {
		blocked = map[partKey]uuid.UUID{}
	}
	for i := range recs {
		rec := &recs[i]
		items[i].rec = rec
		key, inRun := p.runKey(rec)
		if lost[rec.ID] {
			items[i].out.Lease = rec.Lease()
			if inRun {
				blocked[key] = cmp.Or(blocked[key], rec.ID)
			}
			continue
		}
		leases = append(leases, rec.Lease())
		if behind, ok := blocked[key]; inRun && ok {
			release(&items[i], behind)
			continue
		}
		if err := rec.Integrity(); err != nil {
			items[i].out = Outcome{Lease: rec.Lease(), Status: StatusDead, Error: err.Error() + "; not published"}
			items[i].cause = err
			if inRun {
				blocked[key] = rec.ID
			}
			continue
		}
		batch = append(batch, deliveryOf(*rec))
		idx = append(idx, i)
	}

	b := &outcomes{items: items, lost: lost, published: len(batch), began: time.Now()}
	if len(batch) > 0 {
		ctx := r.startPublish(r.work, batch)
		results, ok := r.publish(ctx, batch, leases, lost)
		b.took = time.Since(b.began)
		if !ok {
			r.endPublishAbandoned(ctx, batch)
			p.log.Warn("outbox publisher: shutdown deadline passed before the batch was settled; its rows keep their lease until it expires",
				idsAttr(leases), "count", len(leases))
			return nil
		}
		for j, err := range results {
			i := idx[j]
			rec := items[i].rec
			if key, inRun := p.runKey(rec); inRun {
				if behind, ok := blocked[key]; ok {
					release(&items[i], behind) // whatever the transport reported for it
					b.published--
					continue
				}
				if err != nil || lost[rec.ID] {
					blocked[key] = rec.ID
				}
			}
			if err == nil {
				items[i].out = Outcome{Lease: rec.Lease(), Status: StatusDelivered}
				continue
			}
			items[i].out = p.opts.Retry.Outcome(Failure{Lease: rec.Lease(), Attempts: rec.Attempts, Err: err})
			items[i].cause = err
			if IsUnavailable(err) && !IsPermanent(err) { // as RetryPolicy.Outcome judges it
				b.unavailable++
				if b.unavailableErr == nil {
					b.unavailableErr = err
				}
			}
			if items[i].out.Status == StatusDead && !IsPermanent(err) {
				items[i].cause = fmt.Errorf("%w: %w", ErrAttemptLimit, err)
			}
		}
		b.partly = b.unavailable > 0 && b.unavailable < b.published
		r.chargeUnavailable(b)
		r.endPublish(ctx, batch, items, idx)
	}
	return b
}

// join returns the outcomes of b and then c, to settle together, and the rows of b that
// c holds again. Such a row's lease in b ran out before b was settled, and this publisher
// claimed the row again in c's batch: c's lease is the one that holds, so b's outcome for
// it is left out, as a lost lease (one settle names each row once; by id alone, the stale
// outcome would pass for settled and be counted twice).
func (b *outcomes) join(c *outcomes) (j *outcomes, reclaimed []uuid.UUID) {
	again := make(map[uuid.UUID]bool, len(c.items))
	for _, it := range c.items {
		again[it.out.ID] = true
	}
	items := make([]settlement, 0, len(b.items)+len(c.items))
	lost := make(map[uuid.UUID]bool, len(b.lost)+len(c.lost))
	for _, it := range b.items {
		id := it.out.ID
		switch {
		case again[id]:
			if !b.lost[id] { // a lease already found lost was counted then
				reclaimed = append(reclaimed, id)
			}
			continue
		case b.lost[id]:
			lost[id] = true
		}
		items = append(items, it)
	}
	maps.Copy(lost, c.lost)
	j = &outcomes{items: append(items, c.items...), lost: lost,
		published: b.published + c.published, unavailable: b.unavailable + c.unavailable,
		unavailableErr: cmp.Or(b.unavailableErr, c.unavailableErr), began: b.began, took: c.took,
		partly: b.partly || c.partly}
	return j, reclaimed
}

// pending returns the outcomes still to settle: those of rows whose lease was not lost.
func (b *outcomes) pending() []Outcome {
	outs := make([]Outcome, 0, len(b.items))
	for _, it := range b.items {
		if !b.lost[it.out.ID] {
			outs = append(outs, it.out)
		}
	}
	return outs
}

// publish hands the batch to the transport and renews the leases until it returns. It
// reports false when the shutdown deadline passed first: the batch must then be left alone.
// Renewal marks the rows whose lease was lost in lost and stops renewing them. A call that
// outlives PublishTimeout is cancelled; its unreported messages fail with ErrPublishTimeout.
func (r *run) publish(parent context.Context, batch []Delivery, leases []Lease, lost map[uuid.UUID]bool) ([]error, bool) {
	p := r.p
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	done := make(chan []error, 1) // buffered: an abandoned publish can still finish and exit
	go func() { done <- r.callTransport(ctx, batch) }()

	held := append([]Lease(nil), leases...)
	renew := time.NewTimer(p.opts.Lease / 3)
	defer renew.Stop()
	timeout := time.NewTimer(p.opts.PublishTimeout)
	defer timeout.Stop()
	var grace <-chan time.Time // set once the timeout cancelled the call
	timedOut := func(results []error) []error {
		err := fmt.Errorf("%w after %s", ErrPublishTimeout, p.opts.PublishTimeout)
		if results == nil {
			return failAll(len(batch), err)
		}
		for i, e := range results {
			if e != nil {
				results[i] = fmt.Errorf("%w: %w", err, e)
			}
		}
		return results
	}
	for {
		select {
		case results := <-done:
			if grace != nil {
				results = timedOut(results)
			}
			return results, true
		case <-renew.C:
			var next time.Duration
			held, next = r.extend(held, lost)
			renew.Reset(next)
		case <-timeout.C:
			p.log.Warn("outbox publisher: publish timed out; cancelling it, and its messages will be retried",
				"publish_timeout", p.opts.PublishTimeout, "count", len(batch), "topic", batch[0].Topic, idsAttr(leases))
			cancel()
			t := time.NewTimer(abandonAfter)
			defer t.Stop()
			grace = t.C
		case <-grace:
			p.errs.Add(1)
			p.log.Error("outbox publisher: transport ignored its cancelled context after the publish timeout; abandoning it",
				"abandon_after", abandonAfter, "count", len(batch))
			return timedOut(nil), true
		case <-r.work.Done():
			graceOrAbandon(r, done, "transport", "count", len(batch))
			return nil, false
		}
	}
}

// graceOrAbandon is called once the work context is cancelled (the shutdown deadline) while
// a user callback still runs: it waits abandonAfter more for done, then abandons the
// callback, which Run reports. done is any channel that receives or closes when it returns.
func graceOrAbandon[T any](r *run, done <-chan T, what string, attrs ...any) {
	grace := time.NewTimer(abandonAfter)
	defer grace.Stop()
	select {
	case <-done:
	case <-grace.C:
		r.abandoned.Add(1)
		r.p.errs.Add(1)
		r.p.log.Error("outbox publisher: "+what+" ignored its cancelled context; abandoning it",
			append([]any{"abandon_after", abandonAfter}, attrs...)...)
	}
}

// callTransport runs the transport, turning a panic or a malformed result into a failure
// of every message of the batch. The result has len(batch) entries.
func (r *run) callTransport(ctx context.Context, batch []Delivery) (errs []error) {
	p := r.p
	defer func() {
		if v := recover(); v != nil {
			p.errs.Add(1)
			p.log.Error("outbox publisher: transport panicked; the batch will be retried",
				"panic", fmt.Sprint(v), "count", len(batch), "stack", string(debug.Stack()))
			errs = failAll(len(batch), fmt.Errorf("outbox: transport panicked: %v", v))
		}
	}()
	if p.opts.Ordered {
		ctx = withKeyOrder(ctx)
	} else {
		ctx = WithoutKeyOrder(ctx) // nothing to hold back: a transport need not sequence a key
	}
	errs = p.tr.Publish(ctx, batch)
	switch len(errs) {
	case 0:
		return make([]error, len(batch))
	case len(batch):
		return errs
	}
	p.errs.Add(1)
	p.log.Error("outbox publisher: transport returned the wrong number of results; the batch will be retried",
		"results", len(errs), "count", len(batch))
	return failAll(len(batch), fmt.Errorf("outbox: transport returned %d results for %d messages", len(errs), len(batch)))
}

func failAll(n int, err error) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// extend renews held and returns the leases still held and when to renew next.
func (r *run) extend(held []Lease, lost map[uuid.UUID]bool) ([]Lease, time.Duration) {
	kept, ok := r.renew(held, lost, "renewing", "")
	if !ok {
		// Try again soon: the lease is still running, but time is short.
		return kept, max(r.p.opts.Lease/10, time.Millisecond)
	}
	return kept, r.p.opts.Lease / 3
}

// renew renews held once and returns the leases still held: those another worker took
// over are counted, marked in lost and left out. It reports false when the renewal failed
// (counted as an error and logged, with then saying what follows).
func (r *run) renew(held []Lease, lost map[uuid.UUID]bool, while, then string) ([]Lease, bool) {
	p := r.p
	if len(held) == 0 {
		return held, true
	}
	err := p.store.Extend(r.work, p.opts.Lease, held...)
	var lle *LeaseLostError
	switch {
	case err == nil:
		return held, true
	case errors.As(err, &lle):
		r.lostLeases(lle.IDs, lost, while)
		return slices.DeleteFunc(held, func(l Lease) bool { return lost[l.ID] }), true
	case r.work.Err() != nil:
		return held, true
	default:
		p.errs.Add(1)
		p.log.Log(r.work, dbErrorLevel(err), "outbox publisher: lease renewal failed"+then, "err", err, idsAttr(held))
		return held, false
	}
}

// confirmLate renews the leases of the rows a late claim brought (claimNow), again while
// a renewal itself answers late, so that they are published with two thirds of their lease
// left at least. The renewal matches the claim's token, so rows another worker claimed
// meanwhile come back lost and go to lost, for their new owner. When a renewal fails, the
// publisher cannot tell whether the rows are still its own: they go to lost too, uncounted,
// and are left until their lease runs out and a claim takes them again.
func (r *run) confirmLate(recs []Record, lost map[uuid.UUID]bool) {
	held := make([]Lease, len(recs))
	for i := range recs {
		held[i] = recs[i].Lease()
	}
	for len(held) > 0 && r.work.Err() == nil {
		began := time.Now()
		kept, ok := r.renew(held, lost, "renewing a late claim", " after a late claim; its rows are left until their lease runs out")
		if !ok {
			for _, l := range held {
				lost[l.ID] = true
			}
			return
		}
		if time.Since(began) < r.p.opts.Lease/3 {
			return
		}
		held = kept
	}
}

// lostLeases counts and logs rows whose lease was taken over, once per row.
func (r *run) lostLeases(ids []uuid.UUID, lost map[uuid.UUID]bool, while string) {
	fresh := make([]uuid.UUID, 0, len(ids))
	for _, id := range ids {
		if !lost[id] {
			lost[id] = true
			fresh = append(fresh, id)
		}
	}
	if len(fresh) == 0 {
		return
	}
	r.p.leaseLost.Add(int64(len(fresh)))
	r.p.log.Warn("outbox publisher: lease lost while "+while+"; another worker owns the rows now",
		idsAttr(fresh), "count", len(fresh))
}

// reclaimed counts and logs rows whose lease ran out while their outcome waited to be
// settled, and which this publisher has claimed again since (outcomes.join): lost leases,
// though the new owner is this publisher.
func (r *run) reclaimed(ids []uuid.UUID) {
	if len(ids) == 0 {
		return
	}
	r.p.leaseLost.Add(int64(len(ids)))
	r.p.log.Warn("outbox publisher: lease ran out before the outcome was recorded; this publisher claimed the rows again, and records their new outcome instead",
		idsAttr(ids), "count", len(ids))
}

// settle settles the outcomes of a batch in one Store.Complete call, retrying database
// errors a few times, and reports them. Rows whose lease was lost are left to their new
// owner.
func (r *run) settle(b *outcomes) {
	p := r.p
	outs := b.pending()
	if len(outs) == 0 {
		return
	}
	var err error
	delay := settleRetryDelay
	for attempt := 1; ; attempt++ {
		done := r.watch("settling outcomes")
		err = p.store.Complete(r.work, outs...)
		done()
		if err == nil || errors.Is(err, ErrLeaseLost) || r.work.Err() != nil {
			break
		}
		p.errs.Add(1)
		b.sent = true
		if attempt == settleAttempts {
			p.log.Log(r.work, dbErrorLevel(err), "outbox publisher: could not settle outcomes; the rows keep their lease and will be redelivered after it expires",
				"err", err, idsAttr(dialect.Leases(outs)), "count", len(outs))
			return
		}
		p.log.Warn("outbox publisher: settling outcomes failed; retrying", "err", err, "retry_in", delay, "count", len(outs))
		if !sleep(r.work, delay) {
			break
		}
		delay *= 2
	}
	var lle *LeaseLostError
	switch {
	case err == nil:
	case errors.As(err, &lle):
		ids := lle.IDs
		if b.sent {
			ids = r.settledEarlier(outs, ids)
		}
		r.lostLeases(ids, b.lost, "settling")
	default: // the shutdown deadline passed
		p.log.Warn("outbox publisher: shutdown deadline passed before the batch was settled; its rows keep their lease until it expires",
			idsAttr(dialect.Leases(outs)), "count", len(outs))
		return
	}
	r.report(b)
}

// report counts and logs the outcomes of a settled batch and hands its dead letters to
// OnDead. Rows whose lease was lost are not counted here (lostLeases counted them).
func (r *run) report(b *outcomes) {
	p := r.p
	var retried, unavailable []*settlement
	var dead []DeadLetter
	for i := range b.items {
		it := &b.items[i]
		if b.lost[it.out.ID] || it.released {
			continue
		}
		switch it.out.Status {
		case StatusDelivered:
			p.delivered.Add(1)
		case StatusPending:
			if it.out.RefundAttempt {
				p.unavailable.Add(1)
				unavailable = append(unavailable, it)
				continue
			}
			p.retried.Add(1)
			retried = append(retried, it)
		case StatusDead:
			dead = append(dead, DeadLetter{Delivery: deliveryOf(*it.rec), Reason: truncateUTF8(it.out.Error, MaxLastErrorBytes), Err: it.cause})
		}
	}
	r.settled(b)
	if len(retried) > 0 {
		first := retried[0]
		ids := make([]uuid.UUID, len(retried))
		for i, it := range retried {
			ids[i] = it.out.ID
		}
		p.log.Warn("outbox publisher: delivery failed; will retry", "count", len(retried), "id", first.out.ID,
			"topic", first.rec.Topic, "attempt", first.rec.Attempts, "retry_in", first.out.Delay,
			"next_attempt_at", time.Now().Add(first.out.Delay).UTC().Format(time.RFC3339Nano), "err", first.cause, idsAttr(ids))
	}
	r.logUnavailable(b, unavailable)
	r.deadLetters(dead)
}

// deadLetters logs a batch's dead-lettered rows in one line and reports each to OnDead.
func (r *run) deadLetters(dls []DeadLetter) {
	if len(dls) == 0 {
		return
	}
	ids := make([]uuid.UUID, len(dls))
	for i, dl := range dls {
		ids[i] = dl.ID
	}
	first := dls[0]
	r.p.log.Error("outbox publisher: message dead-lettered", "count", len(dls), "id", first.ID, "topic", first.Topic,
		"attempts", first.Attempt, "reason", first.Reason, idsAttr(ids))
	for _, dl := range dls {
		r.dead(dl)
	}
}

// settledEarlier returns the ids of lost that an earlier try of this settle did apply: a
// Complete can commit and still report an error (the reply was lost), and its retry then
// finds the rows no longer processing. A row that still carries this claim's token and
// already has the status sent was settled by this publisher, since tokens are unique per
// claim; anything else, or a row that cannot be read, is a lost lease.
func (r *run) settledEarlier(outs []Outcome, lost []uuid.UUID) []uuid.UUID {
	sent := make(map[uuid.UUID]Outcome, len(outs))
	for _, o := range outs {
		sent[o.ID] = o
	}
	var really []uuid.UUID
	for _, id := range lost {
		rec, err := r.p.store.Get(r.work, id)
		if err != nil || rec.LeaseToken != sent[id].Token || rec.Status != sent[id].Status {
			really = append(really, id)
		}
	}
	return really
}

// dead counts one dead-lettered row and reports it to OnDead; deadLetters logs it.
func (r *run) dead(dl DeadLetter) {
	p := r.p
	p.dead.Add(1)
	if p.opts.OnDead == nil {
		return
	}
	// The hook runs on its own goroutine only so that one which ignores its cancelled
	// context cannot hold Run past the shutdown deadline; it is still called one at a time.
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if v := recover(); v != nil {
				p.errs.Add(1)
				p.log.Error("outbox publisher: OnDead panicked", "id", dl.ID, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			}
		}()
		p.opts.OnDead(r.work, dl)
	}()
	select {
	case <-done:
	case <-r.work.Done():
		graceOrAbandon(r, done, "OnDead", "id", dl.ID)
	}
}

// fullSweepEvery is how many sweeps apart the publisher repeats the full sweep (an hour at
// the default SweepInterval). Pending rows at the attempt limit need one: they appear when
// the limit is lowered, at this publisher's start, but also later, while a rolling deploy
// still runs old instances that nack under the higher limit, or when other code nacks
// under another one.
const fullSweepEvery = 60

// sweepLoop sweeps every SweepInterval, the first time one interval after start: in full
// (Store.Bury) until one full sweep succeeds and then every fullSweepEvery sweeps, for
// expired leases only (Store.BuryExpired) in between, which is cheaper wherever the dialect
// can skip the pending backlog.
//
// Not at start: a sweep walks the pending backlog on PostgreSQL and SQLite (their claim
// index holds pending and processing rows together), and on SQLite it holds the one write
// lock meanwhile, so at start it delayed the first claims of a restarted publisher (1 s of
// the 114 s of CPU in a profile of the bench's SQLite drains, BENCHMARKS.md). Rows at the
// attempt limit are not claimable; burying them one interval later changes nothing but
// when OnDead hears of them.
func (r *run) sweepLoop() {
	t := time.NewTicker(r.p.opts.SweepInterval)
	defer t.Stop()
	sinceFull := fullSweepEvery // sweeps since the last full sweep that succeeded
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
		if s := r.p.slots; s != nil && !s.background(r.ctx) {
			return // a relay spaces the sweeps of its stores out with its idle probes
		}
		if sinceFull >= fullSweepEvery {
			if r.sweep(r.p.store.Bury) {
				sinceFull = 0
			}
		} else {
			r.sweep(r.p.store.BuryExpired)
		}
		sinceFull++
	}
}

// sweep buries exhausted rows with bury, batch by batch until fewer than a batch remain,
// and reports whether it got there.
func (r *run) sweep(bury func(context.Context, Scope, int, int) ([]uuid.UUID, error)) bool {
	p := r.p
	for r.ctx.Err() == nil {
		ids, err := bury(r.work, p.opts.Scope, p.opts.Retry.MaxAttempts, p.opts.BatchSize)
		if err != nil {
			if r.work.Err() == nil {
				p.errs.Add(1)
				p.log.Log(r.work, dbErrorLevel(err), "outbox publisher: sweep failed; will try again at the next sweep", "err", err)
			}
			return false
		}
		dls := make([]DeadLetter, 0, len(ids))
		for _, id := range ids {
			dl := DeadLetter{Delivery: Delivery{ID: id}, Err: ErrAttemptLimit,
				Reason: fmt.Sprintf("attempt limit reached (%d attempts)", p.opts.Retry.MaxAttempts)}
			if p.opts.OnDead != nil {
				rec, err := p.store.Get(r.work, id)
				if err == nil {
					dl.Delivery, dl.Reason = deliveryOf(rec), rec.LastError
				} else if r.work.Err() == nil {
					p.errs.Add(1)
					p.log.Log(r.work, dbErrorLevel(err), "outbox publisher: reading a buried row failed", "id", id, "err", err)
				}
			}
			dls = append(dls, dl)
		}
		r.settledDead(dls)
		r.deadLetters(dls)
		if len(ids) < p.opts.BatchSize {
			return true
		}
	}
	return false
}

// idsAttr logs at most maxLoggedIDs ids of leases.
func idsAttr[T Lease | uuid.UUID](xs []T) slog.Attr {
	n := min(len(xs), maxLoggedIDs)
	ids := make([]string, n)
	for i := range n {
		switch v := any(xs[i]).(type) {
		case Lease:
			ids[i] = v.ID.String()
		case uuid.UUID:
			ids[i] = v.String()
		}
	}
	return slog.Any("ids", ids)
}

// dbErrorLevel is the level at which a publisher logs a failed database call of its own: a
// conflict the dialect's retries did not get past ([ErrRetryTransaction], common on a
// Galera cluster) is a warning, since the next call usually succeeds; anything else is an
// error.
func dbErrorLevel(err error) slog.Level {
	if errors.Is(err, ErrRetryTransaction) {
		return slog.LevelWarn
	}
	return slog.LevelError
}
