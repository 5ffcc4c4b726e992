package integration_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxgo/outbox"
	outboxotel "github.com/outboxgo/outbox/otel"
	"github.com/outboxgo/outbox/outboxtest/testdb"
	"github.com/outboxgo/outbox/transport/amqp"
	"github.com/outboxgo/outbox/transport/kafka"
	"github.com/outboxgo/outbox/transport/nats"
	"github.com/outboxgo/outbox/transport/redis"
	"github.com/outboxgo/outbox/transport/webhook"
)

// broker is one transport with a real consumer of its broker. consume returns the context
// the consumer extracted from the one message the publisher sent, as each transport's
// README shows, with the propagator the telemetry uses.
type broker struct {
	system  string
	tr      outbox.Transport
	dest    string // the broker's destination the message goes to
	host    string // the server's address and port the send span must carry
	port    int
	consume func(t *testing.T, prop propagation.TextMapPropagator) context.Context
}

// TestConsumerContinuesTrace: for every transport, an event enqueued in a request span is
// published with telemetry on, consumed by a real consumer of the broker that extracts the
// context from the broker's headers as the transport's README shows, and the consumer's
// context is the create span's, in the request's trace. The send span names the broker's
// destination and server, and every span carries the attributes the messaging conventions
// require, with one messaging.system.
func TestConsumerContinuesTrace(t *testing.T) {
	t.Parallel()
	for name, setupBroker := range map[string]func(t *testing.T, ns string) broker{
		"nats": natsBroker, "rabbitmq": amqpBroker, "redis": redisBroker, "kafka": kafkaBroker, "webhook": webhookBroker,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ns := "ct" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
			b := setupBroker(t, ns)
			tm := newTelemetry(t, outboxotel.Options{System: b.system})
			e := setup(t, "sqlite", tm.tel.StoreHooks())
			ctx := context.Background()

			rctx, req := tm.tp.Tracer("app").Start(ctx, "POST /orders")
			_, err := e.store.EnqueueStandalone(rctx, outbox.Message{Namespace: ns, Topic: "order.created", Payload: []byte(`{"order":1}`)})
			require.NoError(t, err)
			req.End()

			o := fast(ns)
			obs := tm.tel.PublisherObserver(b.tr, ns)
			o.Observer = obs
			p, err := outbox.NewPublisher(e.store, b.tr, o)
			require.NoError(t, err)
			stop := run(t, p)
			testdb.Poll(t, 30*time.Second, "delivered", func() bool { return p.Stats().Delivered == 1 })
			stop()

			got := trace.SpanContextFromContext(b.consume(t, propagation.TraceContext{}))
			var create, send sdktrace.ReadOnlySpan
			for _, sp := range tm.spans.Ended() {
				switch sp.SpanKind() {
				case trace.SpanKindProducer:
					create = sp
				case trace.SpanKindClient:
					send = sp
				}
			}
			require.NotNil(t, create)
			require.NotNil(t, send)
			require.True(t, got.IsValid(), "the consumer extracted no context")
			require.Equal(t, req.SpanContext().TraceID(), got.TraceID(), "the consumer is in the request's trace")
			require.Equal(t, create.SpanContext().SpanID(), got.SpanID(), "the consumer's parent is the create span")

			require.Equal(t, "send "+b.dest, send.Name())
			attrs := attribute.NewSet(send.Attributes()...)
			for k, want := range map[attribute.Key]attribute.Value{
				"messaging.destination.name": attribute.StringValue(b.dest),
				"server.address":             attribute.StringValue(b.host),
				"server.port":                attribute.IntValue(b.port),
				"outbox.topic":               attribute.StringValue("order.created"),
			} {
				v, ok := attrs.Value(k)
				require.True(t, ok, "send span has no %s", k)
				require.Equal(t, want, v, k)
			}
			requireConventions(t, tm.spans.Ended(), b.system)

			obs.Close()
			v, ok := gauge(t, tm, "outbox.circuit.open", outboxotel.PublisherKey.String(ns))
			require.True(t, ok, "outbox.circuit.open vanished when its observer closed")
			require.Zero(t, v)
		})
	}
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

// gauge returns the last value of an int64 gauge point with attrs.
func gauge(t *testing.T, tm *telemetry, name string, attrs ...attribute.KeyValue) (int64, bool) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, tm.reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			if g, ok := m.Data.(metricdata.Gauge[int64]); ok {
				for _, p := range g.DataPoints {
					if hasAll(p.Attributes, attrs) {
						return p.Value, true
					}
				}
			}
		}
	}
	return 0, false
}

func hasAll(set attribute.Set, attrs []attribute.KeyValue) bool {
	for _, a := range attrs {
		if v, ok := set.Value(a.Key); !ok || v != a.Value {
			return false
		}
	}
	return true
}

// --- the brokers and their consumers -------------------------------------------------------

func natsBroker(t *testing.T, ns string) broker {
	url := testdb.Service(t, "nats", "OUTBOX_NATS_URL", "nats://127.0.0.1:4222")
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := context.Background()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: ns, Subjects: []string{ns + ".>"}, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), ns) })
	tr, err := outboxnats.New(js, outboxnats.Options{})
	require.NoError(t, err)
	host, port := splitURL(t, nc.ConnectedUrl())
	return broker{system: tr.System(), tr: tr, dest: ns + ".order.created", host: host, port: port,
		consume: func(t *testing.T, prop propagation.TextMapPropagator) context.Context {
			c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
			require.NoError(t, err)
			msg, err := c.Next(jetstream.FetchMaxWait(10 * time.Second))
			require.NoError(t, err)
			// What the README shows; propagation.HeaderCarrier finds nothing here.
			require.False(t, trace.SpanContextFromContext(prop.Extract(ctx, propagation.HeaderCarrier(msg.Headers()))).IsValid())
			return prop.Extract(ctx, outboxnats.HeaderCarrier(msg.Headers()))
		}}
}

func amqpBroker(t *testing.T, ns string) broker {
	url := testdb.Service(t, "rabbitmq", "OUTBOX_AMQP_URL", outboxamqp.DefaultURL)
	conn, err := amqp091.Dial(url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclare(ns, "topic", false, true, false, false, nil))
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(q.Name, "order.created", ns, false, nil))
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	require.NoError(t, err)
	tr, err := outboxamqp.New(outboxamqp.Options{URL: url})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	uri, err := amqp091.ParseURI(url)
	require.NoError(t, err)
	return broker{system: tr.System(), tr: tr, dest: ns, host: uri.Host, port: uri.Port,
		consume: func(t *testing.T, prop propagation.TextMapPropagator) context.Context {
			select {
			case d := <-deliveries:
				h := propagation.MapCarrier{}
				for k, v := range d.Headers {
					if s, ok := v.(string); ok {
						h[k] = s
					}
				}
				return prop.Extract(context.Background(), h)
			case <-time.After(10 * time.Second):
				t.Fatal("no delivery")
				return nil
			}
		}}
}

func redisBroker(t *testing.T, ns string) broker {
	addr := testdb.Service(t, "redis", "OUTBOX_REDIS_ADDR", "127.0.0.1:6379")
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	stream := ns + ":order.created"
	t.Cleanup(func() { _ = c.Del(context.Background(), stream).Err() })
	tr, err := outboxredis.New(c, outboxredis.Options{})
	require.NoError(t, err)
	host, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	p, _ := strconv.Atoi(port)
	return broker{system: tr.System(), tr: tr, dest: stream, host: host, port: p,
		consume: func(t *testing.T, prop propagation.TextMapPropagator) context.Context {
			res, err := c.XRead(context.Background(), &redis.XReadArgs{Streams: []string{stream, "0"}, Count: 1, Block: 10 * time.Second}).Result()
			require.NoError(t, err)
			h := propagation.MapCarrier{}
			require.NoError(t, json.Unmarshal([]byte(res[0].Messages[0].Values[outboxredis.FieldHeaders].(string)), &h))
			return prop.Extract(context.Background(), h)
		}}
}

func kafkaBroker(t *testing.T, ns string) broker {
	topic := ns + ".order.created"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	producer, err := outboxkafka.NewClient(cluster.ListenAddrs())
	require.NoError(t, err)
	t.Cleanup(producer.Close)
	tr, err := outboxkafka.New(producer, outboxkafka.Options{})
	require.NoError(t, err)
	host, port, err := net.SplitHostPort(cluster.ListenAddrs()[0])
	require.NoError(t, err)
	p, _ := strconv.Atoi(port)
	return broker{system: tr.System(), tr: tr, dest: topic, host: host, port: p,
		consume: func(t *testing.T, prop propagation.TextMapPropagator) context.Context {
			consumer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics(topic),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			require.NoError(t, err)
			defer consumer.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for {
				fs := consumer.PollFetches(ctx)
				require.NoError(t, fs.Err0())
				if recs := fs.Records(); len(recs) > 0 {
					h := propagation.MapCarrier{}
					for _, rh := range recs[0].Headers {
						h[rh.Key] = string(rh.Value)
					}
					return prop.Extract(context.Background(), h)
				}
			}
		}}
}

func webhookBroker(t *testing.T, ns string) broker {
	var mu sync.Mutex
	var got []http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Clone())
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	tr, err := outboxwebhook.New(outboxwebhook.Options{URL: srv.URL + "/{namespace}/{topic}", AllowHTTP: true,
		Secret: "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	host, port := splitURL(t, srv.URL)
	return broker{system: tr.System(), tr: tr, dest: host, host: host, port: port,
		consume: func(t *testing.T, prop propagation.TextMapPropagator) context.Context {
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, got, 1)
			return prop.Extract(context.Background(), propagation.HeaderCarrier(got[0]))
		}}
}

func splitURL(t *testing.T, raw string) (string, int) {
	t.Helper()
	i := strings.Index(raw, "://")
	host, port, err := net.SplitHostPort(strings.TrimSuffix(raw[i+3:], "/"))
	require.NoError(t, err, raw)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	return host, p
}
