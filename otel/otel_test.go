package outboxotel_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/inbox"
	"github.com/outboxgo/outbox/migrations"
	outboxotel "github.com/outboxgo/outbox/otel"
	"github.com/outboxgo/outbox/outboxtest/testdb"
)

// backends are the databases every test runs on.
var backends = []string{"sqlite", "postgres"}

// telemetry is a Telemetry on an in-memory span recorder and a manual metric reader.
type telemetry struct {
	tel    *outboxotel.Telemetry
	tp     *sdktrace.TracerProvider
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
}

func newTelemetry(t testing.TB, opts outboxotel.Options) *telemetry {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(sr))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) })
	opts.TracerProvider, opts.MeterProvider = tp, mp
	tel, err := outboxotel.New(opts)
	require.NoError(t, err)
	return &telemetry{tel: tel, tp: tp, spans: sr, reader: reader}
}

// env is a migrated database with a store whose enqueue hook is hook.
type env struct {
	backend string
	db      *sql.DB
	dsn     string
	store   *outbox.Store
}

func setup(t *testing.T, backend string, hooks outbox.StoreHooks) *env {
	t.Helper()
	db := testdb.Open(t, backend)
	ctx := context.Background()
	require.NoError(t, migrations.Up(ctx, db, backend, migrations.Options{}))
	require.NoError(t, inbox.MigrateUp(ctx, db, backend, inbox.MigrateOptions{}))
	store, err := outbox.New(db, dialect(backend), outbox.Options{Hooks: hooks})
	require.NoError(t, err)
	return &env{backend: backend, db: db, dsn: testdb.DSN(t, backend, db), store: store}
}

func dialect(backend string) outbox.Dialect {
	if backend == "postgres" {
		return outbox.Postgres()
	}
	return outbox.SQLite()
}

func run(t *testing.T, p *outbox.Publisher) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			require.NoError(t, <-done)
		})
	}
	t.Cleanup(stop)
	return stop
}

func fast(ns string) outbox.PublisherOptions {
	return outbox.PublisherOptions{Scope: outbox.Scope{Namespace: ns}, BatchSize: 10, PollInterval: 20 * time.Millisecond,
		IdleBackoffMax: 50 * time.Millisecond, Lease: 5 * time.Second, SweepInterval: time.Hour,
		Retry: outbox.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond, MaxAttempts: 5}}
}

// --- a retry, and metrics ------------------------------------------------------------------

func TestRetryThenSuccess(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			tm := newTelemetry(t, outboxotel.Options{System: "test"})
			e := setup(t, b, tm.tel.StoreHooks())
			ns := "retry" + uuid.NewString()[:8]
			rs, err := e.store.EnqueueStandalone(context.Background(), outbox.Message{Namespace: ns, Topic: "t", Payload: []byte(`{}`)})
			require.NoError(t, err)
			var mu sync.Mutex
			tries := 0
			tr := outbox.PerMessage(func(context.Context, outbox.Delivery) error {
				mu.Lock()
				defer mu.Unlock()
				tries++
				if tries == 1 {
					return errors.New("broker said no")
				}
				return nil
			})
			o := fast(ns)
			o.Observer = tm.tel.PublisherObserver(tr, ns)
			p, err := outbox.NewPublisher(e.store, tr, o)
			require.NoError(t, err)
			stop := run(t, p)
			testdb.Poll(t, 30*time.Second, "delivered", func() bool { return p.Stats().Delivered == 1 })
			stop()

			var sends []sdktrace.ReadOnlySpan
			var created trace.SpanContext
			for _, sp := range tm.spans.Ended() {
				switch {
				case strings.HasPrefix(sp.Name(), "send "):
					sends = append(sends, sp)
				case strings.HasPrefix(sp.Name(), "create "):
					created = sp.SpanContext()
				}
			}
			require.Len(t, sends, 2)
			for _, sp := range sends {
				require.Len(t, sp.Links(), 1)
				require.True(t, same(sp.Links()[0].SpanContext, created))
				require.Contains(t, sp.Attributes(), attribute.String("messaging.message.id", rs[0].ID.String()))
			}
			require.Equal(t, codes.Error, sends[0].Status().Code)
			require.Contains(t, sends[0].Attributes(), attribute.String("error.type", "_OTHER"))
			require.Len(t, sends[0].Events(), 1)
			require.Equal(t, outboxotel.EventRetryScheduled, sends[0].Events()[0].Name)
			require.Equal(t, codes.Unset, sends[1].Status().Code)
			require.Empty(t, sends[1].Events())

			retried, _ := sum(t, tm, "outbox.attempts", outboxotel.OutcomeKey.String("retried"))
			delivered, _ := sum(t, tm, "outbox.attempts", outboxotel.OutcomeKey.String("delivered"))
			sent, _ := sum(t, tm, "messaging.client.sent.messages")
			require.Equal(t, []float64{1, 1, 1}, []float64{retried, delivered, sent})
			requireConventions(t, tm.spans.Ended(), "test")
		})
	}
}

// TestReleasedIsNoFailure: in an ordered publisher's run, the messages behind a failed one
// are given back untried: no failure event, no attempt counted.
func TestReleasedIsNoFailure(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			tm := newTelemetry(t, outboxotel.Options{System: "test"})
			e := setup(t, b, tm.tel.StoreHooks())
			require.NoError(t, migrations.Up(context.Background(), e.db, b, migrations.Options{Ordered: true}))
			ns := "released" + uuid.NewString()[:8]
			msgs := make([]outbox.Message, 3)
			for i := range msgs {
				msgs[i] = outbox.Message{Namespace: ns, Topic: "t", PartitionKey: "k", Payload: []byte(`{}`)}
			}
			_, err := e.store.EnqueueStandalone(context.Background(), msgs...)
			require.NoError(t, err)
			var mu sync.Mutex
			tries := 0
			tr := outbox.PerMessage(func(context.Context, outbox.Delivery) error {
				mu.Lock()
				defer mu.Unlock()
				tries++
				if tries == 1 {
					return errors.New("broker said no")
				}
				return nil
			})
			o := fast(ns)
			o.Ordered = true
			o.Observer = tm.tel.PublisherObserver(tr, ns)
			p, err := outbox.NewPublisher(e.store, tr, o)
			require.NoError(t, err)
			stop := run(t, p)
			testdb.Poll(t, 30*time.Second, "delivered", func() bool { return p.Stats().Delivered == 3 })
			stop()

			events := 0
			for _, sp := range tm.spans.Ended() {
				events += len(sp.Events())
			}
			require.Equal(t, 1, events, "one retry scheduled, for the message that failed")
			retried, _ := sum(t, tm, "outbox.attempts", outboxotel.OutcomeKey.String("retried"))
			delivered, _ := sum(t, tm, "outbox.attempts", outboxotel.OutcomeKey.String("delivered"))
			released, _ := sum(t, tm, "outbox.attempts", outboxotel.OutcomeKey.String("released"))
			require.Equal(t, []float64{1, 3, 0}, []float64{retried, delivered, released})
		})
	}
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			tm := newTelemetry(t, outboxotel.Options{})
			e := setup(t, b, tm.tel.StoreHooks())
			ns := "metrics" + uuid.NewString()[:8]
			const n, m = 25, 3
			msgs := make([]outbox.Message, 0, n+m)
			for i := range n + m {
				msgs = append(msgs, outbox.Message{Namespace: ns, Topic: "t", Payload: fmt.Appendf(nil, `{"dead":%t}`, i >= n)})
			}
			_, err := e.store.EnqueueStandalone(context.Background(), msgs...)
			require.NoError(t, err)

			const interval = 100 * time.Millisecond
			w, err := tm.tel.WatchStore(e.store, outboxotel.WatchOptions{Interval: interval, Scope: outbox.Scope{Namespace: ns}})
			require.NoError(t, err)
			began := time.Now()
			_, err = tm.tel.WatchStore(e.store, outboxotel.WatchOptions{})
			require.ErrorIs(t, err, outboxotel.ErrWatched)
			topic := []attribute.KeyValue{outboxotel.NamespaceKey.String(ns), outboxotel.TopicKey.String("t")}
			pending := append(topic[:2:2], outboxotel.StatusKey.String("pending"))
			testdb.Poll(t, 10*time.Second, "the pending gauge shows the backlog", func() bool {
				v, _ := sum(t, tm, "outbox.messages", pending...)
				return v == n+m
			})
			testdb.Poll(t, 10*time.Second, "the oldest undelivered age grows while nothing publishes", func() bool {
				v, ok := sum(t, tm, "outbox.oldest_undelivered.age", topic...)
				return ok && v > 0
			})

			tr := outbox.PerMessage(func(_ context.Context, d outbox.Delivery) error {
				if strings.Contains(string(d.Payload), "true") {
					return outbox.Permanent(errors.New("refused"))
				}
				return nil
			})
			o := fast(ns)
			o.Observer = tm.tel.PublisherObserver(tr, ns)
			p, err := outbox.NewPublisher(e.store, tr, o)
			require.NoError(t, err)
			stop := run(t, p)
			testdb.Poll(t, 30*time.Second, "settled", func() bool { s := p.Stats(); return s.Delivered == n && s.Dead == m })
			stop()

			testdb.Poll(t, 10*time.Second, "the pending gauge falls to 0 and dead shows M", func() bool {
				v, ok := sum(t, tm, "outbox.messages", pending...)
				d, _ := sum(t, tm, "outbox.messages", append(topic[:2:2], outboxotel.StatusKey.String("dead"))...)
				u, _ := sum(t, tm, "outbox.oldest_undelivered.age", topic...)
				return ok && v == 0 && d == m && u == 0
			})
			w.Close()
			elapsed := time.Since(began)
			got := map[string]float64{}
			for _, k := range []string{"delivered", "dead", "retried", "unavailable"} {
				got[k], _ = sum(t, tm, "outbox.attempts", append(topic[:2:2], outboxotel.OutcomeKey.String(k))...)
			}
			require.Equal(t, map[string]float64{"delivered": n, "dead": m, "retried": 0, "unavailable": 0}, got)
			sent, _ := sum(t, tm, "messaging.client.sent.messages", attribute.String("messaging.destination.name", "t"))
			require.EqualValues(t, n, sent)
			require.Equal(t, "Messages the broker accepted (failed sends are counted in outbox.attempts).",
				description(t, tm, "messaging.client.sent.messages"), "the HELP text says what is counted")
			lag, _ := sum(t, tm, "outbox.delivery.lag", topic...)
			require.EqualValues(t, n, lag)
			sends, _ := sum(t, tm, "messaging.client.operation.duration", attribute.String("messaging.operation.name", "send"))
			creates, _ := sum(t, tm, "messaging.client.operation.duration", attribute.String("messaging.operation.name", "create"))
			require.Positive(t, sends)
			require.EqualValues(t, n+m, creates)
			// One Stats query at start and one per interval, whatever the collections.
			q := w.Queries()
			require.LessOrEqual(t, q, int64(elapsed/interval)+2)
			t.Logf("%d Stats queries in %s at one per %s", q, elapsed.Round(time.Millisecond), interval)
		})
	}
}

// same reports whether a and b are the same span (an extracted context is remote, the
// span it was taken from is not).
func same(a, b trace.SpanContext) bool {
	return a.IsValid() && a.TraceID() == b.TraceID() && a.SpanID() == b.SpanID()
}

// sum returns the sum of a counter's points, or the count of a histogram's, whose attributes
// include want.
func sum(t *testing.T, tm *telemetry, name string, want ...attribute.KeyValue) (float64, bool) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, tm.reader.Collect(context.Background(), &rm))
	match := func(set attribute.Set) bool {
		for _, kv := range want {
			if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
				return false
			}
		}
		return true
	}
	total, found := 0.0, false
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						total, found = total+float64(p.Value), true
					}
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						total, found = total+float64(p.Value), true
					}
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						total, found = total+p.Value, true
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						total, found = total+float64(p.Count), true
					}
				}
			}
		}
	}
	return total, found
}

// requireConventions checks every messaging span against the attributes the messaging
// semantic conventions (1.43.0) require of it: messaging.system (the same on every span)
// and messaging.operation.name always; messaging.operation.type; the destination the span
// is named after; messaging.batch.message_count on a send of several messages, or
// messaging.message.id on one of a single message; error.type on a failed span; server.port
// beside server.address.
func requireConventions(t *testing.T, spans []sdktrace.ReadOnlySpan, system string) {
	t.Helper()
	n := 0
	for _, sp := range spans {
		attrs := attribute.NewSet(sp.Attributes()...)
		op, ok := attrs.Value("messaging.operation.name")
		if !ok {
			continue // not a messaging span (the request's, say)
		}
		n++
		str := func(k attribute.Key) string {
			v, ok := attrs.Value(k)
			require.True(t, ok, "span %q has no %s", sp.Name(), k)
			require.NotEmpty(t, v.String(), "span %q: empty %s", sp.Name(), k)
			return v.String()
		}
		require.Equal(t, system, str("messaging.system"), "span %q", sp.Name())
		require.Equal(t, op.AsString(), str("messaging.operation.type"), "span %q", sp.Name())
		if dest, ok := strings.CutPrefix(sp.Name(), op.AsString()+" "); ok {
			require.Equal(t, dest, str("messaging.destination.name"), "span %q is named after its destination", sp.Name())
		}
		if op.AsString() == "send" {
			if _, one := attrs.Value("messaging.message.id"); !one {
				c, err := strconv.Atoi(str("messaging.batch.message_count"))
				require.NoError(t, err)
				require.GreaterOrEqual(t, c, 2, "span %q", sp.Name())
			}
		}
		if sp.Status().Code == codes.Error {
			str("error.type")
		}
		if _, ok := attrs.Value("server.address"); ok {
			str("server.port")
		}
		require.Contains(t, []trace.SpanKind{trace.SpanKindProducer, trace.SpanKindClient, trace.SpanKindConsumer}, sp.SpanKind(), "span %q", sp.Name())
	}
	require.NotZero(t, n, "no messaging span")
}

// description returns the description (the Prometheus HELP text) of a metric.
func description(t *testing.T, tm *telemetry, name string) string {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, tm.reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m.Description
			}
		}
	}
	t.Fatalf("no metric %s", name)
	return ""
}

// outbox.listener.connected follows the state function: 1 connected, 0 down, absent when the
// publisher polls by design or the watch is stopped. The log reader's gauges and counter
// report what its function returns.
func TestWatchListenerAndLogReader(t *testing.T) {
	t.Parallel()
	tm := newTelemetry(t, outboxotel.Options{})
	var mu sync.Mutex
	state := outbox.ListenerConnected
	stopListener := tm.tel.WatchListener("shop", func() outbox.ListenerState { mu.Lock(); defer mu.Unlock(); return state })
	set := func(s outbox.ListenerState) { mu.Lock(); state = s; mu.Unlock() }
	shop := outboxotel.PublisherKey.String("shop")

	v, ok := sum(t, tm, "outbox.listener.connected", shop)
	require.True(t, ok)
	require.Equal(t, 1.0, v)
	set(outbox.ListenerDown)
	v, ok = sum(t, tm, "outbox.listener.connected", shop)
	require.True(t, ok)
	require.Equal(t, 0.0, v)
	set(outbox.ListenerNone)
	_, ok = sum(t, tm, "outbox.listener.connected", shop)
	require.False(t, ok, "a publisher that polls by design has no listener to report")
	set(outbox.ListenerDown)
	stopListener()
	_, ok = sum(t, tm, "outbox.listener.connected", shop)
	require.False(t, ok)

	stopLog := tm.tel.WatchLogReader("outbox", func() outboxotel.LogReaderStats {
		return outboxotel.LogReaderStats{Reading: true, SlotLagBytes: 10, RetainedWALBytes: 20, SlotResets: 2}
	})
	slot := outboxotel.SlotKey.String("outbox")
	for name, want := range map[string]float64{
		"outbox.log.reading": 1, "outbox.log.slot.lag": 10, "outbox.log.slot.retained_wal": 20, "outbox.log.slot.resets": 2,
	} {
		v, ok := sum(t, tm, name, slot)
		require.True(t, ok, name)
		require.Equal(t, want, v, name)
	}
	stopLog()
	_, ok = sum(t, tm, "outbox.log.slot.lag", slot)
	require.False(t, ok)
}

// Two stores watched by one Telemetry, with topics of the same name, report apart under
// their names.
func TestWatchStoresByName(t *testing.T) {
	t.Parallel()
	tm := newTelemetry(t, outboxotel.Options{})
	ctx := context.Background()
	for i, name := range []string{"a", "b"} {
		e := setup(t, "sqlite", outbox.StoreHooks{})
		tx, err := e.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		for range i + 1 {
			_, err = e.store.Enqueue(ctx, tx, outbox.Message{Namespace: "shop", Topic: "order.created", Payload: []byte(`{}`)})
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit())
		w, err := tm.tel.WatchStore(e.store, outboxotel.WatchOptions{Interval: time.Hour, Name: name})
		require.NoError(t, err)
		t.Cleanup(w.Close)
		w.Refresh(ctx)
	}
	for name, want := range map[string]float64{"a": 1, "b": 2} {
		v, ok := sum(t, tm, "outbox.messages", outboxotel.StoreKey.String(name), outboxotel.StatusKey.String("pending"))
		require.True(t, ok, name)
		require.Equal(t, want, v, name)
	}
}
