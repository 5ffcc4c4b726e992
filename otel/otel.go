package outboxotel

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxgo/outbox"
)

// ScopeName is the instrumentation scope of the spans and metrics.
const ScopeName = "github.com/outboxgo/outbox/otel"

// DefaultSystem is the messaging.system of every span and metric when [Options.System] is
// empty: the outbox itself, the messaging client the application writes to.
const DefaultSystem = "outbox"

// Attribute keys of this package, beside the conventions' own.
const (
	// OutcomeKey is the outcome of an attempt on outbox.attempts: delivered, retried,
	// unavailable or dead ([outbox.AttemptOutcome]).
	OutcomeKey = attribute.Key("outbox.outcome")
	// StatusKey is the row status of outbox.messages.
	StatusKey = attribute.Key("outbox.status")
	// NamespaceKey is the outbox namespace of a message or gauge.
	NamespaceKey = attribute.Key("outbox.namespace")
	// TopicKey is the outbox topic of a message or gauge. messaging.destination.name is the
	// broker's destination the transport sends it to, which the topic maps to (see
	// [Telemetry.PublisherObserver]).
	TopicKey = attribute.Key("outbox.topic")
	// StoreKey names the store of the backlog gauges, when [WatchOptions.Name] is set.
	StoreKey = attribute.Key("outbox.store")
	// PublisherKey names the publisher of outbox.circuit.open and outbox.listener.connected.
	PublisherKey = attribute.Key("outbox.publisher")
	// AttemptKey is the attempt number on the per-message events of a send span.
	AttemptKey = attribute.Key("outbox.attempt")
	// RetryInKey is the delay, in seconds, before the next attempt, on the events of a
	// retried or unavailable message.
	RetryInKey = attribute.Key("outbox.retry_in")
	// DuplicateKey is true on a create span whose message was a duplicate (nothing was
	// inserted) and on a process span whose message the group had processed already.
	DuplicateKey = attribute.Key("outbox.duplicate")
)

// Names of the span events of failed messages.
const (
	EventRetryScheduled = "outbox.retry_scheduled"
	EventUnavailable    = "outbox.unavailable"
	EventDeadLettered   = "outbox.dead_lettered"
)

// OperationDurationBuckets are the bucket boundaries, in seconds, that the conventions
// advise for messaging.client.operation.duration.
var OperationDurationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// LagBuckets are the bucket boundaries, in seconds, of outbox.delivery.lag: from
// milliseconds for a publisher woken by the enqueue to an hour for a backlog.
var LagBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}

// Options configure a [Telemetry]. The zero value is valid.
type Options struct {
	// TracerProvider starts the spans. Default the global one (otel.GetTracerProvider).
	TracerProvider trace.TracerProvider
	// MeterProvider creates the instruments. Default the global one (otel.GetMeterProvider).
	MeterProvider metric.MeterProvider
	// Propagator writes the creation context into the message headers and reads it back.
	// Default W3C trace context (traceparent, tracestate): the format every transport can
	// carry. Pass otel.GetTextMapPropagator() to use the global one, baggage included.
	Propagator propagation.TextMapPropagator
	// System is the messaging.system of every span and metric: create, send and process
	// spans of the same message all say it, so that a trace tells one story. The default,
	// [DefaultSystem] ("outbox"), names the outbox as the messaging client the application
	// uses; set it to the broker's name ("nats", "kafka", "rabbitmq", "redis", "webhook",
	// as the transports' System methods name them) to have every span say that instead,
	// in every process that enqueues or publishes. The broker a send reached is on its span
	// either way: messaging.destination.name and server.address (see
	// [Telemetry.PublisherObserver]).
	System string
	// SpanPerMessage makes publishers start one send span per message, with
	// messaging.message.id, instead of one per batch that links to every message. A
	// batch of 100 then costs 100 spans.
	SpanPerMessage bool
}

// Telemetry records the outbox's spans and metrics. Create one per process with [New];
// hand its hooks to the stores, publishers and inboxes: [Telemetry.StoreHooks],
// [Telemetry.PublisherObserver], [Telemetry.InboxObserver], and watch each store's backlog
// with [Telemetry.WatchStore]. It is safe for concurrent use.
type Telemetry struct {
	tracer     trace.Tracer
	prop       propagation.TextMapPropagator
	fields     []string
	system     string
	perMessage bool

	opDuration messagingconv.ClientOperationDuration
	sent       messagingconv.ClientSentMessages
	attempts   metric.Int64Counter
	lag        metric.Float64Histogram
	messages   metric.Int64ObservableGauge
	oldest     metric.Float64ObservableGauge
	undeliv    metric.Float64ObservableGauge
	circuit    metric.Int64ObservableGauge
	listenerUp metric.Int64ObservableGauge

	logReading   metric.Int64ObservableGauge
	slotLag      metric.Int64ObservableGauge
	slotRetained metric.Int64ObservableGauge
	slotResets   metric.Int64ObservableCounter

	mu         sync.Mutex
	watchers   map[*outbox.Store]*StoreWatcher
	publishers map[*PublisherObserver]struct{}
	// closedCircuits are the circuits of closed publisher observers, reported as 0.
	closedCircuits map[attribute.Distinct]attribute.Set
	listeners      map[*listenerWatch]struct{}
	logReaders     map[*logReaderWatch]struct{}
}

// New returns a Telemetry. It fails only when the meter provider refuses an instrument.
func New(opts Options) (*Telemetry, error) {
	tp := opts.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	mp := opts.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	prop := opts.Propagator
	if prop == nil {
		prop = propagation.TraceContext{}
	}
	system := opts.System
	if system == "" {
		system = DefaultSystem
	}
	t := &Telemetry{
		tracer:     tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		prop:       prop,
		fields:     prop.Fields(),
		system:     system,
		perMessage: opts.SpanPerMessage,
		watchers:   map[*outbox.Store]*StoreWatcher{},
		publishers: map[*PublisherObserver]struct{}{},

		closedCircuits: map[attribute.Distinct]attribute.Set{},
		listeners:      map[*listenerWatch]struct{}{},
		logReaders:     map[*logReaderWatch]struct{}{},
	}
	m := mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
	var errs []error
	var err error
	t.opDuration, err = messagingconv.NewClientOperationDuration(m, metric.WithExplicitBucketBoundaries(OperationDurationBuckets...))
	errs = append(errs, err)
	// Made here rather than by messagingconv.NewClientSentMessages, whose description (it
	// wins over one passed in) says "attempted": this counter counts only the messages the
	// broker accepted, and its HELP text says so.
	sent, err := m.Int64Counter(messagingconv.ClientSentMessages{}.Name(), metric.WithUnit(messagingconv.ClientSentMessages{}.Unit()),
		metric.WithDescription("Messages the broker accepted (failed sends are counted in outbox.attempts)."))
	t.sent = messagingconv.ClientSentMessages{Int64Counter: sent}
	errs = append(errs, err)
	t.attempts, err = m.Int64Counter("outbox.attempts", metric.WithUnit("{attempt}"),
		metric.WithDescription("Delivery attempts whose outcome was recorded, by outcome: delivered, retried, unavailable, dead."))
	errs = append(errs, err)
	t.lag, err = m.Float64Histogram("outbox.delivery.lag", metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(LagBuckets...),
		metric.WithDescription("Time from a message's enqueue (its row's created_at) to its recorded delivery."))
	errs = append(errs, err)
	t.messages, err = m.Int64ObservableGauge("outbox.messages", metric.WithUnit("{message}"),
		metric.WithDescription("Rows of the outbox table per namespace, topic and status (pending: due now; scheduled: waiting for a delay or a retry; processing: leased; dead), read by the store's poller."))
	errs = append(errs, err)
	t.oldest, err = m.Float64ObservableGauge("outbox.oldest_pending.age", metric.WithUnit("s"),
		metric.WithDescription("How long the oldest due pending row of a topic has been due, read by the store's poller."))
	errs = append(errs, err)
	t.undeliv, err = m.Float64ObservableGauge("outbox.oldest_undelivered.age", metric.WithUnit("s"),
		metric.WithDescription("How long the oldest undelivered row of a topic has been due, counted from when it first fell due, so that retries and outage probes do not reset it: the age to alert on, read by the store's poller."))
	errs = append(errs, err)
	t.circuit, err = m.Int64ObservableGauge("outbox.circuit.open",
		metric.WithDescription("1 while a publisher's circuit breaker is open (its destination unavailable), 0 while closed or once the publisher's observer is closed."))
	errs = append(errs, err)
	t.listenerUp, err = m.Int64ObservableGauge("outbox.listener.connected",
		metric.WithDescription("1 while a publisher's wake-up listener is connected, 0 while it is down and the publisher polls; absent for a publisher that polls by design."))
	errs = append(errs, err)
	t.logReading, err = m.Int64ObservableGauge("outbox.log.reading",
		metric.WithDescription("1 while this process's log reader holds its replication slot, 0 while it waits (standby) or has lost it."))
	errs = append(errs, err)
	t.slotLag, err = m.Int64ObservableGauge("outbox.log.slot.lag", metric.WithUnit("By"),
		metric.WithDescription("How far the log reader's slot's confirmed position is behind the server's WAL, as last read."))
	errs = append(errs, err)
	t.slotRetained, err = m.Int64ObservableGauge("outbox.log.slot.retained_wal", metric.WithUnit("By"),
		metric.WithDescription("WAL the log reader's slot keeps the server from recycling, as last read: a slot that falls max_slot_wal_keep_size behind is invalidated."))
	errs = append(errs, err)
	t.slotResets, err = m.Int64ObservableCounter("outbox.log.slot.resets", metric.WithUnit("{reset}"),
		metric.WithDescription("Times the log reader found its slot dropped or invalidated and created it again (polling delivered the rows meanwhile)."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("outboxotel: instruments: %w", err)
	}
	if _, err := m.RegisterCallback(t.observe, t.messages, t.oldest, t.undeliv, t.circuit, t.listenerUp,
		t.logReading, t.slotLag, t.slotRetained, t.slotResets); err != nil {
		return nil, fmt.Errorf("outboxotel: gauge callback: %w", err)
	}
	return t, nil
}

// StoreHooks returns the hooks to set in [outbox.Options.Hooks]: the create span and the
// trace context stored in each message's headers.
func (t *Telemetry) StoreHooks() outbox.StoreHooks {
	return outbox.StoreHooks{Enqueue: enqueueHook{t}}
}

// observe reports the gauges: the last snapshot of every watched store, every publisher's
// circuit, and the listeners and log readers watched.
func (t *Telemetry) observe(_ context.Context, o metric.Observer) error {
	t.mu.Lock()
	watchers := make([]*StoreWatcher, 0, len(t.watchers))
	for _, w := range t.watchers {
		watchers = append(watchers, w)
	}
	pubs := make([]*PublisherObserver, 0, len(t.publishers))
	for p := range t.publishers {
		pubs = append(pubs, p)
	}
	for _, attrs := range t.closedCircuits {
		o.ObserveInt64(t.circuit, 0, metric.WithAttributeSet(attrs))
	}
	listeners := make([]*listenerWatch, 0, len(t.listeners))
	for l := range t.listeners {
		listeners = append(listeners, l)
	}
	readers := make([]*logReaderWatch, 0, len(t.logReaders))
	for r := range t.logReaders {
		readers = append(readers, r)
	}
	t.mu.Unlock()
	for _, l := range listeners { // their functions run outside the lock: they may take locks of their own
		l.observe(t, o)
	}
	for _, r := range readers {
		r.observe(t, o)
	}
	for _, w := range watchers {
		w.observe(t, o)
	}
	for _, p := range pubs {
		open := int64(0)
		if p.open.Load() {
			open = 1
		}
		o.ObserveInt64(t.circuit, open, metric.WithAttributeSet(p.circuitAttrs))
	}
	return nil
}

// carrier reads and writes message headers for a propagator.
func carrier(h map[string]string) propagation.MapCarrier { return propagation.MapCarrier(h) }

// errorType is the error.type of a failed attempt: a short, bounded class.
func errorType(err error) string {
	switch {
	case err == nil:
		return ""
	case outbox.IsUnavailable(err):
		return "unavailable"
	case outbox.IsPermanent(err):
		return "permanent"
	case errors.Is(err, outbox.ErrPublishTimeout), errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, outbox.ErrAttemptLimit):
		return "attempt_limit"
	case errors.Is(err, outbox.ErrIntegrity):
		return "integrity"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return semconv.ErrorTypeOther.Value.AsString()
}
