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
	dests        outbox.TransportDestination // nil when the transport does not tell
	open         atomic.Bool
	circuitAttrs attribute.Set
}

var (
	_ outbox.PublisherObserver = (*PublisherObserver)(nil)
	_ outbox.CircuitObserver   = (*PublisherObserver)(nil)
)

// PublisherObserver returns the observer of a publisher that publishes through tr. When tr
// implements [outbox.TransportDestination] (every built-in transport does), send spans and
// metrics carry the broker's destination (messaging.destination.name: the NATS subject, the
// Kafka topic, the AMQP exchange, ...) and server.address and server.port; otherwise the
// destination is the outbox topic. messaging.system is [Options.System], as on every span of
// the Telemetry. name identifies the publisher on outbox.circuit.open (its namespace, say).
// Call [PublisherObserver.Close] when the publisher is gone: its circuit then reads 0.
func (t *Telemetry) PublisherObserver(tr outbox.Transport, name string) *PublisherObserver {
	p := &PublisherObserver{t: t,
		circuitAttrs: attribute.NewSet(PublisherKey.String(name), semconv.MessagingSystemKey.String(t.system))}
	p.dests, _ = tr.(outbox.TransportDestination)
	t.mu.Lock()
	t.publishers[p] = struct{}{}
	delete(t.closedCircuits, p.circuitAttrs.Equivalent())
	t.mu.Unlock()
	return p
}

// Close stops observing the publisher: its outbox.circuit.open reads 0 from then on (until
// an observer of the same name and system takes over), rather than vanishing, so that an
// alert on it resolves.
func (p *PublisherObserver) Close() {
	p.t.mu.Lock()
	defer p.t.mu.Unlock()
	if _, ok := p.t.publishers[p]; !ok {
		return
	}
	delete(p.t.publishers, p)
	p.t.closedCircuits[p.circuitAttrs.Equivalent()] = p.circuitAttrs
}

// destination returns where the transport sends d: the broker's destination and server,
// or the outbox topic alone when the transport does not tell.
func (p *PublisherObserver) destination(d *outbox.Delivery) outbox.Destination {
	if p.dests != nil {
		if dst := p.dests.Destination(*d); dst.Name != "" {
			return dst
		}
	}
	return outbox.Destination{Name: d.Topic}
}

// destAttrs returns the attributes of a destination: messaging.destination.name,
// server.address and server.port, and the AMQP routing key, those that are known.
func destAttrs(attrs []attribute.KeyValue, dst outbox.Destination) []attribute.KeyValue {
	if dst.Name != "" {
		attrs = append(attrs, semconv.MessagingDestinationName(dst.Name))
	}
	if dst.RoutingKey != "" {
		attrs = append(attrs, semconv.MessagingRabbitMQDestinationRoutingKey(dst.RoutingKey))
	}
	if dst.ServerAddress != "" {
		attrs = append(attrs, semconv.ServerAddress(dst.ServerAddress))
		if dst.ServerPort > 0 {
			attrs = append(attrs, semconv.ServerPort(dst.ServerPort))
		}
	}
	return attrs
}

// publishState is what StartPublish hands EndPublish.
type publishState struct {
	began time.Time
	// dests holds each message's destination. dest is the batch's when all of them share
	// it, else only what they share (the server, say), and topic the batch's outbox topic,
	// "" when it has several.
	dests []outbox.Destination
	dest  outbox.Destination
	topic string
	spans []trace.Span // one per message with SpanPerMessage, else one
}

type publishKey struct{}

// StartPublish starts the send span (or spans) and returns the context the transport
// receives: the batch's span in it, unless there is one per message.
func (p *PublisherObserver) StartPublish(ctx context.Context, batch []outbox.Delivery) context.Context {
	t := p.t
	st := &publishState{began: time.Now(), topic: batch[0].Topic, dests: make([]outbox.Destination, len(batch))}
	for i := range batch {
		st.dests[i] = p.destination(&batch[i])
		if batch[i].Topic != st.topic {
			st.topic = ""
		}
	}
	st.dest = common(st.dests)
	base := []attribute.KeyValue{
		semconv.MessagingSystemKey.String(t.system),
		semconv.MessagingOperationName("send"),
		semconv.MessagingOperationTypeSend,
	}
	if t.perMessage {
		st.spans = make([]trace.Span, len(batch))
		for i := range batch {
			d := &batch[i]
			attrs := destAttrs(base[:len(base):len(base)], st.dests[i])
			attrs = append(attrs, semconv.MessagingMessageID(d.ID.String()), NamespaceKey.String(d.Namespace), TopicKey.String(d.Topic))
			opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...)}
			if sc := t.creation(d); sc.IsValid() {
				opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
			}
			_, st.spans[i] = t.tracer.Start(ctx, spanName("send", st.dests[i]), opts...)
		}
		return context.WithValue(ctx, publishKey{}, st)
	}
	attrs := destAttrs(base, st.dest)
	if st.topic != "" {
		attrs = append(attrs, TopicKey.String(st.topic))
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
	ctx, span := t.tracer.Start(ctx, spanName("send", st.dest), trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...), trace.WithLinks(links...))
	st.spans = []trace.Span{span}
	return context.WithValue(ctx, publishKey{}, st)
}

// common returns what every destination of a batch shares: the whole destination, or the
// server alone when the names differ, or nothing.
func common(dests []outbox.Destination) outbox.Destination {
	c := dests[0]
	for _, d := range dests[1:] {
		if d.Name != c.Name || d.RoutingKey != c.RoutingKey {
			c.Name, c.RoutingKey = "", ""
		}
		if d.ServerAddress != c.ServerAddress || d.ServerPort != c.ServerPort {
			c.ServerAddress, c.ServerPort = "", 0
		}
	}
	return c
}

// spanName is "<operation> <destination>", or the operation alone when the batch has
// several destinations, as the conventions name messaging spans.
func spanName(op string, dst outbox.Destination) string {
	if dst.Name == "" {
		return op
	}
	return op + " " + dst.Name
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
	sent := map[outbox.Destination]int64{}
	for i := range batch {
		r := results[i]
		d := &batch[i]
		span := st.spans[0]
		if t.perMessage {
			span = st.spans[i]
		}
		if r.Outcome == outbox.AttemptDelivered || r.Outcome == outbox.AttemptReleased {
			if r.Outcome == outbox.AttemptDelivered {
				sent[st.dests[i]]++
			}
			if t.perMessage { // a released message was not tried: it failed nothing
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
			t.opDuration.Record(ctx, elapsed, "send", systemAttr(t.system),
				destAttrs([]attribute.KeyValue{semconv.MessagingOperationTypeSend, semconv.ErrorTypeKey.String(errorType(r.Err))}, st.dests[i])...)
		}
	}
	if !t.perMessage {
		if firstErr != nil {
			failSpan(st.spans[0], firstErr)
		}
		st.spans[0].End()
		attrs := destAttrs([]attribute.KeyValue{semconv.MessagingOperationTypeSend}, st.dest)
		if firstErr != nil {
			attrs = append(attrs, semconv.ErrorTypeKey.String(errorType(firstErr)))
		}
		t.opDuration.Record(ctx, elapsed, "send", systemAttr(t.system), attrs...)
	} else {
		for dst := range sent {
			t.opDuration.Record(ctx, elapsed, "send", systemAttr(t.system), destAttrs([]attribute.KeyValue{semconv.MessagingOperationTypeSend}, dst)...)
		}
	}
	for dst, n := range sent {
		t.sent.Add(ctx, n, "send", systemAttr(t.system), destAttrs(nil, dst)...)
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
// delivered messages. Both are the outbox's own metrics, by outbox namespace and topic.
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
		if s.Outcome == outbox.AttemptReleased {
			continue // given back untried: not an attempt
		}
		counts[key{s.Namespace, s.Topic, s.Outcome}]++
		if s.Outcome != outbox.AttemptDelivered || s.CreatedAt.IsZero() {
			continue
		}
		k := [2]string{s.Namespace, s.Topic}
		opt, ok := lagAttrs[k]
		if !ok {
			opt = metric.WithAttributeSet(attribute.NewSet(NamespaceKey.String(s.Namespace),
				TopicKey.String(s.Topic), semconv.MessagingSystemKey.String(t.system)))
			lagAttrs[k] = opt
		}
		t.lag.Record(ctx, max(now.Sub(s.CreatedAt), 0).Seconds(), opt)
	}
	for k, n := range counts {
		attrs := []attribute.KeyValue{OutcomeKey.String(string(k.outcome)), semconv.MessagingSystemKey.String(t.system)}
		if k.topic != "" { // a row the sweep buried, not read back, has only its id
			attrs = append(attrs, NamespaceKey.String(k.ns), TopicKey.String(k.topic))
		}
		t.attempts.Add(ctx, n, metric.WithAttributes(attrs...))
	}
}

// CircuitChanged records the circuit's state for outbox.circuit.open.
func (p *PublisherObserver) CircuitChanged(_ context.Context, open bool) { p.open.Store(open) }
