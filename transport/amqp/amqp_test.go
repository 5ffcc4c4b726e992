package outboxamqp_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	cesdk "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/google/uuid"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/cloudevents"
	"github.com/outboxgo/outbox/outboxtest/testdb"
	"github.com/outboxgo/outbox/outboxtest/testproxy"
	"github.com/outboxgo/outbox/outboxtest/transporttest"
	"github.com/outboxgo/outbox/transport/amqp"
)

// TestMain checks that no test leaves a goroutine behind: every transport is closed, and
// closing it ends the client's reader, heartbeat and returns goroutines.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
	)
}

func brokerURL(t *testing.T) string {
	t.Helper()
	return testdb.Service(t, "rabbitmq", "OUTBOX_AMQP_URL", outboxamqp.DefaultURL)
}

func uniqueName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// broker is a test's own topology on the shared RabbitMQ: a topic exchange and a queue
// bound to it with one routing key, deleted when the test ends, and a consumer on the queue.
type broker struct {
	url      string
	exchange string
	queue    string
	conn     *amqp091.Connection

	mu  sync.Mutex
	got []amqp091.Delivery
}

// setup declares an exchange and a queue bound to it with bindingKey, and consumes the
// queue. queueArgs are the queue's arguments (length limits), or nil.
func setup(t *testing.T, bindingKey string, queueArgs amqp091.Table) *broker {
	t.Helper()
	b := &broker{url: brokerURL(t), exchange: uniqueName("outbox_t_x_"), queue: uniqueName("outbox_t_q_")}
	conn, err := amqp091.Dial(b.url)
	require.NoError(t, err)
	b.conn = conn
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclare(b.exchange, "topic", false, false, false, false, nil))
	_, err = ch.QueueDeclare(b.queue, false, false, false, false, queueArgs)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(b.queue, bindingKey, b.exchange, false, nil))
	deliveries, err := ch.Consume(b.queue, "", true, false, false, false, nil)
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range deliveries {
			b.mu.Lock()
			b.got = append(b.got, d)
			b.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		if _, err := ch.QueueDelete(b.queue, false, false, false); err != nil {
			t.Errorf("delete queue %s: %v", b.queue, err)
		}
		if err := ch.ExchangeDelete(b.exchange, false, false); err != nil {
			t.Errorf("delete exchange %s: %v", b.exchange, err)
		}
		_ = conn.Close()
		<-done
	})
	return b
}

// received returns a copy of what the consumer has received so far.
func (b *broker) received() []amqp091.Delivery {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]amqp091.Delivery(nil), b.got...)
}

// waitFor polls the consumer until it has received n messages, failing t at the deadline.
func (b *broker) waitFor(t *testing.T, n int, within time.Duration) []amqp091.Delivery {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := b.received()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer received %d of %d messages within %s", len(got), n, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func newTransport(t *testing.T, o outboxamqp.Options) *outboxamqp.Transport {
	t.Helper()
	if o.Logger == nil {
		o.Logger = quiet()
	}
	tr, err := outboxamqp.New(o)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, tr.Close()) })
	return tr
}

func delivery(namespace, topic, payload string) outbox.Delivery {
	return outbox.Delivery{
		ID: uuid.Must(uuid.NewV7()), Namespace: namespace, Topic: topic,
		Payload: []byte(payload), Attempt: 1, CreatedAt: time.Now().UTC().Truncate(time.Second),
	}
}

// TestPublishFields: each message arrives byte for byte at a real consumer, with the
// delivery id as message id, the headers, partition key, tenant, attempt and content type.
func TestPublishFields(t *testing.T) {
	t.Parallel()
	b := setup(t, "order.*", nil)
	tr := newTransport(t, outboxamqp.Options{URL: b.url})

	tenant := uuid.New()
	batch := []outbox.Delivery{
		delivery(b.exchange, "order.created", `{"order":1,"note":"héllo \u00e9 ✓"}`),
		delivery(b.exchange, "order.paid", `{"order":1,"amount":"12.50"}`),
		delivery(b.exchange, "order.shipped", `[1, 2,   3]`),
	}
	batch[0].Headers = outbox.Headers{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x-empty": ""}
	batch[0].PartitionKey = "order-1"
	batch[1].TenantID = tenant
	batch[1].DedupeKey = tenant.String() + "/pay-1"
	batch[1].Attempt = 3
	batch[2].Headers = outbox.Headers{"Content-Type": "application/vnd.shop+json"}

	errs := tr.Publish(context.Background(), batch)
	require.Len(t, errs, len(batch))
	for i, err := range errs {
		require.NoError(t, err, "message %d", i)
	}

	got := b.waitFor(t, len(batch), 10*time.Second)
	require.Len(t, got, len(batch))
	byID := map[string]amqp091.Delivery{}
	for _, d := range got {
		byID[d.MessageId] = d
	}
	for _, want := range batch {
		d, ok := byID[want.ID.String()]
		require.True(t, ok, "message %s not received", want.ID)
		require.Equal(t, []byte(want.Payload), d.Body)
		require.Equal(t, b.exchange, d.Exchange)
		require.Equal(t, want.Topic, d.RoutingKey)
		require.Equal(t, want.Topic, d.Type)
		require.Equal(t, amqp091.Persistent, d.DeliveryMode)
		require.True(t, want.CreatedAt.Equal(d.Timestamp), "timestamp %s, want %s", d.Timestamp, want.CreatedAt)
		require.Equal(t, want.Namespace, d.Headers[outboxamqp.HeaderNamespace])
		require.Equal(t, want.Topic, d.Headers[outboxamqp.HeaderTopic])
		require.EqualValues(t, want.Attempt, d.Headers[outboxamqp.HeaderAttempt])
		for k, v := range want.Headers {
			require.Equal(t, v, d.Headers[k], "header %s", k)
		}
	}
	first, second, third := byID[batch[0].ID.String()], byID[batch[1].ID.String()], byID[batch[2].ID.String()]
	require.Equal(t, "order-1", first.Headers[outboxamqp.HeaderPartitionKey])
	require.NotContains(t, first.Headers, outboxamqp.HeaderTenantID)
	require.NotContains(t, first.Headers, outboxamqp.HeaderDedupeKey)
	require.Equal(t, outboxamqp.DefaultContentType, first.ContentType)
	require.Equal(t, tenant.String(), second.Headers[outboxamqp.HeaderTenantID])
	require.Equal(t, batch[1].DedupeKey, second.Headers[outboxamqp.HeaderDedupeKey])
	require.NotContains(t, second.Headers, outboxamqp.HeaderPartitionKey)
	require.Equal(t, "application/vnd.shop+json", third.ContentType)
}

// TestPublishRoute: Route overrides the exchange and routing key; Transient sets the
// delivery mode; an error from Route fails that message only, as it was returned.
func TestPublishRoute(t *testing.T) {
	t.Parallel()
	b := setup(t, "fixed.key", nil)
	refused := errors.New("no route for this tenant")
	tr := newTransport(t, outboxamqp.Options{
		URL:       b.url,
		Transient: true,
		Route: func(d *outbox.Delivery) (string, string, error) {
			if d.Topic == "refused" {
				return "", "", outbox.Permanent(refused)
			}
			return b.exchange, "fixed.key", nil
		},
	})
	batch := []outbox.Delivery{
		delivery("any", "a", `{"n":1}`),
		delivery("any", "refused", `{"n":2}`),
		delivery("other", "b", `{"n":3}`),
	}
	errs := tr.Publish(context.Background(), batch)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], refused)
	require.True(t, outbox.IsPermanent(errs[1]))
	require.NoError(t, errs[2])
	got := b.waitFor(t, 2, 10*time.Second)
	require.ElementsMatch(t, []string{batch[0].ID.String(), batch[2].ID.String()},
		[]string{got[0].MessageId, got[1].MessageId})
	for _, d := range got {
		require.Equal(t, "fixed.key", d.RoutingKey)
		require.Equal(t, amqp091.Transient, d.DeliveryMode)
	}
}

// TestPublishUnroutable: in one batch, a message no binding matches and a message for an
// exchange that does not exist are reported, each with its own error, and the rest of the
// batch is delivered. Both are retried by default and dead-lettered at once with
// PermanentUnroutable.
func TestPublishUnroutable(t *testing.T) {
	t.Parallel()
	for _, permanent := range []bool{false, true} {
		t.Run(fmt.Sprintf("permanent=%v", permanent), func(t *testing.T) {
			t.Parallel()
			b := setup(t, "ok", nil)
			missing := uniqueName("outbox_t_missing_")
			tr := newTransport(t, outboxamqp.Options{URL: b.url, PermanentUnroutable: permanent})
			batch := []outbox.Delivery{
				delivery(b.exchange, "ok", `{"n":0}`),
				delivery(b.exchange, "ok", `{"n":1}`),
				delivery(b.exchange, "nobody.listens", `{"n":2}`),
				delivery(missing, "ok", `{"n":3}`),
				delivery(b.exchange, "ok", `{"n":4}`),
			}
			errs := tr.Publish(context.Background(), batch)
			require.Len(t, errs, len(batch))
			for _, i := range []int{0, 1, 4} {
				require.NoError(t, errs[i], "message %d", i)
			}
			require.ErrorIs(t, errs[2], outboxamqp.ErrUnroutable)
			require.ErrorContains(t, errs[2], "nobody.listens")
			require.ErrorContains(t, errs[2], "312 NO_ROUTE")
			require.ErrorIs(t, errs[3], outboxamqp.ErrNoExchange)
			require.ErrorContains(t, errs[3], missing)
			require.Equal(t, permanent, outbox.IsPermanent(errs[2]))
			require.Equal(t, permanent, outbox.IsPermanent(errs[3]))

			got := b.waitFor(t, 3, 10*time.Second)
			ids := []string{}
			for _, d := range got {
				ids = append(ids, d.MessageId)
			}
			require.ElementsMatch(t, []string{batch[0].ID.String(), batch[1].ID.String(), batch[4].ID.String()}, ids)

			// The connection survived both: the next batch goes through on it.
			again := delivery(b.exchange, "ok", `{"n":5}`)
			require.Empty(t, nonNil(tr.Publish(context.Background(), []outbox.Delivery{again})))
			b.waitFor(t, 4, 10*time.Second)
		})
	}
}

// TestPublishNacked: a queue at its length limit with overflow reject-publish makes the
// broker nack further messages; they fail with ErrNacked, retryable.
func TestPublishNacked(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	conn, err := amqp091.Dial(url)
	require.NoError(t, err)
	ch, err := conn.Channel()
	require.NoError(t, err)
	exchange, queue := uniqueName("outbox_t_x_"), uniqueName("outbox_t_q_")
	require.NoError(t, ch.ExchangeDeclare(exchange, "direct", false, false, false, false, nil))
	_, err = ch.QueueDeclare(queue, false, false, false, false, amqp091.Table{"x-max-length": int32(2), "x-overflow": "reject-publish"})
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(queue, "k", exchange, false, nil))
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(queue, false, false, false)
		_ = ch.ExchangeDelete(exchange, false, false)
		_ = conn.Close()
	})

	tr := newTransport(t, outboxamqp.Options{URL: url})
	batch := make([]outbox.Delivery, 5)
	for i := range batch {
		batch[i] = delivery(exchange, "k", fmt.Sprintf(`{"n":%d}`, i))
	}
	errs := tr.Publish(context.Background(), batch)
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	for i := 2; i < len(batch); i++ {
		require.ErrorIs(t, errs[i], outboxamqp.ErrNacked, "message %d", i)
		require.False(t, outbox.IsPermanent(errs[i]))
		require.False(t, outbox.IsUnavailable(errs[i]), "a full queue is not an outage")
	}
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, amqp091.Table{"x-max-length": int32(2), "x-overflow": "reject-publish"})
	require.NoError(t, err)
	require.Equal(t, 2, q.Messages)
}

func nonNil(errs []error) []error {
	var out []error
	for _, err := range errs {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// proxied returns the broker URL rewritten to go through a loopback proxy that the test
// can cut, taking the broker away from this transport only.
func proxied(t *testing.T, brokerURL string) (string, *testproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(brokerURL)
	require.NoError(t, err)
	p := testproxy.New(t, u.Host)
	u.Host = p.Addr()
	return u.String(), p
}

// TestPublishOutage: with the broker cut away, the batch in flight and the following ones
// fail fast with retryable errors, never permanent; after a failed dial Publish does not
// dial again until the backoff passes; once the broker is back the transport reconnects on
// its own and delivers.
func TestPublishOutage(t *testing.T) {
	t.Parallel()
	b := setup(t, "#", nil)
	u, proxy := proxied(t, b.url)
	tr := newTransport(t, outboxamqp.Options{URL: u, ReconnectMin: 200 * time.Millisecond, ReconnectMax: 400 * time.Millisecond, DialTimeout: 2 * time.Second})
	ctx := context.Background()

	first := delivery(b.exchange, "t", `{"n":0}`)
	require.Empty(t, nonNil(tr.Publish(ctx, []outbox.Delivery{first})))

	proxy.Cut()
	var sent []outbox.Delivery
	sent = append(sent, first)
	sawNotConnected := false
	for i := range 10 {
		d := delivery(b.exchange, "t", fmt.Sprintf(`{"n":%d}`, i+1))
		start := time.Now()
		errs := tr.Publish(ctx, []outbox.Delivery{d})
		require.Less(t, time.Since(start), 3*time.Second, "Publish blocked during the outage")
		require.Error(t, errs[0])
		require.False(t, outbox.IsPermanent(errs[0]), "%v", errs[0])
		require.True(t, outbox.IsUnavailable(errs[0]), "%v", errs[0])
		require.True(t, errors.Is(errs[0], outboxamqp.ErrConnectionLost) || errors.Is(errs[0], outboxamqp.ErrNotConnected), "%v", errs[0])
		if errors.Is(errs[0], outboxamqp.ErrNotConnected) {
			sawNotConnected = true
		}
	}
	require.True(t, sawNotConnected)

	proxy.Restore()
	d := delivery(b.exchange, "t", `{"n":"back"}`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		errs := tr.Publish(ctx, []outbox.Delivery{d})
		if errs[0] == nil {
			break
		}
		require.False(t, outbox.IsPermanent(errs[0]))
		require.True(t, time.Now().Before(deadline), "not reconnected: %v", errs[0])
		time.Sleep(50 * time.Millisecond)
	}
	sent = append(sent, d)
	got := b.waitFor(t, len(sent), 10*time.Second)
	ids := map[string]bool{}
	for _, g := range got {
		ids[g.MessageId] = true
	}
	for _, s := range sent {
		require.True(t, ids[s.ID.String()], "message %s lost", s.ID)
	}
}

// TestPublishHonoursContext: a broker that accepts the TCP connection and never answers
// the handshake cannot hold Publish past its context, nor past DialTimeout.
func TestPublishHonoursContext(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var held []net.Conn
	var mu sync.Mutex
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-accepted
		mu.Lock()
		for _, c := range held {
			_ = c.Close()
		}
		mu.Unlock()
	})
	tr := newTransport(t, outboxamqp.Options{URL: "amqp://guest:guest@" + ln.Addr().String() + "/", DialTimeout: time.Minute, ReconnectMin: time.Millisecond})

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	errs := tr.Publish(ctx, []outbox.Delivery{delivery("x", "y", `{}`)})
	require.Less(t, time.Since(start), 2*time.Second)
	require.ErrorIs(t, errs[0], outboxamqp.ErrNotConnected)
	require.ErrorIs(t, errs[0], context.DeadlineExceeded)

	tr2 := newTransport(t, outboxamqp.Options{URL: "amqp://guest:guest@" + ln.Addr().String() + "/", DialTimeout: 200 * time.Millisecond})
	start = time.Now()
	errs = tr2.Publish(context.Background(), []outbox.Delivery{delivery("x", "y", `{}`)})
	require.Less(t, time.Since(start), 2*time.Second)
	require.ErrorIs(t, errs[0], outboxamqp.ErrNotConnected)
}

// TestClose: Publish after Close fails with ErrClosed, and Close twice is harmless.
func TestClose(t *testing.T) {
	t.Parallel()
	b := setup(t, "#", nil)
	tr, err := outboxamqp.New(outboxamqp.Options{URL: b.url, Logger: quiet()})
	require.NoError(t, err)
	require.Empty(t, nonNil(tr.Publish(context.Background(), []outbox.Delivery{delivery(b.exchange, "t", `{}`)})))
	require.NoError(t, tr.Close())
	require.NoError(t, tr.Close())
	errs := tr.Publish(context.Background(), []outbox.Delivery{delivery(b.exchange, "t", `{}`)})
	require.ErrorIs(t, errs[0], outboxamqp.ErrClosed)
	require.Nil(t, tr.Publish(context.Background(), nil))
}

// TestOptionsValidation: bad options are refused with an error matching ErrInvalid that
// does not leak the URL's password.
func TestOptionsValidation(t *testing.T) {
	t.Parallel()
	for name, o := range map[string]outboxamqp.Options{
		"url":           {URL: "http://user:s3cret@host/"},
		"dial":          {Config: amqp091.Config{Dial: amqp091.DefaultDial(time.Second)}},
		"dialTimeout":   {DialTimeout: -time.Second},
		"confirm":       {ConfirmTimeout: -1},
		"reconnectMin":  {ReconnectMin: -1},
		"reconnectMax":  {ReconnectMin: time.Second, ReconnectMax: time.Millisecond},
		"reconnectMax-": {ReconnectMax: -time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := outboxamqp.New(o)
			require.ErrorIs(t, err, outbox.ErrInvalid)
			var ve *outbox.ValidationError
			require.ErrorAs(t, err, &ve)
			require.NotContains(t, err.Error(), "s3cret")
		})
	}
	tr, err := outboxamqp.New(outboxamqp.Options{})
	require.NoError(t, err)
	require.NoError(t, tr.Close())
}

// TestClassify: connection and dial failures are outages; refusals of a message are not.
func TestClassify(t *testing.T) {
	t.Parallel()
	transporttest.RequireClassify(t, outboxamqp.Classify, nil, []error{
		outboxamqp.ErrNacked, outboxamqp.ErrUnroutable, outboxamqp.ErrNoExchange, outboxamqp.ErrClosed, context.Canceled,
		fmt.Errorf("%w: %w", outboxamqp.ErrNotConnected, context.Canceled),
		&amqp091.Error{Code: amqp091.AccessRefused, Reason: "ACCESS_REFUSED"},
		&amqp091.Error{Code: amqp091.PreconditionFailed, Reason: "PRECONDITION_FAILED"},
		fmt.Errorf("%w: %w", outboxamqp.ErrConnectionLost, &amqp091.Error{Code: amqp091.PreconditionFailed, Server: true, Recover: true,
			Reason: "PRECONDITION_FAILED - message size 200000000 is larger than configured max size 134217728"}),
	})
	transporttest.RequireUnavailable(t, outboxamqp.Classify, []error{
		outboxamqp.ErrNotConnected, outboxamqp.ErrConnectionLost, amqp091.ErrClosed, syscall.ECONNREFUSED, io.EOF,
		&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED},
		&amqp091.Error{Code: amqp091.ConnectionForced, Reason: "CONNECTION_FORCED - broker forced connection closure"},
		fmt.Errorf("%w: %w", outboxamqp.ErrConnectionLost, context.DeadlineExceeded),
		fmt.Errorf("%w: %w", outboxamqp.ErrNotConnected, &amqp091.Error{Code: amqp091.AccessRefused, Server: true, Recover: true, Reason: "ACCESS_REFUSED - Login was refused"}),
	})
}

// TestUnavailableWhileCut: with the broker cut away, every message of every batch is an
// outage; once it is back, a batch is confirmed whole and consumed.
func TestUnavailableWhileCut(t *testing.T) {
	t.Parallel()
	b := setup(t, "#", nil)
	u, proxy := proxied(t, b.url)
	tr := newTransport(t, outboxamqp.Options{URL: u, ReconnectMin: 20 * time.Millisecond, ReconnectMax: 50 * time.Millisecond, DialTimeout: 2 * time.Second})
	fresh := func() []outbox.Delivery {
		return []outbox.Delivery{delivery(b.exchange, "a", `{"n":1}`), delivery(b.exchange, "b", `{"n":2}`), delivery(b.exchange, "c", `{"n":3}`)}
	}
	require.Empty(t, nonNil(tr.Publish(context.Background(), fresh())))
	delivered := transporttest.CutAndRestore(t, tr, fresh, proxy.Cut, proxy.Restore)
	got := map[string]bool{}
	for _, d := range b.waitFor(t, 3+len(delivered), 10*time.Second) {
		got[d.MessageId] = true
	}
	for _, d := range delivered {
		require.True(t, got[d.ID.String()], "message %s not consumed after the cut", d.ID)
	}
}

// ceMessage is a delivery as a CloudEvents binding message under the AMQP binding
// (cloudEvents: headers and the content-type property, or a structured event in the body),
// so that the CloudEvents SDK decodes it as any CloudEvents consumer would.
type ceMessage struct{ d amqp091.Delivery }

func (m ceMessage) header(k string) string { v, _ := m.d.Headers[k].(string); return v }

func (m ceMessage) version() spec.Version {
	return spec.WithPrefix(outboxamqp.CloudEventsPrefix).Version(m.header(outboxamqp.CloudEventsPrefix + "specversion"))
}

func (m ceMessage) ReadEncoding() binding.Encoding {
	switch {
	case format.Lookup(m.d.ContentType) != nil:
		return binding.EncodingStructured
	case m.version() != nil:
		return binding.EncodingBinary
	}
	return binding.EncodingUnknown
}

func (m ceMessage) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	f := format.Lookup(m.d.ContentType)
	if f == nil {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, f, bytes.NewReader(m.d.Body))
}

func (m ceMessage) ReadBinary(_ context.Context, w binding.BinaryWriter) error {
	v := m.version()
	if err := w.SetAttribute(v.AttributeFromKind(spec.DataContentType), m.d.ContentType); err != nil {
		return err
	}
	for k := range m.d.Headers {
		var err error
		if a := v.Attribute(k); a != nil {
			err = w.SetAttribute(a, m.header(k))
		} else if name, ok := strings.CutPrefix(k, outboxamqp.CloudEventsPrefix); ok {
			err = w.SetExtension(name, m.header(k))
		}
		if err != nil {
			return err
		}
	}
	return w.SetData(bytes.NewReader(m.d.Body))
}

func (m ceMessage) GetAttribute(k spec.Kind) (spec.Attribute, any) {
	a := m.version().AttributeFromKind(k)
	switch {
	case a == nil:
		return nil, nil
	case k == spec.DataContentType:
		return a, m.d.ContentType
	}
	if x := m.header(a.PrefixedName()); x != "" {
		return a, x
	}
	return a, nil
}

func (m ceMessage) GetExtension(name string) any {
	if x := m.header(outboxamqp.CloudEventsPrefix + name); x != "" {
		return x
	}
	return nil
}

func (m ceMessage) Finish(error) error { return nil }

// TestCloudEvents: a real consumer decodes every message with the CloudEvents SDK, in both
// modes, and finds the message's id, source, type, time, content type, partition key,
// header extensions and the payload as data.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	for _, mode := range []cloudevents.Mode{cloudevents.Binary, cloudevents.Structured} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			t.Parallel()
			b := setup(t, "#", nil)
			tr := newTransport(t, outboxamqp.Options{URL: b.url, CloudEvents: &cloudevents.Options{Source: "/shop/orders", Mode: mode,
				Type: func(d outbox.Delivery) string { return "com.example." + d.Topic }}})
			batch := []outbox.Delivery{delivery(b.exchange, "order.created", `{"order":1,"note":"héllo"}`), delivery(b.exchange, "order.paid", `[1, 2]`)}
			contentType := "application/vnd.shop+json"
			batch[0].PartitionKey = "order-1"
			batch[0].Headers = outbox.Headers{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x-request-id": "r-1"}
			batch[1].Headers = outbox.Headers{"content-type": contentType, "Tenant": "acme"}
			require.Empty(t, nonNil(tr.Publish(context.Background(), batch)))

			events := map[string]cesdk.Event{}
			raw := map[string]amqp091.Delivery{}
			for _, d := range b.waitFor(t, len(batch), 10*time.Second) {
				e, err := binding.ToEvent(context.Background(), ceMessage{d})
				require.NoError(t, err)
				require.NoError(t, e.Validate())
				events[e.ID()], raw[e.ID()] = *e, d
			}
			for _, d := range batch {
				e := events[d.ID.String()]
				require.Equal(t, "/shop/orders", e.Source())
				require.Equal(t, "com.example."+d.Topic, e.Type())
				require.True(t, d.CreatedAt.Equal(e.Time()), "%s", e.Time())
				require.JSONEq(t, string(d.Payload), string(e.Data()))
				if mode == cloudevents.Binary {
					require.Equal(t, string(d.Payload), string(e.Data()))
				}
			}
			first, second := events[batch[0].ID.String()], events[batch[1].ID.String()]
			require.Equal(t, "order-1", first.Extensions()["partitionkey"])
			require.Equal(t, batch[0].Headers["traceparent"], first.Extensions()["traceparent"])
			require.Equal(t, "application/json", first.DataContentType())
			require.Equal(t, "r-1", raw[first.ID()].Headers["x-request-id"], "a header that is no attribute name is sent as it is")
			require.Equal(t, contentType, second.DataContentType())
			require.Equal(t, string(batch[1].Payload), string(second.Data()), "a +json payload arrives byte for byte")
			require.Equal(t, "acme", second.Extensions()["tenant"])
		})
	}
}

// TestCloudEventsRefusals: the option needs a source; a message header that would replace
// an attribute is refused for good and the rest of the batch is delivered.
func TestCloudEventsRefusals(t *testing.T) {
	t.Parallel()
	_, err := outboxamqp.New(outboxamqp.Options{CloudEvents: &cloudevents.Options{}})
	require.ErrorIs(t, err, outbox.ErrInvalid)
	b := setup(t, "#", nil)
	tr := newTransport(t, outboxamqp.Options{URL: b.url, CloudEvents: &cloudevents.Options{Source: "/s"}})
	batch := []outbox.Delivery{delivery(b.exchange, "t", `{}`), delivery(b.exchange, "t", `{}`)}
	batch[0].Headers = outbox.Headers{"cloudEvents:id": "forged"}
	errs := tr.Publish(context.Background(), batch)
	require.True(t, outbox.IsPermanent(errs[0]), "%v", errs[0])
	require.NoError(t, errs[1])
}

// TestMessageFaultsAreNotOutages: a message the broker or the client refuses for what it
// is, not because the broker is down, is never marked Unavailable, which would keep it
// pending for ever and hold the circuit breaker open. A header name or content type longer
// than AMQP's 255-byte short string cannot be encoded: that message is dead-lettered and
// the rest of its batch goes through. A publish the broker answers by closing the channel
// (here: an internal exchange, 403 ACCESS_REFUSED) costs the messages an attempt.
func TestMessageFaultsAreNotOutages(t *testing.T) {
	t.Parallel()
	b := setup(t, "ok", nil)
	tr := newTransport(t, outboxamqp.Options{URL: b.url})

	longName := delivery(b.exchange, "ok", `{"n":1}`)
	longName.Headers = outbox.Headers{strings.Repeat("h", 300): "v"}
	longType := delivery(b.exchange, "ok", `{"n":2}`)
	longType.Headers = outbox.Headers{"content-type": "application/" + strings.Repeat("x", 300)}
	fine := delivery(b.exchange, "ok", `{"n":3}`)
	errs := tr.Publish(context.Background(), []outbox.Delivery{longName, longType, fine})
	for i := range 2 {
		require.Error(t, errs[i], "message %d", i)
		require.True(t, outbox.IsPermanent(errs[i]), "message %d: %v", i, errs[i])
		require.False(t, outbox.IsUnavailable(errs[i]), "message %d: %v", i, errs[i])
	}
	require.NoError(t, errs[2])
	b.waitFor(t, 1, 10*time.Second)

	conn, err := amqp091.Dial(b.url)
	require.NoError(t, err)
	ch, err := conn.Channel()
	require.NoError(t, err)
	internal := uniqueName("outbox_t_internal_")
	require.NoError(t, ch.ExchangeDeclare(internal, "topic", false, true, true, false, nil))
	t.Cleanup(func() {
		_ = ch.ExchangeDelete(internal, false, false)
		_ = conn.Close()
	})
	errs = tr.Publish(context.Background(), []outbox.Delivery{delivery(internal, "ok", `{"n":4}`)})
	require.Error(t, errs[0])
	require.ErrorContains(t, errs[0], "ACCESS_REFUSED")
	require.False(t, outbox.IsUnavailable(errs[0]), "%v", errs[0])
	// The transport reconnects for the next batch.
	require.Empty(t, nonNil(tr.Publish(context.Background(), []outbox.Delivery{delivery(b.exchange, "ok", `{"n":5}`)})))
	b.waitFor(t, 2, 10*time.Second)
}
