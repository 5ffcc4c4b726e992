package outboxotel

import (
	"context"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxgo/outbox"
)

func systemAttr(s string) messagingconv.SystemAttr { return messagingconv.SystemAttr(s) }

// PublisherObserver is the [outbox.PublisherObserver] of a [Telemetry] for one publisher
// (it implements [outbox.CircuitObserver] too). Create it with
// [Telemetry.PublisherObserver] and set it in [outbox.PublisherOptions.Observer].
type PublisherObserver struct {
	t            *Telemetry
	system       string
	open         atomic.Bool
	circuitAttrs attribute.Set
}

var (
	_ outbox.PublisherObserver = (*PublisherObserver)(nil)
	_ outbox.CircuitObserver   = (*PublisherObserver)(nil)
)

// PublisherObserver returns the observer of a publisher that publishes through tr: its
// messaging.system is tr's ([outbox.TransportSystem]) or [Options.System]. name identifies
// the publisher on outbox.circuit.open (its namespace, say). Call [PublisherObserver.Close]
// when the publisher is gone, so that its circuit is no longer reported.
func (t *Telemetry) PublisherObserver(tr outbox.Transport, name string) *PublisherObserver {
	system := t.system
	if s, ok := tr.(outbox.TransportSystem); ok && s.System() != "" {
		system = s.System()
	}
	p := &PublisherObserver{t: t, system: system,
		circuitAttrs: attribute.NewSet(PublisherKey.String(name), semconv.MessagingSystemKey.String(system))}
	t.mu.Lock()
	t.publishers[p] = struct{}{}
	t.mu.Unlock()
	return p
}

// Close stops reporting the publisher's circuit.
func (p *PublisherObserver) Close() {
	p.t.mu.Lock()
	delete(p.t.publishers, p)
	p.t.mu.Unlock()
}

// publishState is what StartPublish hands EndPublish.
type publishState struct {
	began time.Time
	dest  string       // "" when the batch has several topics
	spans []trace.Span // one per message with SpanPerMessage, else one
}

type publishKey struct{}

// StartPublish starts the send span (or spans) and returns the context the transport
// receives: the batch's span in it, unless there is one per message.
func (p *PublisherObserver) StartPublish(ctx context.Context, batch []outbox.Delivery) context.Context {
	t := p.t
	st := &publishState{began: time.Now(), dest: batch[0].Topic}
	for i := range batch {
		if batch[i].Topic != st.dest {
			st.dest = ""
			break
		}
	}
	base := []attribute.KeyValue{
		semconv.MessagingSystemKey.String(p.system),
		semconv.MessagingOperationName("send"),
		semconv.MessagingOperationTypeSend,
	}
	if t.perMessage {
		st.spans = make([]trace.Span, len(batch))
		for i := range batch {
			d := &batch[i]
			attrs := append(base[:len(base):len(base)], semconv.MessagingDestinationName(d.Topic),
				semconv.MessagingMessageID(d.ID.String()), NamespaceKey.String(d.Namespace))
			opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...)}
			if sc := t.creation(d); sc.IsValid() {
				opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
			}
			_, st.spans[i] = t.tracer.Start(ctx, "send "+d.Topic, opts...)
		}
		return context.WithValue(ctx, publishKey{}, st)
	}
	attrs := base
	name := "send"
	if st.dest != "" {
		attrs = append(attrs, semconv.MessagingDestinationName(st.dest))
		name = "send " + st.dest
	}
	if len(batch) == 1 {
		attrs = append(attrs, semconv.MessagingMessageID(batch[0].ID.String()))
	} else {
		attrs = append(attrs, semconv.MessagingBatchMessageCount(len(batch)))
	}
	links := make([]trace.Link, 0, len(batch))
	for i := range batch {
		if sc := t.creation(&batch[i]); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	ctx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...), trace.WithLinks(links...))
	st.spans = []trace.Span{span}
	return context.WithValue(ctx, publishKey{}, st)
}

// creation extracts the creation context stored in a message's headers.
func (t *Telemetry) creation(d *outbox.Delivery) trace.SpanContext {
	if len(d.Headers) == 0 {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(t.prop.Extract(context.Background(), carrier(d.Headers)))
}

// EndPublish adds an event per failed message, ends the send span (or spans) and records
// the messages the broker accepted and the operation's duration.
func (p *PublisherObserver) EndPublish(ctx context.Context, batch []outbox.Delivery, results []outbox.AttemptResult) {
	t := p.t
	st, ok := ctx.Value(publishKey{}).(*publishState)
	if !ok {
		return
	}
	elapsed := time.Since(st.began).Seconds()
	var firstErr error
	sent := map[string]int64{}
	for i := range batch {
		r := results[i]
		d := &batch[i]
		span := st.spans[0]
		if t.perMessage {
			span = st.spans[i]
		}
		if r.Outcome == outbox.AttemptDelivered {
			sent[d.Topic]++
			if t.perMessage {
				span.End()
			}
			continue
		}
		if firstErr == nil {
			firstErr = r.Err
		}
		event := EventRetryScheduled
		switch r.Outcome {
		case outbox.AttemptDead:
			event = EventDeadLettered
		case outbox.AttemptUnavailable:
			event = EventUnavailable
		}
		attrs := []attribute.KeyValue{semconv.MessagingMessageID(d.ID.String()), AttemptKey.Int(d.Attempt),
			semconv.ErrorTypeKey.String(errorType(r.Err))}
		if r.Err != nil {
			attrs = append(attrs, semconv.ExceptionMessage(r.Err.Error()))
		}
		if r.Outcome != outbox.AttemptDead {
			attrs = append(attrs, RetryInKey.Float64(r.RetryIn.Seconds()))
		}
		span.AddEvent(event, trace.WithAttributes(attrs...))
		if t.perMessage {
			failSpan(span, r.Err)
			span.End()
			t.opDuration.Record(ctx, elapsed, "send", systemAttr(p.system), semconv.MessagingDestinationName(d.Topic),
				semconv.MessagingOperationTypeSend, semconv.ErrorTypeKey.String(errorType(r.Err)))
		}
	}
	if !t.perMessage {
		if firstErr != nil {
			failSpan(st.spans[0], firstErr)
		}
		st.spans[0].End()
		attrs := []attribute.KeyValue{semconv.MessagingOperationTypeSend}
		if st.dest != "" {
			attrs = append(attrs, semconv.MessagingDestinationName(st.dest))
		}
		if firstErr != nil {
			attrs = append(attrs, semconv.ErrorTypeKey.String(errorType(firstErr)))
		}
		t.opDuration.Record(ctx, elapsed, "send", systemAttr(p.system), attrs...)
	} else if len(sent) > 0 {
		for topic := range sent {
			t.opDuration.Record(ctx, elapsed, "send", systemAttr(p.system), semconv.MessagingDestinationName(topic), semconv.MessagingOperationTypeSend)
		}
	}
	for topic, n := range sent {
		t.sent.Add(ctx, n, "send", systemAttr(p.system), semconv.MessagingDestinationName(topic))
	}
}

func failSpan(span trace.Span, err error) {
	if err == nil {
		return
	}
	span.SetStatus(codes.Error, err.Error())
	span.SetAttributes(semconv.ErrorTypeKey.String(errorType(err)))
}

// Settled counts the recorded outcomes by outcome and records the delivery lag of the
// delivered messages.
func (p *PublisherObserver) Settled(ctx context.Context, settled []outbox.Settled) {
	t := p.t
	type key struct {
		ns, topic string
		outcome   outbox.AttemptOutcome
	}
	counts := map[key]int64{}
	lagAttrs := map[[2]string]metric.RecordOption{} // one attribute set per topic of the batch
	now := time.Now()
	for i := range settled {
		s := &settled[i]
		counts[key{s.Namespace, s.Topic, s.Outcome}]++
		if s.Outcome != outbox.AttemptDelivered || s.CreatedAt.IsZero() {
			continue
		}
		k := [2]string{s.Namespace, s.Topic}
		opt, ok := lagAttrs[k]
		if !ok {
			opt = metric.WithAttributeSet(attribute.NewSet(NamespaceKey.String(s.Namespace),
				semconv.MessagingDestinationName(s.Topic), semconv.MessagingSystemKey.String(p.system)))
			lagAttrs[k] = opt
		}
		t.lag.Record(ctx, max(now.Sub(s.CreatedAt), 0).Seconds(), opt)
	}
	for k, n := range counts {
		attrs := []attribute.KeyValue{OutcomeKey.String(string(k.outcome)), semconv.MessagingSystemKey.String(p.system)}
		if k.topic != "" { // a row the sweep buried, not read back, has only its id
			attrs = append(attrs, NamespaceKey.String(k.ns), semconv.MessagingDestinationName(k.topic))
		}
		t.attempts.Add(ctx, n, metric.WithAttributes(attrs...))
	}
}

// CircuitChanged records the circuit's state for outbox.circuit.open.
func (p *PublisherObserver) CircuitChanged(_ context.Context, open bool) { p.open.Store(open) }
