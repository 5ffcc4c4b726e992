package outboxotel

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxgo/outbox"
)

// enqueueHook is the [outbox.EnqueueHook] of a Telemetry.
type enqueueHook struct{ t *Telemetry }

type enqueueStartKey struct{}

// StartEnqueue starts the create span and stores its context in the headers, unless the
// caller set the propagator's fields already: the caller's context is then kept, and
// linked.
func (h enqueueHook) StartEnqueue(ctx context.Context, m *outbox.Message) context.Context {
	t := h.t
	own := false
	for _, f := range t.fields {
		if _, ok := m.Headers[f]; ok {
			own = true
			break
		}
	}
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemKey.String(t.system),
		semconv.MessagingOperationName("create"),
		semconv.MessagingOperationTypeCreate,
		semconv.MessagingDestinationName(m.Topic),
		NamespaceKey.String(m.Namespace),
		TopicKey.String(m.Topic),
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...)}
	if own {
		if sc := trace.SpanContextFromContext(t.prop.Extract(context.Background(), carrier(m.Headers))); sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
		}
	}
	ctx, _ = t.tracer.Start(ctx, "create "+m.Topic, opts...)
	if !own {
		if m.Headers == nil {
			m.Headers = outbox.Headers{}
		}
		t.prop.Inject(ctx, carrier(m.Headers))
	}
	return context.WithValue(ctx, enqueueStartKey{}, time.Now())
}

// EndEnqueue ends the create span with the message id, or the error, and records the
// operation's duration.
func (h enqueueHook) EndEnqueue(ctx context.Context, m outbox.Message, res outbox.Result, err error) {
	t := h.t
	span := trace.SpanFromContext(ctx)
	var et string
	switch {
	case err != nil:
		et = "enqueue"
		if _, ok := err.(*outbox.ValidationError); ok {
			et = "invalid"
		}
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(semconv.ErrorTypeKey.String(et))
	case res.Duplicate:
		span.SetAttributes(DuplicateKey.Bool(true))
	default:
		span.SetAttributes(semconv.MessagingMessageID(res.ID.String()))
	}
	span.End()
	if began, ok := ctx.Value(enqueueStartKey{}).(time.Time); ok {
		attrs := []attribute.KeyValue{semconv.MessagingDestinationName(m.Topic), semconv.MessagingOperationTypeCreate}
		if et != "" {
			attrs = append(attrs, semconv.ErrorTypeKey.String(et))
		}
		t.opDuration.Record(ctx, time.Since(began).Seconds(), "create", systemAttr(t.system), attrs...)
	}
}
