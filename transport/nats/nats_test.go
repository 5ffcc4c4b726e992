package outboxnats_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	cenats "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	cesdk "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/google/uuid"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/cloudevents"
	"github.com/outboxgo/outbox/outboxtest/cloudeventsjs"
	"github.com/outboxgo/outbox/outboxtest/testdb"
	"github.com/outboxgo/outbox/outboxtest/testproxy"
	"github.com/outboxgo/outbox/outboxtest/transporttest"
	"github.com/outboxgo/outbox/transport/nats"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

// server returns the NATS server's address, failing or skipping t when it is down.
func server(t testing.TB) string {
	return testdb.Service(t, "nats", "OUTBOX_NATS_URL", "nats://127.0.0.1:4222")
}

// connect opens a JetStream client to url, closed when t ends.
func connect(t testing.TB, url string, opts ...nats.Option) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

// stream creates a stream capturing "<ns>.>" for a new namespace, deleted when t ends.
func stream(t testing.TB, js jetstream.JetStream, edit func(*jetstream.StreamConfig)) (ns string, s jetstream.Stream) {
	t.Helper()
	ns = transporttest.Name("nt")
	cfg := jetstream.StreamConfig{Name: ns, Subjects: []string{ns + ".>"}, Storage: jetstream.MemoryStorage}
	if edit != nil {
		edit(&cfg)
	}
	ctx := context.Background()
	s, err := js.CreateStream(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), ns) })
	return ns, s
}

// consume reads every message of s with an ordered consumer, as a subscriber would.
func consume(t testing.TB, s jetstream.Stream) []transporttest.Received {
	t.Helper()
	ctx := context.Background()
	info, err := s.Info(ctx)
	require.NoError(t, err)
	want := int(info.State.Msgs)
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	var got []transporttest.Received
	for len(got) < want {
		batch, err := c.Fetch(want-len(got), jetstream.FetchMaxWait(2*time.Second))
		require.NoError(t, err)
		n := 0
		for m := range batch.Messages() {
			n++
			got = append(got, decode(t, m))
		}
		require.NoError(t, batch.Error())
		require.NotZero(t, n, "consumer stalled at %d of %d messages", len(got), want)
	}
	return got
}

func decode(t testing.TB, m jetstream.Msg) transporttest.Received {
	t.Helper()
	h := m.Headers()
	id, err := uuid.Parse(h.Get(jetstream.MsgIDHeader))
	require.NoError(t, err)
	r := transporttest.Received{
		ID: id, Namespace: h.Get(outboxnats.HeaderNamespace), Topic: h.Get(outboxnats.HeaderTopic),
		DedupeKey: h.Get(outboxnats.HeaderDedupeKey), PartitionKey: h.Get(outboxnats.HeaderPartitionKey),
		Payload: m.Data(), Route: m.Subject(),
	}
	if v := h.Get(outboxnats.HeaderTenantID); v != "" {
		r.TenantID = uuid.MustParse(v)
	}
	r.Attempt, err = strconv.Atoi(h.Get(outboxnats.HeaderAttempt))
	require.NoError(t, err)
	own := map[string]string{}
	for k, vs := range h {
		own[k] = vs[0]
	}
	r.Headers = transporttest.Strip(own, jetstream.MsgIDHeader, outboxnats.HeaderNamespace, outboxnats.HeaderTopic,
		outboxnats.HeaderTenantID, outboxnats.HeaderDedupeKey, outboxnats.HeaderPartitionKey, outboxnats.HeaderAttempt,
		"Nats-Batch-Id", "Nats-Batch-Sequence", "Nats-Batch-Commit") // an atomic batch's, kept by the stream
	return r
}

func newTransport(t testing.TB, js jetstream.JetStream, opts outboxnats.Options) *outboxnats.Transport {
	t.Helper()
	tr, err := outboxnats.New(js, opts)
	require.NoError(t, err)
	return tr
}

func TestPublishByteForByte(t *testing.T) {
	t.Parallel()
	js := connect(t, server(t))
	ns, s := stream(t, js, nil)
	tr := newTransport(t, js, outboxnats.Options{})
	batch := transporttest.Deliveries(transporttest.Messages(ns, 60))

	for i, err := range tr.Publish(context.Background(), batch) {
		require.NoError(t, err, "message %d", i)
	}
	got := consume(t, s)
	transporttest.RequireSame(t, batch, got)
	for _, g := range got {
		require.Equal(t, g.Namespace+"."+g.Topic, g.Route, "default subject")
	}
}

// A redelivery carries the same Nats-Msg-Id, which the stream's duplicate window drops: the
// second publish succeeds and stores nothing.
func TestRedeliveryIsDropped(t *testing.T) {
	t.Parallel()
	js := connect(t, server(t))
	ns, s := stream(t, js, nil)
	tr := newTransport(t, js, outboxnats.Options{})
	batch := transporttest.Deliveries(transporttest.Messages(ns, 20))
	ctx := context.Background()

	require.Empty(t, transporttest.Failures(tr.Publish(ctx, batch)))
	for i := range batch {
		batch[i].Attempt = 2
	}
	require.Empty(t, transporttest.Failures(tr.Publish(ctx, batch)))
	for i := range batch {
		batch[i].Attempt = 1 // what was stored is the first attempt
	}
	transporttest.RequireSame(t, batch, consume(t, s))
}

// One oversized message in a batch fails for good; the others are delivered.
func TestOversizedMessageFailsAlone(t *testing.T) {
	t.Parallel()
	js := connect(t, server(t))
	ns, s := stream(t, js, func(c *jetstream.StreamConfig) { c.MaxMsgSize = 4096 })
	tr := newTransport(t, js, outboxnats.Options{})
	batch := transporttest.Deliveries(transporttest.Messages(ns, 9))
	batch[3].Payload = []byte(`"` + strings.Repeat("x", 8000) + `"`)                     // over the stream's max_msg_size
	batch[6].Payload = []byte(`"` + strings.Repeat("y", int(maxPayload(t, js))+1) + `"`) // over the server's max_payload

	errs := tr.Publish(context.Background(), batch)
	require.Len(t, errs, len(batch))
	for i, err := range errs {
		if i == 3 || i == 6 {
			require.Error(t, err, "message %d", i)
			require.True(t, outbox.IsPermanent(err), "message %d: %v", i, err)
			continue
		}
		require.NoError(t, err, "message %d", i)
	}
	require.ErrorIs(t, errs[3], jetstream.ErrStreamMessageExceedsMaximum)
	require.ErrorIs(t, errs[6], nats.ErrMaxPayload)
	transporttest.RequireSame(t, append(append(batch[:3:3], batch[4:6]...), batch[7:]...), consume(t, s))
}

func maxPayload(t testing.TB, js jetstream.JetStream) int64 {
	t.Helper()
	nc := js.Conn()
	return nc.MaxPayload()
}

// A subject no stream captures is a clear, retryable error.
func TestNoStream(t *testing.T) {
	t.Parallel()
	js := connect(t, server(t))
	tr := newTransport(t, js, outboxnats.Options{})
	batch := transporttest.Deliveries(transporttest.Messages(transporttest.Name("nostream"), 2))

	errs := tr.Publish(context.Background(), batch)
	require.Len(t, errs, 2)
	for _, err := range errs {
		require.ErrorIs(t, err, outboxnats.ErrNoStream)
		require.True(t, outbox.IsUnavailable(err), "%v", err)
		require.False(t, outbox.IsPermanent(err), "%v", err)
		require.Contains(t, err.Error(), batch[0].Namespace+".")
	}
}

// In one batch, a message no stream captures is an outage, an oversized one fails for good,
// and the others are delivered: each outcome is its own.
func TestMixedOutcomes(t *testing.T) {
	t.Parallel()
	js := connect(t, server(t))
	ns, s := stream(t, js, func(c *jetstream.StreamConfig) { c.MaxMsgSize = 4096 })
	tr := newTransport(t, js, outboxnats.Options{Subject: func(d outbox.Delivery) string {
		if d.Topic == "nowhere" {
			return transporttest.Name("nostream") + ".x"
		}
		return outboxnats.DefaultSubject(d)
	}})
	batch := transporttest.Deliveries(transporttest.Messages(ns, 6))
	batch[1].Topic = "nowhere"
	batch[4].Payload = []byte(`"` + strings.Repeat("x", 8000) + `"`)

	errs := tr.Publish(context.Background(), batch)
	require.True(t, outbox.IsUnavailable(errs[1]), "%v", errs[1])
	require.True(t, outbox.IsPermanent(errs[4]), "%v", errs[4])
	require.False(t, outbox.IsUnavailable(errs[4]), "%v", errs[4])
	for _, i := range []int{0, 2, 3, 5} {
		require.NoError(t, errs[i], "message %d", i)
	}
	transporttest.RequireSame(t, []outbox.Delivery{batch[0], batch[2], batch[3], batch[5]}, consume(t, s))
}

// Messages the transport cannot put on the wire fail for good, each alone, and Subject
// overrides the routing.
func TestInvalidMessagesArePermanent(t *testing.T) {
	t.Parallel()
	js := connect(t, server(t))
	ns, s := stream(t, js, nil)
	tr := newTransport(t, js, outboxnats.Options{Subject: func(d outbox.Delivery) string {
		if d.Topic == "bad" {
			return ns + ".with space"
		}
		return ns + ".all"
	}})
	batch := transporttest.Deliveries(transporttest.Messages(ns, 5))
	batch[0].Topic = "bad"
	batch[1].Headers = outbox.Headers{"Nats-Msg-Id": "spoofed"}
	batch[2].Headers = outbox.Headers{"x-multi": "line\r\nInjected: yes"}
	batch[3].Headers = outbox.Headers{"bad name": "v"}

	errs := tr.Publish(context.Background(), batch)
	for i := range 4 {
		require.ErrorIs(t, errs[i], outboxnats.ErrInvalid, "message %d", i)
		require.True(t, outbox.IsPermanent(errs[i]), "message %d", i)
	}
	require.NoError(t, errs[4])
	msgs := consume(t, s)
	require.Len(t, msgs, 1)
	require.Equal(t, batch[4].ID, msgs[0].ID)
	require.Equal(t, ns+".all", msgs[0].Route)
}

func TestCancelledContext(t *testing.T) {
	t.Parallel()
	js := connect(t, server(t))
	ns, _ := stream(t, js, nil)
	transporttest.RequireCancelled(t, newTransport(t, js, outboxnats.Options{}), transporttest.Deliveries(transporttest.Messages(ns, 5)))
}

func TestClassify(t *testing.T) {
	t.Parallel()
	permanent := []error{
		nats.ErrMaxPayload, nats.ErrBadSubject, jetstream.ErrStreamMessageExceedsMaximum,
		&jetstream.APIError{Code: 400, ErrorCode: 10060, Description: "expected stream does not match"},
	}
	retryable := []error{
		nats.ErrTimeout, jetstream.ErrAsyncPublishTimeout, nats.ErrConnectionDraining,
		jetstream.ErrTooManyStalledMsgs, jetstream.ErrStreamNotFound, context.DeadlineExceeded, context.Canceled,
		&jetstream.APIError{Code: 503, ErrorCode: 10077, Description: "maximum messages exceeded"},
		errors.New("something else"),
	}
	transporttest.RequireClassify(t, outboxnats.Classify, permanent, retryable)
	transporttest.RequireUnavailable(t, outboxnats.Classify, []error{
		nats.ErrDisconnected, nats.ErrConnectionClosed, nats.ErrConnectionReconnecting, nats.ErrNoServers,
		nats.ErrReconnectBufExceeded, nats.ErrStaleConnection, nats.ErrNoResponders, jetstream.ErrNoStreamResponse,
		jetstream.ErrJetStreamNotEnabled, outboxnats.ErrNoStream, syscall.ECONNREFUSED, io.EOF,
		&net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded},
	})
}

// With the connection cut, every message of every batch fails as an outage (the client
// buffers them for its reconnection and no acknowledgement comes); once it is restored, a
// batch is delivered whole and the consumer reads it.
func TestUnavailableWhileCut(t *testing.T) {
	t.Parallel()
	proxy := testproxy.New(t, strings.TrimPrefix(server(t), "nats://"))
	admin := connect(t, server(t))
	ns, s := stream(t, admin, nil)
	js := connect(t, "nats://"+proxy.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	tr := newTransport(t, js, outboxnats.Options{AckTimeout: 300 * time.Millisecond})
	require.Empty(t, transporttest.Failures(tr.Publish(context.Background(), transporttest.Deliveries(transporttest.Messages(ns, 5)))))

	delivered := transporttest.CutAndRestore(t, tr, func() []outbox.Delivery {
		return transporttest.Deliveries(transporttest.Messages(ns, 10))
	}, proxy.Cut, proxy.Restore)
	ids, _ := transporttest.IDs(consume(t, s))
	for _, d := range delivered {
		require.True(t, ids[d.ID], "message %s missing after the cut", d.ID)
	}
}

func TestOptionsValidation(t *testing.T) {
	t.Parallel()
	_, err := outboxnats.New(nil, outboxnats.Options{})
	require.ErrorIs(t, err, outboxnats.ErrInvalid)
	js := connect(t, server(t))
	_, err = outboxnats.New(js, outboxnats.Options{AckTimeout: -time.Second})
	require.ErrorIs(t, err, outboxnats.ErrInvalid)
	_, err = outboxnats.New(js, outboxnats.Options{ExpectStream: "a.b"})
	require.ErrorIs(t, err, outboxnats.ErrInvalid)
}

// ExpectStream refuses a message that another stream would store, for good.
func TestExpectStream(t *testing.T) {
	t.Parallel()
	js := connect(t, server(t))
	ns, _ := stream(t, js, nil)
	tr := newTransport(t, js, outboxnats.Options{ExpectStream: "someone_else"})
	errs := tr.Publish(context.Background(), transporttest.Deliveries(transporttest.Messages(ns, 1)))
	require.True(t, outbox.IsPermanent(errs[0]), "%v", errs[0])
}

// The server goes away in the middle of a run: publishes fail and are retried, nothing is
// dead-lettered, and once it is back every message is in the stream exactly once (the
// redeliveries of messages that were stored after all are dropped by Nats-Msg-Id).
func TestServerOutage(t *testing.T) {
	t.Parallel()
	proxy := testproxy.New(t, strings.TrimPrefix(server(t), "nats://"))
	admin := connect(t, server(t))
	ns, s := stream(t, admin, nil)
	js := connect(t, "nats://"+proxy.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	tr := newTransport(t, js, outboxnats.Options{AckTimeout: 300 * time.Millisecond})
	transporttest.Outage(t, ns, tr, proxy.Cut, proxy.Restore, func() []transporttest.Received { return consume(t, s) }, true)
}

// A Publisher drains a PostgreSQL outbox into a stream, and a consumer receives each message
// once, byte for byte.
func TestEndToEndFromPostgres(t *testing.T) {
	t.Parallel()
	js := connect(t, server(t))
	ns, s := stream(t, js, nil)
	transporttest.EndToEnd(t, ns, newTransport(t, js, outboxnats.Options{}), func() []transporttest.Received { return consume(t, s) })
}

// cloudEvents reads every message of s and decodes each with the CloudEvents SDK's NATS
// JetStream protocol binding, which must find a valid event.
func cloudEvents(t testing.TB, s jetstream.Stream, n int) []cesdk.Event {
	t.Helper()
	c, err := s.OrderedConsumer(context.Background(), jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	batch, err := c.Fetch(n, jetstream.FetchMaxWait(2*time.Second))
	require.NoError(t, err)
	var out []cesdk.Event
	for m := range batch.Messages() {
		// The SDK's own NATS JetStream binding, on the message as the server delivered it.
		msg := cenats.NewMessage(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
		e, err := binding.ToEvent(context.Background(), msg)
		require.NoError(t, err)
		require.NoError(t, e.Validate())
		out = append(out, *e)
	}
	require.NoError(t, batch.Error())
	require.Len(t, out, n)
	return out
}

// A consumer decodes every message with the CloudEvents SDK, in both modes, and finds the
// message's id, source, type, time, content type, partition key, header extensions and the
// payload as data.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	for _, mode := range []cloudevents.Mode{cloudevents.Binary, cloudevents.Structured} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			t.Parallel()
			js := connect(t, server(t))
			ns, s := stream(t, js, nil)
			tr := newTransport(t, js, outboxnats.Options{CloudEvents: &cloudevents.Options{
				Source: "https://shop.example/orders", Mode: mode,
				Type: func(d outbox.Delivery) string { return "com.example." + d.Topic },
			}})
			batch := transporttest.Deliveries(transporttest.Messages(ns, 12))
			// A "+json" type (sent as data_base64 in the structured mode) and a type with a
			// parameter (sent without the optional space in the binary mode).
			contentType := "application/vnd.shop+json"
			batch[1].Headers = outbox.Headers{"content-type": contentType, "x-request-id": "r-1", "Tenant": "acme",
				"subject": "100% sure, \"quoted\" €"}
			batch[2].Headers = outbox.Headers{"content-type": "text/plain; charset=utf-8"}
			require.Empty(t, transporttest.Failures(tr.Publish(context.Background(), batch)))

			byID := map[string]cesdk.Event{}
			for _, e := range cloudEvents(t, s, len(batch)) {
				byID[e.ID()] = e
			}
			for _, d := range batch {
				e, ok := byID[d.ID.String()]
				require.True(t, ok, "event %s not received", d.ID)
				require.Equal(t, "1.0", e.SpecVersion())
				require.Equal(t, "https://shop.example/orders", e.Source())
				require.Equal(t, "com.example."+d.Topic, e.Type())
				require.True(t, d.CreatedAt.Equal(e.Time()), "time %s, want %s", e.Time(), d.CreatedAt)
				require.JSONEq(t, string(d.Payload), string(e.Data()))
				if mode == cloudevents.Binary {
					require.Equal(t, string(d.Payload), string(e.Data()), "binary data is the payload byte for byte")
				}
				pk, _ := e.Extensions()["partitionkey"].(string)
				require.Equal(t, d.PartitionKey, pk)
				if tp, ok := d.Headers["traceparent"]; ok {
					require.Equal(t, tp, e.Extensions()["traceparent"])
				}
			}
			odd := byID[batch[1].ID.String()]
			require.Equal(t, contentType, odd.DataContentType())
			require.Equal(t, "acme", odd.Extensions()["tenant"])
			require.NotContains(t, odd.Extensions(), "x-request-id")
			require.Equal(t, "application/json", byID[batch[0].ID.String()].DataContentType())
			text := byID[batch[2].ID.String()]
			if mode == cloudevents.Binary {
				require.Equal(t, "text/plain;charset=utf-8", text.DataContentType())
			} else {
				require.Equal(t, "text/plain; charset=utf-8", text.DataContentType())
			}
			require.Equal(t, string(batch[2].Payload), string(text.Data()))
			require.Equal(t, string(batch[1].Payload), string(odd.Data()), "a +json payload arrives byte for byte")
			if mode == cloudevents.Binary {
				// The binding percent-encodes header values. The SDK's reader (v2.16)
				// hands them on without the single round of decoding the binding asks
				// of a receiver, so the test decodes the SDK's value itself.
				require.Equal(t, "100%25%20sure,%20%22quoted%22%20%E2%82%AC", odd.Subject())
				subject, err := url.PathUnescape(odd.Subject())
				require.NoError(t, err)
				require.Equal(t, batch[1].Headers["subject"], subject)
			} else {
				require.Equal(t, batch[1].Headers["subject"], odd.Subject())
			}

			// A JavaScript consumer decodes every event with the JavaScript SDK.
			c, err := s.OrderedConsumer(context.Background(), jetstream.OrderedConsumerConfig{})
			require.NoError(t, err)
			fetched, err := c.Fetch(len(batch), jetstream.FetchMaxWait(2*time.Second))
			require.NoError(t, err)
			var raw []cloudeventsjs.Message
			for m := range fetched.Messages() {
				h := map[string]string{}
				for k, v := range m.Headers() {
					h[k] = v[0]
				}
				raw = append(raw, cloudeventsjs.Message{Binding: cloudeventsjs.NATS, Headers: h, Body: m.Data()})
			}
			require.NoError(t, fetched.Error())
			jsByID := map[string]cloudeventsjs.Event{}
			for _, e := range cloudeventsjs.Decode(t, raw) {
				require.Empty(t, e.Error)
				jsByID[e.Attributes["id"]] = e
			}
			require.Len(t, jsByID, len(batch))
			for _, d := range batch {
				ct := d.Headers["content-type"]
				switch {
				case ct == "":
					ct = "application/json"
				case mode == cloudevents.Binary:
					ct = cloudevents.CompactMediaType(ct)
				}
				cloudeventsjs.RequireDelivery(t, d, jsByID[d.ID.String()], "https://shop.example/orders", "com.example."+d.Topic, ct)
			}
			require.Equal(t, "acme", jsByID[batch[1].ID.String()].Attributes["tenant"])

			// The header that is no attribute name still reaches a plain NATS consumer.
			for _, g := range consume(t, s) {
				if g.ID == batch[1].ID {
					require.Equal(t, "r-1", g.Headers["x-request-id"])
				}
			}
		})
	}
}

// CloudEvents needs a source, and a message header that would replace an attribute's
// header is refused for good.
func TestCloudEventsRefusals(t *testing.T) {
	t.Parallel()
	js := connect(t, server(t))
	_, err := outboxnats.New(js, outboxnats.Options{CloudEvents: &cloudevents.Options{}})
	require.ErrorIs(t, err, outboxnats.ErrInvalid)
	require.ErrorIs(t, err, outbox.ErrInvalid)

	ns, _ := stream(t, js, nil)
	tr := newTransport(t, js, outboxnats.Options{CloudEvents: &cloudevents.Options{Source: "/shop"}})
	batch := transporttest.Deliveries(transporttest.Messages(ns, 2))
	batch[0].Headers = outbox.Headers{"ce-id": "forged"}
	batch[1].Headers = outbox.Headers{"content-type": "a/b", "Content-Type": "c/d"}
	for i, err := range tr.Publish(context.Background(), batch) {
		require.True(t, outbox.IsPermanent(err), "message %d: %v", i, err)
	}
}
