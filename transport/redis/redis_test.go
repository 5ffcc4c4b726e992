package outboxredis_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	cesdk "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/google/uuid"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/cloudevents"
	"github.com/outboxgo/outbox/outboxtest/testdb"
	"github.com/outboxgo/outbox/outboxtest/testproxy"
	"github.com/outboxgo/outbox/outboxtest/transporttest"
	"github.com/outboxgo/outbox/transport/redis"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

var topics = []string{"order.created", "order.paid", "order.shipped"}

// server returns the Redis server's address, failing or skipping t when it is down.
func server(t testing.TB) string {
	return testdb.Service(t, "redis", "OUTBOX_REDIS_ADDR", "127.0.0.1:6379")
}

// client connects to addr, closed when t ends.
func client(t testing.TB, addr string, edit ...func(*redis.Options)) *redis.Client {
	t.Helper()
	o := &redis.Options{Addr: addr}
	for _, e := range edit {
		e(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// namespace returns a new namespace whose streams are deleted when t ends.
func namespace(t testing.TB, c *redis.Client) string {
	t.Helper()
	ns := transporttest.Name("rt")
	t.Cleanup(func() {
		keys := []string{ns + ":bad"}
		for _, tp := range topics {
			keys = append(keys, ns+":"+tp)
		}
		require.NoError(t, c.Del(context.Background(), keys...).Err())
	})
	return ns
}

func newTransport(t testing.TB, c redis.UniversalClient, opts outboxredis.Options) *outboxredis.Transport {
	t.Helper()
	tr, err := outboxredis.New(c, opts)
	require.NoError(t, err)
	return tr
}

// consume reads every entry of ns's streams from the start with XREAD, as a consumer would.
func consume(t testing.TB, c *redis.Client, ns string) []transporttest.Received {
	t.Helper()
	var got []transporttest.Received
	for _, tp := range topics {
		key, last := ns+":"+tp, "0"
		for {
			res, err := c.XRead(context.Background(), &redis.XReadArgs{Streams: []string{key, last}, Count: 100, Block: -1}).Result()
			if errors.Is(err, redis.Nil) {
				break
			}
			require.NoError(t, err)
			if len(res) == 0 || len(res[0].Messages) == 0 {
				break
			}
			for _, m := range res[0].Messages {
				got = append(got, decode(t, key, m))
				last = m.ID
			}
		}
	}
	return got
}

func decode(t testing.TB, stream string, m redis.XMessage) transporttest.Received {
	t.Helper()
	str := func(k string) string {
		v, _ := m.Values[k].(string)
		return v
	}
	id, err := uuid.Parse(str(outboxredis.FieldID))
	require.NoError(t, err)
	g := transporttest.Received{
		Route: stream, ID: id, Namespace: str(outboxredis.FieldNamespace), Topic: str(outboxredis.FieldTopic),
		PartitionKey: str(outboxredis.FieldPartitionKey), DedupeKey: str(outboxredis.FieldDedupeKey),
		Payload: []byte(str(outboxredis.FieldPayload)),
	}
	if v := str(outboxredis.FieldTenantID); v != "" {
		g.TenantID = uuid.MustParse(v)
	}
	g.Attempt, err = strconv.Atoi(str(outboxredis.FieldAttempt))
	require.NoError(t, err)
	if v := str(outboxredis.FieldHeaders); v != "" {
		require.NoError(t, json.Unmarshal([]byte(v), &g.Headers))
	}
	return g
}

func TestPublishByteForByte(t *testing.T) {
	t.Parallel()
	c := client(t, server(t))
	ns := namespace(t, c)
	tr := newTransport(t, c, outboxredis.Options{})
	batch := transporttest.Deliveries(transporttest.Messages(ns, 60))

	for i, err := range tr.Publish(context.Background(), batch) {
		require.NoError(t, err, "message %d", i)
	}
	got := consume(t, c, ns)
	transporttest.RequireSame(t, batch, got)
	for _, g := range got {
		require.Equal(t, g.Namespace+":"+g.Topic, g.Route, "default stream")
	}
}

// With MaxLen each XADD trims its stream to about that many entries.
func TestMaxLenTrims(t *testing.T) {
	t.Parallel()
	c := client(t, server(t))
	ns := namespace(t, c)
	tr := newTransport(t, c, outboxredis.Options{MaxLen: 10, Stream: func(outbox.Delivery) string { return ns + ":order.created" }})
	for range 10 {
		require.Empty(t, transporttest.Failures(tr.Publish(context.Background(), transporttest.Deliveries(transporttest.Messages(ns, 100)))))
	}
	n, err := c.XLen(context.Background(), ns+":order.created").Result()
	require.NoError(t, err)
	// "~" trims whole macro nodes (100 entries by default), never below MaxLen.
	require.GreaterOrEqual(t, n, int64(10))
	require.Less(t, n, int64(300), "the stream was not trimmed")
}

// One message whose stream key holds another type fails for good; the rest are appended.
func TestWrongTypeFailsAlone(t *testing.T) {
	t.Parallel()
	c := client(t, server(t))
	ns := namespace(t, c)
	require.NoError(t, c.Set(context.Background(), ns+":bad", "a string", 0).Err())
	tr := newTransport(t, c, outboxredis.Options{Stream: func(d outbox.Delivery) string {
		if d.Topic == "bad" {
			return ns + ":bad"
		}
		return outboxredis.DefaultStream(d)
	}})
	batch := transporttest.Deliveries(transporttest.Messages(ns, 9))
	batch[4].Topic = "bad"

	errs := tr.Publish(context.Background(), batch)
	require.Len(t, errs, len(batch))
	for i, err := range errs {
		if i == 4 {
			require.ErrorContains(t, err, "WRONGTYPE")
			require.True(t, outbox.IsPermanent(err), "%v", err)
			continue
		}
		require.NoError(t, err, "message %d", i)
	}
	transporttest.RequireSame(t, append(batch[:4:4], batch[5:]...), consume(t, c, ns))

	tr = newTransport(t, c, outboxredis.Options{Stream: func(outbox.Delivery) string { return "" }})
	errs = tr.Publish(context.Background(), batch[:1])
	require.ErrorIs(t, errs[0], outboxredis.ErrInvalid)
	require.True(t, outbox.IsPermanent(errs[0]))
}

// replyErr is an error reply as go-redis returns it.
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

func TestCancelledContext(t *testing.T) {
	t.Parallel()
	c := client(t, server(t))
	ns := namespace(t, c)
	transporttest.RequireCancelled(t, newTransport(t, c, outboxredis.Options{}), transporttest.Deliveries(transporttest.Messages(ns, 5)))
}

func TestClassify(t *testing.T) {
	t.Parallel()
	permanent := []error{
		replyErr("WRONGTYPE Operation against a key holding the wrong kind of value"),
		replyErr("ERR Protocol error: invalid bulk length"), replyErr("ERR syntax error"), outboxredis.ErrInvalid,
	}
	retryable := []error{
		replyErr("OOM command not allowed when used memory > 'maxmemory'."), replyErr("MISCONF Errors writing to disk"),
		replyErr("NOAUTH Authentication required."), replyErr("NOPERM this user has no permissions"),
		replyErr("MOVED 3999 127.0.0.1:6381"), replyErr("SOMETHINGNEW unknown"),
		redis.ErrClosed, redis.ErrPoolTimeout, context.DeadlineExceeded, context.Canceled,
		errors.New("connection refused"), // a message, not the network error
	}
	transporttest.RequireClassify(t, outboxredis.Classify, permanent, retryable)
	transporttest.RequireUnavailable(t, outboxredis.Classify, []error{
		replyErr("LOADING Redis is loading the dataset in memory"), replyErr("BUSY Redis is busy running a script"),
		replyErr("READONLY You can't write against a read only replica."), replyErr("CLUSTERDOWN The cluster is down"),
		replyErr("TRYAGAIN Multiple keys request during rehashing of slot"), replyErr("MASTERDOWN Link with MASTER is down"),
		replyErr("NOREPLICAS Not enough good replicas to write."), replyErr("ERR max number of clients reached"),
		syscall.ECONNREFUSED, syscall.ECONNRESET, io.EOF, os.ErrDeadlineExceeded,
		&net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded},
	})
}

// With the connection cut, every entry of every pipeline fails as an outage; once it is
// restored, a batch is appended whole and a consumer reads it.
func TestUnavailableWhileCut(t *testing.T) {
	t.Parallel()
	admin := client(t, server(t))
	ns := namespace(t, admin)
	proxy := testproxy.New(t, server(t))
	c := client(t, proxy.Addr(), func(o *redis.Options) {
		o.MaxRetries = -1
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 200*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond
	})
	tr := newTransport(t, c, outboxredis.Options{})
	require.Empty(t, transporttest.Failures(tr.Publish(context.Background(), transporttest.Deliveries(transporttest.Messages(ns, 5)))))
	delivered := transporttest.CutAndRestore(t, tr, func() []outbox.Delivery {
		return transporttest.Deliveries(transporttest.Messages(ns, 10))
	}, proxy.Cut, proxy.Restore)
	ids, _ := transporttest.IDs(consume(t, admin, ns))
	for _, d := range delivered {
		require.True(t, ids[d.ID], "entry %s missing after the cut", d.ID)
	}
}

// ceMessage is a stream entry as a CloudEvents binding message: its ce_ fields are the
// attributes and its payload field the data, so that the CloudEvents SDK decodes it.
type ceMessage map[string]any

func (m ceMessage) get(k string) string { v, _ := m[k].(string); return v }

func (m ceMessage) version() spec.Version {
	return spec.WithPrefix(outboxredis.CloudEventsPrefix).Version(m.get(outboxredis.CloudEventsPrefix + "specversion"))
}

func (m ceMessage) ReadEncoding() binding.Encoding {
	if m.version() == nil {
		return binding.EncodingUnknown
	}
	return binding.EncodingBinary
}

func (m ceMessage) ReadStructured(context.Context, binding.StructuredWriter) error {
	return binding.ErrNotStructured
}

func (m ceMessage) ReadBinary(_ context.Context, w binding.BinaryWriter) error {
	v := m.version()
	for k := range m {
		var err error
		if a := v.Attribute(k); a != nil {
			err = w.SetAttribute(a, m.get(k))
		} else if name, ok := strings.CutPrefix(k, outboxredis.CloudEventsPrefix); ok {
			err = w.SetExtension(name, m.get(k))
		}
		if err != nil {
			return err
		}
	}
	return w.SetData(strings.NewReader(m.get(outboxredis.FieldPayload)))
}

func (m ceMessage) GetAttribute(k spec.Kind) (spec.Attribute, any) {
	a := m.version().AttributeFromKind(k)
	if a == nil {
		return nil, nil
	}
	if x := m.get(a.PrefixedName()); x != "" {
		return a, x
	}
	return a, nil
}

func (m ceMessage) GetExtension(name string) any {
	if x := m.get(outboxredis.CloudEventsPrefix + name); x != "" {
		return x
	}
	return nil
}

func (m ceMessage) Finish(error) error { return nil }

// A consumer reads every entry back and decodes it with the CloudEvents SDK: a valid event
// with the message's id, source, type, time, content type, partition key, header
// extensions and the payload as data. The structured mode is refused.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	c := client(t, server(t))
	ns := namespace(t, c)
	tr := newTransport(t, c, outboxredis.Options{CloudEvents: &cloudevents.Options{Source: "/shop/orders"}})
	batch := transporttest.Deliveries(transporttest.Messages(ns, 12))
	batch[1].Headers = outbox.Headers{"content-type": "application/vnd.shop+json", "x-request-id": "r-1", "Tenant": "acme"}
	require.Empty(t, transporttest.Failures(tr.Publish(context.Background(), batch)))

	byID := map[string]cesdk.Event{}
	for _, tp := range topics {
		msgs, err := c.XRange(context.Background(), ns+":"+tp, "-", "+").Result()
		require.NoError(t, err)
		for _, m := range msgs {
			e, err := binding.ToEvent(context.Background(), ceMessage(m.Values))
			require.NoError(t, err)
			require.NoError(t, e.Validate())
			byID[e.ID()] = *e
			// The entry keeps the transport's own fields; headers holds what is no attribute.
			require.Equal(t, e.ID(), m.Values[outboxredis.FieldID])
		}
	}
	require.Len(t, byID, len(batch))
	for _, d := range batch {
		e := byID[d.ID.String()]
		require.Equal(t, "/shop/orders", e.Source())
		require.Equal(t, d.Topic, e.Type())
		require.True(t, d.CreatedAt.Equal(e.Time()))
		require.Equal(t, string(d.Payload), string(e.Data()))
		pk, _ := e.Extensions()["partitionkey"].(string)
		require.Equal(t, d.PartitionKey, pk)
		if tp, ok := d.Headers["traceparent"]; ok {
			require.Equal(t, tp, e.Extensions()["traceparent"])
		}
	}
	odd := byID[batch[1].ID.String()]
	require.Equal(t, "application/vnd.shop+json", odd.DataContentType())
	require.Equal(t, "acme", odd.Extensions()["tenant"])
	require.Equal(t, "application/json", byID[batch[0].ID.String()].DataContentType())
	for _, g := range consume(t, c, ns) {
		if g.ID == batch[1].ID {
			require.Equal(t, outbox.Headers{"x-request-id": "r-1"}, g.Headers)
		}
	}

	_, err := outboxredis.New(c, outboxredis.Options{CloudEvents: &cloudevents.Options{Source: "/s", Mode: cloudevents.Structured}})
	require.ErrorIs(t, err, outboxredis.ErrInvalid)
	_, err = outboxredis.New(c, outboxredis.Options{CloudEvents: &cloudevents.Options{}})
	require.ErrorIs(t, err, outbox.ErrInvalid)
}

func TestOptionsValidation(t *testing.T) {
	t.Parallel()
	_, err := outboxredis.New(nil, outboxredis.Options{})
	require.ErrorIs(t, err, outboxredis.ErrInvalid)
	_, err = outboxredis.New(client(t, server(t)), outboxredis.Options{MaxLen: -1})
	require.ErrorIs(t, err, outboxredis.ErrInvalid)
}

// The server goes away in the middle of a run: appends fail and are retried, nothing is
// dead-lettered, and once it is back every message is in its stream. Redis keeps no ids of
// ours, so an entry whose reply was lost may appear twice; every id appears at least once.
func TestServerOutage(t *testing.T) {
	t.Parallel()
	admin := client(t, server(t))
	ns := namespace(t, admin)
	proxy := testproxy.New(t, server(t))
	c := client(t, proxy.Addr(), func(o *redis.Options) {
		o.MaxRetries = -1
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 200*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond
	})
	transporttest.Outage(t, ns, newTransport(t, c, outboxredis.Options{}), proxy.Cut, proxy.Restore,
		func() []transporttest.Received { return consume(t, admin, ns) }, false)
}

// A Publisher drains a PostgreSQL outbox into Redis streams, and a consumer reads each
// message once, byte for byte.
func TestEndToEndFromPostgres(t *testing.T) {
	t.Parallel()
	c := client(t, server(t))
	ns := namespace(t, c)
	transporttest.EndToEnd(t, ns, newTransport(t, c, outboxredis.Options{}), func() []transporttest.Received { return consume(t, c, ns) })
}
