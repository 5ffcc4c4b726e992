package outboxotel

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxgo/outbox/inbox"
)

// InboxObserver returns the observer to set in [inbox.Options.Observer]: a "process
// <destination>" span (kind CONSUMER) around each [inbox.Inbox.Process], a child of the
// caller's span (the consumer's receive span, if any) that links to the producer's creation
// context, read from the headers attached with [inbox.WithMessage]. The handler runs in
// it.
func (t *Telemetry) InboxObserver() inbox.Observer { return inboxObserver{t} }

type inboxObserver struct{ t *Telemetry }

type processStartKey struct{}

func (o inboxObserver) StartProcess(ctx context.Context, d inbox.Delivery) context.Context {
	t := o.t
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemKey.String(t.system),
		semconv.MessagingOperationName("process"),
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingConsumerGroupName(d.Group),
		semconv.MessagingMessageID(d.MessageID),
	}
	name := "process"
	if d.Destination != "" {
		attrs = append(attrs, semconv.MessagingDestinationName(d.Destination))
		name += " " + d.Destination
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...)}
	if len(d.Headers) > 0 {
		if sc := trace.SpanContextFromContext(t.prop.Extract(context.Background(), carrier(d.Headers))); sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
		}
	}
	ctx, _ = t.tracer.Start(ctx, name, opts...)
	return context.WithValue(ctx, processStartKey{}, time.Now())
}

func (o inboxObserver) EndProcess(ctx context.Context, d inbox.Delivery, res inbox.Result, err error) {
	t := o.t
	span := trace.SpanFromContext(ctx)
	var attrs []attribute.KeyValue
	if d.Destination != "" {
		attrs = append(attrs, semconv.MessagingDestinationName(d.Destination))
	}
	attrs = append(attrs, semconv.MessagingOperationTypeProcess, semconv.MessagingConsumerGroupName(d.Group))
	switch {
	case err != nil:
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(semconv.ErrorTypeOther)
		attrs = append(attrs, semconv.ErrorTypeOther)
	case res.Duplicate:
		span.SetAttributes(DuplicateKey.Bool(true))
	}
	span.End()
	if began, ok := ctx.Value(processStartKey{}).(time.Time); ok {
		t.opDuration.Record(ctx, time.Since(began).Seconds(), "process", systemAttr(t.system), attrs...)
	}
}
