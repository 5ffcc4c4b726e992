package integration_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/inbox"
	"github.com/outboxgo/outbox/migrations"
	outboxotel "github.com/outboxgo/outbox/otel"
	"github.com/outboxgo/outbox/outboxtest/testdb"
	outboxnats "github.com/outboxgo/outbox/transport/nats"
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

func driver(backend string) string {
	if backend == "postgres" {
		return "pgx"
	}
	return "sqlite"
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

// --- a trace across processes and a broker -----------------------------------------------

// Environment of the publisher child process.
const (
	childEnv        = "OUTBOX_OTEL_CHILD"
	childBackendEnv = "OUTBOX_OTEL_CHILD_BACKEND"
	childDSNEnv     = "OUTBOX_OTEL_CHILD_DSN"
	childNSEnv      = "OUTBOX_OTEL_CHILD_NS"
	childCountEnv   = "OUTBOX_OTEL_CHILD_COUNT"
)

// spanJSON is a span the child recorded, as it prints it.
type spanJSON struct {
	Name     string   `json:"name"`
	Kind     string   `json:"kind"`
	TraceID  string   `json:"trace_id"`
	Links    []string `json:"links"` // "traceid/spanid"
	Messages int64    `json:"messages"`
	System   string   `json:"system"`
}

// TestPublisherChildProcess is not a test: it is the publisher process of
// TestTraceAcrossProcesses, and returns at once in a normal run. It publishes the
// namespace's rows to NATS with telemetry on, and prints its spans as JSON lines once they
// are all delivered.
func TestPublisherChildProcess(t *testing.T) {
	if os.Getenv(childEnv) != "1" {
		return
	}
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
	backend, ns := os.Getenv(childBackendEnv), os.Getenv(childNSEnv)
	var want int64
	_, _ = fmt.Sscan(os.Getenv(childCountEnv), &want)
	db, err := sql.Open(driver(backend), os.Getenv(childDSNEnv))
	if err != nil {
		fail(err)
	}
	store, err := outbox.New(db, dialect(backend), outbox.Options{})
	if err != nil {
		fail(err)
	}
	tel := newTelemetry(t, outboxotel.Options{System: "nats"}) // as in the enqueuing process
	nc, err := nats.Connect(testdb.Service(t, "nats", "OUTBOX_NATS_URL", "nats://127.0.0.1:4222"))
	if err != nil {
		fail(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		fail(err)
	}
	tr, err := outboxnats.New(js, outboxnats.Options{})
	if err != nil {
		fail(err)
	}
	o := fast(ns)
	o.Observer = tel.tel.PublisherObserver(tr, ns)
	p, err := outbox.NewPublisher(store, tr, o)
	if err != nil {
		fail(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	deadline := time.Now().Add(time.Minute)
	for p.Stats().Delivered < want {
		if time.Now().After(deadline) {
			fail(fmt.Errorf("delivered %d of %d", p.Stats().Delivered, want))
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		fail(err)
	}
	enc := json.NewEncoder(os.Stdout)
	for _, s := range tel.spans.Ended() {
		j := spanJSON{Name: s.Name(), Kind: s.SpanKind().String(), TraceID: s.SpanContext().TraceID().String()}
		for _, l := range s.Links() {
			j.Links = append(j.Links, l.SpanContext.TraceID().String()+"/"+l.SpanContext.SpanID().String())
		}
		for _, a := range s.Attributes() {
			switch a.Key {
			case "messaging.batch.message_count":
				j.Messages = a.Value.AsInt64()
			case "messaging.system":
				j.System = a.Value.AsString()
			}
		}
		_ = enc.Encode(j)
	}
	os.Exit(0)
}

// runChild publishes ns's n rows in a child process and returns the spans it printed.
func runChild(t *testing.T, e *env, ns string, n int) []spanJSON {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPublisherChildProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1", childBackendEnv+"="+e.backend, childDSNEnv+"="+e.dsn,
		childNSEnv+"="+ns, fmt.Sprintf("%s=%d", childCountEnv, n))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "child: %s", stderr.String())
	var spans []spanJSON
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "{") {
			continue // the test binary's own lines
		}
		var s spanJSON
		require.NoError(t, json.Unmarshal([]byte(line), &s))
		spans = append(spans, s)
	}
	return spans
}

// traceRun is what one run of the cross-process scenario saw.
type traceRun struct {
	request    trace.SpanContext
	callers    string // the traceparent the caller set on its own message
	ids        []uuid.UUID
	rows       map[uuid.UUID]outbox.Headers
	creates    []sdktrace.ReadOnlySpan
	sends      []spanJSON
	brokered   map[uuid.UUID]map[string]string // headers of the broker message
	consumers  map[uuid.UUID]trace.SpanContext
	processes  []sdktrace.ReadOnlySpan
	ownCreated trace.SpanContext
	ns         string
	spans      []sdktrace.ReadOnlySpan // every span of this process
}

// crossProcess enqueues two messages in a request span (one with the caller's own
// traceparent), publishes them to NATS from another process, and consumes them as a
// service would: a span continuing the context read from the broker message, and
// inbox.Process with the telemetry's observer. hooks wraps the telemetry's hooks (tests
// break them on purpose).
func crossProcess(t *testing.T, backend string, wrap func(outbox.EnqueueHook) outbox.EnqueueHook) *traceRun {
	tm := newTelemetry(t, outboxotel.Options{System: "nats"})
	hooks := tm.tel.StoreHooks()
	hooks.Enqueue = wrap(hooks.Enqueue)
	e := setup(t, backend, hooks)
	ctx := context.Background()

	nc, err := nats.Connect(testdb.Service(t, "nats", "OUTBOX_NATS_URL", "nats://127.0.0.1:4222"))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ns := "otel" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: ns, Subjects: []string{ns + ".>"}, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), ns) })

	r := &traceRun{ns: ns, rows: map[uuid.UUID]outbox.Headers{}, brokered: map[uuid.UUID]map[string]string{}, consumers: map[uuid.UUID]trace.SpanContext{}}
	// The caller's own context: a span of another trace, in W3C form.
	_, own := tm.tp.Tracer("caller").Start(ctx, "callers-own")
	own.End()
	r.ownCreated = own.SpanContext()
	r.callers = fmt.Sprintf("00-%s-%s-01", own.SpanContext().TraceID(), own.SpanContext().SpanID())

	rctx, req := tm.tp.Tracer("app").Start(ctx, "POST /orders")
	r.request = req.SpanContext()
	tx, err := e.db.BeginTx(rctx, nil)
	require.NoError(t, err)
	res, err := e.store.EnqueueBatch(rctx, tx, []outbox.Message{
		{Namespace: ns, Topic: "order.created", Payload: []byte(`{"order":1}`)},
		{Namespace: ns, Topic: "order.created", Headers: outbox.Headers{"traceparent": r.callers}, Payload: []byte(`{"order":2}`)},
	})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	req.End()
	for _, x := range res {
		r.ids = append(r.ids, x.ID)
		rec, err := e.store.Get(ctx, x.ID)
		require.NoError(t, err)
		r.rows[x.ID] = rec.Headers
	}
	for _, sp := range tm.spans.Ended() {
		if strings.HasPrefix(sp.Name(), "create ") {
			r.creates = append(r.creates, sp)
		}
	}

	r.sends = runChild(t, e, ns, len(r.ids))

	// The consumer: an ordered consumer on the stream, and the inbox with the observer.
	in, err := inbox.New(e.db, backend, inbox.Options{Observer: tm.tel.InboxObserver()})
	require.NoError(t, err)
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	prop := propagation.TraceContext{}
	for len(r.brokered) < len(r.ids) {
		batch, err := c.Fetch(len(r.ids)-len(r.brokered), jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		n := 0
		for m := range batch.Messages() {
			n++
			h := map[string]string{}
			for k, vs := range m.Headers() {
				h[k] = vs[0]
			}
			id := uuid.MustParse(h[jetstream.MsgIDHeader])
			r.brokered[id] = h
			cctx := prop.Extract(ctx, outboxnats.HeaderCarrier(m.Headers()))
			cctx, span := tm.tp.Tracer("consumer").Start(cctx, "receive "+m.Subject(), trace.WithSpanKind(trace.SpanKindConsumer))
			r.consumers[id] = span.SpanContext()
			pctx := inbox.WithMessage(cctx, inbox.Message{Destination: m.Subject(), Headers: h})
			_, err := in.Process(pctx, "billing", id.String(), func(context.Context, *sql.Tx) error { return nil })
			require.NoError(t, err)
			span.End()
			require.NoError(t, m.Ack())
		}
		require.NoError(t, batch.Error())
		require.NotZero(t, n, "consumer stalled")
	}
	r.spans = tm.spans.Ended()
	for _, sp := range r.spans {
		if strings.HasPrefix(sp.Name(), "process ") {
			r.processes = append(r.processes, sp)
		}
	}
	return r
}

// check says what is wrong with a run, or nil: the checks of one trace from the request to
// the consumer.
func (r *traceRun) check() error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(r.creates) != 2 {
		return fmt.Errorf("want 2 create spans, got %d", len(r.creates))
	}
	created := map[string]trace.SpanContext{} // message id -> its creation context
	for _, sp := range r.creates {
		var id string
		for _, a := range sp.Attributes() {
			if a.Key == "messaging.message.id" {
				id = a.Value.AsString()
			}
		}
		created[id] = sp.SpanContext()
		if sp.SpanKind() != trace.SpanKindProducer || sp.Name() != "create order.created" {
			fail("create span %q is %s", sp.Name(), sp.SpanKind())
		}
		if sp.Parent().SpanID() != r.request.SpanID() || sp.SpanContext().TraceID() != r.request.TraceID() {
			fail("create span of %s is not a child of the request span", id)
		}
	}
	first, second := r.ids[0], r.ids[1]
	stored := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(r.rows[first]))
	if sc := trace.SpanContextFromContext(stored); !same(sc, created[first.String()]) {
		fail("the row's traceparent %q is not the create span's context", r.rows[first]["traceparent"])
	}
	if got := r.rows[second]["traceparent"]; got != r.callers {
		fail("the caller's own traceparent was replaced: %q, want %q", got, r.callers)
	}
	// The send span, in the other process, links to both creation contexts.
	linked := map[string]bool{}
	for _, s := range r.sends {
		if s.Kind != trace.SpanKindClient.String() || s.Name != "send "+r.ns+".order.created" || s.System != "nats" {
			fail("send span %+v", s)
		}
		for _, l := range s.Links {
			linked[l] = true
		}
	}
	for _, id := range []uuid.UUID{first, second} {
		want := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(r.rows[id])))
		if !want.IsValid() || !linked[want.TraceID().String()+"/"+want.SpanID().String()] {
			fail("no send span links to the stored context of %s (%v)", id, r.rows[id])
		}
	}
	// The broker message carries the stored context unchanged.
	for _, id := range r.ids {
		for _, k := range []string{"traceparent", "tracestate"} {
			if r.brokered[id][k] != r.rows[id][k] {
				fail("broker header %s of %s is %q, stored %q", k, id, r.brokered[id][k], r.rows[id][k])
			}
		}
	}
	// The consumer's span belongs to the producer's trace.
	if r.consumers[first].TraceID() != r.request.TraceID() {
		fail("the consumer's span is in trace %s, the request's is %s", r.consumers[first].TraceID(), r.request.TraceID())
	}
	if r.consumers[second].TraceID() != r.ownCreated.TraceID() {
		fail("the consumer of the caller's own context is in trace %s, want %s", r.consumers[second].TraceID(), r.ownCreated.TraceID())
	}
	// The inbox's process span links to the creation context.
	for _, sp := range r.processes {
		if sp.SpanKind() != trace.SpanKindConsumer {
			fail("process span is %s", sp.SpanKind())
		}
	}
	if len(r.processes) != 2 {
		fail("want 2 process spans, got %d", len(r.processes))
	}
	for _, sp := range r.processes {
		var id string
		for _, a := range sp.Attributes() {
			if a.Key == "messaging.message.id" {
				id = a.Value.AsString()
			}
		}
		want := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(r.rows[uuid.MustParse(id)])))
		if !slices.ContainsFunc(sp.Links(), func(l sdktrace.Link) bool { return same(l.SpanContext, want) }) {
			fail("the process span of %s does not link to its creation context", id)
		}
	}
	return errors.Join(errs...)
}

// same reports whether a and b are the same span (an extracted context is remote, the
// span it was taken from is not).
func same(a, b trace.SpanContext) bool {
	return a.IsValid() && a.TraceID() == b.TraceID() && a.SpanID() == b.SpanID()
}

func TestTraceAcrossProcesses(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			r := crossProcess(t, b, func(h outbox.EnqueueHook) outbox.EnqueueHook { return h })
			require.NoError(t, r.check())
			requireConventions(t, r.spans, "nats")
		})
	}
}

// droppingHook is a broken hook: it starts its span on a fresh context, dropping the
// caller's (the create span is a root, and the stored context is of another trace).
type droppingHook struct{ outbox.EnqueueHook }

func (h droppingHook) StartEnqueue(_ context.Context, m *outbox.Message) context.Context {
	return h.EnqueueHook.StartEnqueue(context.Background(), m)
}

// forgettingHook is a broken hook: it starts the span but stores no context in the
// headers.
type forgettingHook struct{ outbox.EnqueueHook }

func (h forgettingHook) StartEnqueue(ctx context.Context, m *outbox.Message) context.Context {
	ctx = h.EnqueueHook.StartEnqueue(ctx, m)
	delete(m.Headers, "traceparent")
	delete(m.Headers, "tracestate")
	return ctx
}

// TestBrokenHookIsCaught proves the checks of TestTraceAcrossProcesses: a hook that drops
// the caller's context, or that stores none, fails them.
func TestBrokenHookIsCaught(t *testing.T) {
	t.Parallel()
	for name, wrap := range map[string]func(outbox.EnqueueHook) outbox.EnqueueHook{
		"drops the caller's context": func(h outbox.EnqueueHook) outbox.EnqueueHook { return droppingHook{h} },
		"stores no context":          func(h outbox.EnqueueHook) outbox.EnqueueHook { return forgettingHook{h} },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := crossProcess(t, "sqlite", wrap).check()
			require.Error(t, err)
			t.Logf("caught: %v", err)
		})
	}
}
