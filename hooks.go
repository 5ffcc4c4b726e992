package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"time"
)

// Hooks let telemetry, auditing or any other cross-cutting code watch a [Store] without the
// library importing it. They are set once, in [Options.Hooks] and
// [PublisherOptions.Observer]; package github.com/outboxgo/outbox/otel implements them for
// OpenTelemetry. A nil hook costs nothing.
//
// A panic in a hook is recovered and logged with [slog.Default] (a [Publisher]'s observer
// with the publisher's logger, counted in [PublisherStats.Errors]): telemetry never fails
// a business write or a delivery. The call it interrupted goes on as if the hook were not
// set: an enqueue keeps only the caller's headers, a publish runs on the publisher's own
// context.

// EnqueueHook watches each message that [Store.Enqueue], [Store.EnqueueBatch],
// [Store.EnqueueStandalone] and [Store.EnqueueOn] (package pgxv5's enqueues) write. It may add headers, such as the trace context of a span
// it starts, and they are stored with the row.
//
// StartEnqueue is called for each message before it is validated, in the order given. m is
// a copy; its Headers are a copy of the caller's map (nil when the caller set none, and the
// hook may then assign a new map). The hook may add headers; it cannot change or remove the
// caller's own: after the call, every header the caller set is restored to the caller's
// value, and every other field's change is discarded. What the hook adds is validated with
// the caller's headers, so that a hook that adds too much fails the enqueue with a
// [*ValidationError]. The returned context is passed to EndEnqueue only; the insert runs on
// the caller's.
//
// EndEnqueue is called once for each message that StartEnqueue saw, after the insert (or
// after the failure that prevented it, err then being non-nil for every message of the
// call), with the message as stored and its [Result]. The insert is in the caller's
// transaction, which may still roll back.
type EnqueueHook interface {
	StartEnqueue(ctx context.Context, m *Message) context.Context
	EndEnqueue(ctx context.Context, m Message, res Result, err error)
}

// StoreHooks are the hooks of a [Store], set in [Options.Hooks].
type StoreHooks struct {
	// Enqueue, when set, watches every message enqueued. See [EnqueueHook].
	Enqueue EnqueueHook
}

// enqueueHooked is one message's hook state during an enqueue.
type enqueueHooked struct {
	ctx context.Context
	ok  bool // StartEnqueue returned without panicking
}

// startEnqueueHooks runs StartEnqueue on each message and returns the messages to write,
// with the headers the hook added. msgs is the caller's slice and is not modified.
func (s *Store) startEnqueueHooks(ctx context.Context, msgs []Message) ([]Message, []enqueueHooked) {
	h := s.hooks.Enqueue
	out := make([]Message, len(msgs))
	state := make([]enqueueHooked, len(msgs))
	for i := range msgs {
		m := msgs[i]
		m.Headers = maps.Clone(msgs[i].Headers)
		hctx, ok := callStartEnqueue(h, ctx, &m)
		state[i] = enqueueHooked{ctx: hctx, ok: ok}
		out[i] = msgs[i]
		if !ok || len(m.Headers) == 0 {
			continue
		}
		// Only additions count: the caller's own headers win, whatever the hook did.
		added := m.Headers
		for k, v := range msgs[i].Headers {
			added[k] = v
		}
		if len(added) > len(msgs[i].Headers) {
			out[i].Headers = added
		}
	}
	return out, state
}

func callStartEnqueue(h EnqueueHook, ctx context.Context, m *Message) (hctx context.Context, ok bool) {
	defer func() {
		if v := recover(); v != nil {
			hookPanicked(slog.Default(), "EnqueueHook.StartEnqueue", v)
			hctx, ok = ctx, false
		}
	}()
	hctx = h.StartEnqueue(ctx, m)
	if hctx == nil {
		hctx = ctx
	}
	return hctx, true
}

// endEnqueueHooks runs EndEnqueue for every message whose StartEnqueue returned.
func (s *Store) endEnqueueHooks(msgs []Message, state []enqueueHooked, res []Result, err error) {
	h := s.hooks.Enqueue
	for i := range msgs {
		if !state[i].ok {
			continue
		}
		var r Result
		if i < len(res) {
			r = res[i]
		}
		func() {
			defer func() {
				if v := recover(); v != nil {
					hookPanicked(slog.Default(), "EnqueueHook.EndEnqueue", v)
				}
			}()
			h.EndEnqueue(state[i].ctx, msgs[i], r, err)
		}()
	}
}

func hookPanicked(log *slog.Logger, what string, v any) {
	log.Error("outbox: hook panicked; carrying on without it", "hook", what, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
}

// AttemptOutcome is what became of one delivery attempt, as an observer sees it.
type AttemptOutcome string

// The outcomes of an attempt.
const (
	// AttemptDelivered: the transport reported the message delivered.
	AttemptDelivered AttemptOutcome = "delivered"
	// AttemptRetried: the attempt failed and the message is due again after a delay
	// ([AttemptResult.RetryIn]) under the [RetryPolicy].
	AttemptRetried AttemptOutcome = "retried"
	// AttemptUnavailable: the destination could not be reached (the transport's error is
	// marked [Unavailable]); the message goes back to pending, and the attempt is
	// given back where the publisher does so.
	AttemptUnavailable AttemptOutcome = "unavailable"
	// AttemptDead: the message was dead-lettered (a [Permanent] error, the attempt limit, a
	// failed integrity check, or the sweep).
	AttemptDead AttemptOutcome = "dead"
	// AttemptReleased: the message came in a partition key's run
	// ([ClaimOptions.Runs]) behind a message of its key that was not delivered, so it was
	// not delivered either (or not published at all); it goes back to pending without
	// spending an attempt, to follow that message. It is not a failure.
	AttemptReleased AttemptOutcome = "released"
)

// AttemptResult is the outcome of one attempt of one message.
type AttemptResult struct {
	Outcome AttemptOutcome
	// Err is the transport's error, or the cause of a dead letter; nil when delivered.
	Err error
	// RetryIn is the delay before the next attempt, for AttemptRetried and
	// AttemptUnavailable.
	RetryIn time.Duration
}

// Settled is one message whose attempt's outcome was recorded in the table.
type Settled struct {
	// Delivery is the message as claimed. For a row the sweep buried it holds only the ID,
	// unless [PublisherOptions.OnDead] is set (the row is then read back).
	Delivery
	AttemptResult
}

// PublisherObserver watches a [Publisher]'s deliveries, set in [PublisherOptions.Observer].
// Its methods are called from the claim loops, concurrently when
// [PublisherOptions.Concurrency] is above 1, so they must be safe for concurrent use and
// quick: they run on the delivery path.
//
// StartPublish is called before each [Transport.Publish] call with the batch (the
// messages' stored headers included, as the transport receives them); the context it
// returns is the one the transport receives, so spans the transport starts are its
// children. EndPublish is called when Publish returned, with that context and one result
// per message, at the same index as batch: what the publisher will record (delivered,
// retried with its delay, unavailable or dead). A publish abandoned at the shutdown
// deadline ends with results whose Err is the context's.
//
// Settled is called once a batch's outcomes are recorded in the table (and for rows that
// failed their integrity check or that the sweep buried, which were never published),
// with the messages whose outcome was recorded; rows whose lease another worker took are
// not among them. Count outcomes here: they are what the table says.
//
// A PublisherObserver may also implement [ClaimObserver] and [CircuitObserver]; the
// publisher finds them by type assertion.
type PublisherObserver interface {
	StartPublish(ctx context.Context, batch []Delivery) context.Context
	EndPublish(ctx context.Context, batch []Delivery, results []AttemptResult)
	Settled(ctx context.Context, settled []Settled)
}

// ClaimObserver is an optional ability of a [PublisherObserver]: StartClaim and EndClaim
// surround each claim of a claim loop (with the previous batch's outcomes recorded in the
// same transaction, where the dialect folds them), which runs whenever the loop polls, so
// most claims of an idle publisher find nothing (n is 0).
type ClaimObserver interface {
	StartClaim(ctx context.Context) context.Context
	EndClaim(ctx context.Context, n int, err error)
}

// CircuitObserver is an optional ability of a [PublisherObserver]: CircuitChanged is called
// when the publisher's circuit breaker opens (open is true: the destination is
// unavailable, and the publisher stops publishing until a probe succeeds) or closes again.
// It is called once per change, from the goroutine that changed the state.
type CircuitObserver interface {
	CircuitChanged(ctx context.Context, open bool)
}

// observer is a Publisher's observer with its optional abilities found once.
type observer struct {
	PublisherObserver
	claim   ClaimObserver   // nil when absent
	circuit CircuitObserver // nil when absent
}

func newObserver(o PublisherObserver) *observer {
	if o == nil {
		return nil
	}
	obs := &observer{PublisherObserver: o}
	obs.claim, _ = o.(ClaimObserver)
	obs.circuit, _ = o.(CircuitObserver)
	return obs
}

// observeRecover recovers a panic of the observer's method what, logs and counts it.
func (p *Publisher) observeRecover(what string) {
	if v := recover(); v != nil {
		p.errs.Add(1)
		hookPanicked(p.log, "PublisherObserver."+what, v)
	}
}

// startPublish returns the context the transport receives.
func (r *run) startPublish(ctx context.Context, batch []Delivery) (out context.Context) {
	obs := r.p.obs
	if obs == nil {
		return ctx
	}
	out = ctx
	defer r.p.observeRecover("StartPublish")
	if c := obs.StartPublish(ctx, batch); c != nil {
		out = c
	}
	return out
}

// endPublish reports a batch's results: items are the batch's settlements, idx maps batch
// positions onto them.
func (r *run) endPublish(ctx context.Context, batch []Delivery, items []settlement, idx []int) {
	obs := r.p.obs
	if obs == nil {
		return
	}
	results := make([]AttemptResult, len(batch))
	for j := range batch {
		results[j] = attemptResult(&items[idx[j]])
	}
	defer r.p.observeRecover("EndPublish")
	obs.EndPublish(ctx, batch, results)
}

// endPublishAbandoned reports a publish left to its lease at the shutdown deadline.
func (r *run) endPublishAbandoned(ctx context.Context, batch []Delivery) {
	obs := r.p.obs
	if obs == nil {
		return
	}
	err := context.Cause(r.work)
	if err == nil {
		err = context.Canceled
	}
	results := make([]AttemptResult, len(batch))
	for j := range results {
		results[j] = AttemptResult{Outcome: AttemptRetried, Err: err}
	}
	defer r.p.observeRecover("EndPublish")
	obs.EndPublish(ctx, batch, results)
}

// attemptResult classifies one settlement for observers. This is the one place that says
// which outcome an attempt had.
func attemptResult(it *settlement) AttemptResult {
	if it.released {
		return AttemptResult{Outcome: AttemptReleased}
	}
	switch it.out.Status {
	case StatusDelivered:
		return AttemptResult{Outcome: AttemptDelivered}
	case StatusDead:
		return AttemptResult{Outcome: AttemptDead, Err: it.cause}
	}
	res := AttemptResult{Outcome: AttemptRetried, Err: it.cause, RetryIn: it.out.Delay}
	if IsUnavailable(it.cause) {
		res.Outcome = AttemptUnavailable
	}
	return res
}

// settled reports the recorded outcomes of a batch.
func (r *run) settled(b *outcomes) {
	obs := r.p.obs
	if obs == nil {
		return
	}
	s := make([]Settled, 0, len(b.items))
	for i := range b.items {
		it := &b.items[i]
		if b.lost[it.out.ID] {
			continue
		}
		s = append(s, Settled{Delivery: deliveryOf(*it.rec), AttemptResult: attemptResult(it)})
	}
	r.observeSettled(s)
}

// settledDead reports dead letters the sweep buried.
func (r *run) settledDead(dls []DeadLetter) {
	if r.p.obs == nil || len(dls) == 0 {
		return
	}
	s := make([]Settled, len(dls))
	for i, dl := range dls {
		s[i] = Settled{Delivery: dl.Delivery, AttemptResult: AttemptResult{Outcome: AttemptDead, Err: dl.Err}}
	}
	r.observeSettled(s)
}

func (r *run) observeSettled(s []Settled) {
	if len(s) == 0 {
		return
	}
	defer r.p.observeRecover("Settled")
	r.p.obs.Settled(r.work, s)
}

// startClaim and endClaim surround a claim (ClaimObserver).
func (r *run) startClaim() (ctx context.Context) {
	ctx = r.work
	if r.p.obs == nil || r.p.obs.claim == nil {
		return ctx
	}
	defer r.p.observeRecover("StartClaim")
	if c := r.p.obs.claim.StartClaim(r.work); c != nil {
		ctx = c
	}
	return ctx
}

func (r *run) endClaim(ctx context.Context, n int, err error) {
	if r.p.obs == nil || r.p.obs.claim == nil {
		return
	}
	defer r.p.observeRecover("EndClaim")
	r.p.obs.claim.EndClaim(ctx, n, err)
}

// observeCircuit tells the observer that the circuit breaker opened or closed; the breaker's
// circuitChanged calls it on every change of state.
func (r *run) observeCircuit(open bool) {
	if r.p.obs == nil || r.p.obs.circuit == nil {
		return
	}
	defer r.p.observeRecover("CircuitChanged")
	r.p.obs.circuit.CircuitChanged(r.work, open)
}

// TransportSystem is an optional ability of a [Transport]: System names the messaging
// system it publishes to, in the words of OpenTelemetry's messaging.system attribute
// ("kafka", "nats", "rabbitmq", ...). Telemetry adapters read it.
type TransportSystem interface {
	System() string
}
