package outboxotel_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxgo/outbox"
	outboxotel "github.com/outboxgo/outbox/otel"
)

// BenchmarkObserverBatch is what the publisher's observer costs per batch of 100 delivered
// messages, each with a stored creation context: StartPublish, EndPublish and Settled, with
// every span sampled and batched to a no-op exporter.
func BenchmarkObserverBatch(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tel, err := outboxotel.New(outboxotel.Options{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		b.Fatal(err)
	}
	tr := outbox.TransportFunc(func(context.Context, []outbox.Delivery) []error { return nil })
	obs := tel.PublisherObserver(tr, "bench")
	ctx := context.Background()
	batch := make([]outbox.Delivery, 100)
	results := make([]outbox.AttemptResult, len(batch))
	settled := make([]outbox.Settled, len(batch))
	for i := range batch {
		_, span := tp.Tracer("b").Start(ctx, "create")
		h := outbox.Headers{}
		propagation.TraceContext{}.Inject(sdktraceCtx(ctx, span), propagation.MapCarrier(h))
		span.End()
		batch[i] = outbox.Delivery{ID: uuid.New(), Namespace: "shop", Topic: "order.created", Headers: h, Attempt: 1,
			Payload: []byte(fmt.Sprintf(`{"n":%d}`, i)), CreatedAt: time.Now()}
		results[i] = outbox.AttemptResult{Outcome: outbox.AttemptDelivered}
		settled[i] = outbox.Settled{Delivery: batch[i], AttemptResult: results[i]}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		c := obs.StartPublish(ctx, batch)
		obs.EndPublish(c, batch, results)
		obs.Settled(ctx, settled)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch)), "ns/msg")
}

func sdktraceCtx(ctx context.Context, span interface{ SpanContext() trace.SpanContext }) context.Context {
	return trace.ContextWithSpanContext(ctx, span.SpanContext())
}
