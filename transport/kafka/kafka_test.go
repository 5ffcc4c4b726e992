package outboxkafka_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	cesarama "github.com/cloudevents/sdk-go/protocol/kafka_sarama/v2"
	cesdk "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/google/uuid"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/cloudevents"
	"github.com/outboxgo/outbox/outboxtest/cloudeventsjs"
	"github.com/outboxgo/outbox/outboxtest/transporttest"
	"github.com/outboxgo/outbox/transport/kafka"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

var topics = []string{"order.created", "order.paid", "order.shipped"}

// cluster starts an in-process Kafka cluster of three brokers with the topics of
// transporttest.Messages in a new namespace, closed when t ends.
func cluster(t testing.TB) (c *kfake.Cluster, ns string) {
	t.Helper()
	ns = transporttest.Name("kt")
	var seed []string
	for _, tp := range topics {
		seed = append(seed, ns+"."+tp)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(3, seed...))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c, ns
}

// client returns a producer client built the way the package recommends, closed when t ends.
func client(t testing.TB, c *kfake.Cluster, extra ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := outboxkafka.NewClient(c.ListenAddrs(), extra...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

func newTransport(t testing.TB, cl *kgo.Client, opts outboxkafka.Options) *outboxkafka.Transport {
	t.Helper()
	tr, err := outboxkafka.New(cl, opts)
	require.NoError(t, err)
	return tr
}

// consume reads every record of ns's topics from the start with a real consumer, until
// want records arrived and no more come for a moment.
func consume(t testing.TB, c *kfake.Cluster, ns string, want int) []transporttest.Received {
	t.Helper()
	var ts []string
	for _, tp := range topics {
		ts = append(ts, ns+"."+tp)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(ts...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	require.NoError(t, err)
	defer cl.Close()
	var got []transporttest.Received
	deadline := time.Now().Add(15 * time.Second)
	quiet := 0
	for quiet < 3 { // three empty polls after the last wanted record: nothing more is coming
		require.True(t, time.Now().Before(deadline), "consumed %d of %d records", len(got), want)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		n := 0
		fs.EachRecord(func(r *kgo.Record) {
			n++
			got = append(got, decode(t, r))
		})
		if n == 0 && len(got) >= want {
			quiet++
		}
	}
	return got
}

func decode(t testing.TB, r *kgo.Record) transporttest.Received {
	t.Helper()
	h := map[string]string{}
	for _, x := range r.Headers {
		h[x.Key] = string(x.Value)
	}
	id, err := uuid.Parse(h[outboxkafka.HeaderID])
	require.NoError(t, err)
	g := transporttest.Received{
		Route: r.Topic, ID: id, Namespace: h[outboxkafka.HeaderNamespace], Topic: h[outboxkafka.HeaderTopic],
		DedupeKey: h[outboxkafka.HeaderDedupeKey], PartitionKey: string(r.Key), Payload: r.Value,
	}
	if v := h[outboxkafka.HeaderTenantID]; v != "" {
		g.TenantID = uuid.MustParse(v)
	}
	g.Attempt, err = strconv.Atoi(h[outboxkafka.HeaderAttempt])
	require.NoError(t, err)
	g.Headers = transporttest.Strip(h, outboxkafka.HeaderID, outboxkafka.HeaderNamespace, outboxkafka.HeaderTopic,
		outboxkafka.HeaderTenantID, outboxkafka.HeaderDedupeKey, outboxkafka.HeaderAttempt)
	return g
}

func TestPublishByteForByte(t *testing.T) {
	t.Parallel()
	c, ns := cluster(t)
	tr := newTransport(t, client(t, c), outboxkafka.Options{})
	batch := transporttest.Deliveries(transporttest.Messages(ns, 60))

	for i, err := range tr.Publish(context.Background(), batch) {
		require.NoError(t, err, "message %d", i)
	}
	got := consume(t, c, ns, len(batch))
	transporttest.RequireSame(t, batch, got)
	for _, g := range got {
		require.Equal(t, g.Namespace+"."+g.Topic, g.Route, "default topic")
	}
}

// Records with the same key land on one partition, in order.
func TestKeyKeepsOrder(t *testing.T) {
	t.Parallel()
	c, ns := cluster(t)
	tr := newTransport(t, client(t, c), outboxkafka.Options{Topic: func(outbox.Delivery) string { return ns + ".order.created" }})
	msgs := transporttest.Messages(ns, 40)
	for i := range msgs {
		msgs[i].PartitionKey = fmt.Sprintf("k%d", i%4)
	}
	batch := transporttest.Deliveries(msgs)
	require.Empty(t, transporttest.Failures(tr.Publish(context.Background(), batch)))

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(ns+".order.created"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	partitionOf := map[string]int32{}
	order := map[string][]uuid.UUID{}
	for n := 0; n < len(batch); {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		require.NoError(t, fs.Err())
		fs.EachRecord(func(r *kgo.Record) {
			n++
			k := string(r.Key)
			if p, ok := partitionOf[k]; ok {
				require.Equal(t, p, r.Partition, "key %s on two partitions", k)
			}
			partitionOf[k] = r.Partition
			order[k] = append(order[k], decode(t, r).ID)
		})
	}
	for _, d := range batch {
		k := d.PartitionKey
		require.Equal(t, d.ID, order[k][0], "order of key %s", k)
		order[k] = order[k][1:]
	}
}

// One record larger than the producer accepts fails for good; the rest are delivered.
func TestOversizedRecordFailsAlone(t *testing.T) {
	t.Parallel()
	c, ns := cluster(t)
	tr := newTransport(t, client(t, c), outboxkafka.Options{})
	batch := transporttest.Deliveries(transporttest.Messages(ns, 9))
	batch[4].Payload = []byte(`"` + strings.Repeat("x", 1_100_000) + `"`) // over the 1,000,012-byte batch limit

	errs := tr.Publish(context.Background(), batch)
	require.Len(t, errs, len(batch))
	for i, err := range errs {
		if i == 4 {
			require.ErrorIs(t, err, kerr.MessageTooLarge)
			require.True(t, outbox.IsPermanent(err), "%v", err)
			continue
		}
		require.NoError(t, err, "message %d", i)
	}
	transporttest.RequireSame(t, append(batch[:4:4], batch[5:]...), consume(t, c, ns, len(batch)-1))
}

// A topic that does not exist is retried, not dead-lettered; an invalid topic name and a
// reserved header are refused for good without reaching the cluster.
func TestRoutingErrors(t *testing.T) {
	t.Parallel()
	c, ns := cluster(t)
	tr := newTransport(t, client(t, c, kgo.UnknownTopicRetries(1)), outboxkafka.Options{Topic: func(d outbox.Delivery) string {
		switch d.Topic {
		case "order.created":
			return ns + ".missing"
		case "order.paid":
			return ns + "/bad name"
		}
		return outboxkafka.DefaultTopic(d)
	}})
	batch := transporttest.Deliveries(transporttest.Messages(ns, 4)) // created, paid, shipped, created
	batch[2].Headers = outbox.Headers{"outbox-id": "spoofed"}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	errs := tr.Publish(ctx, batch)
	require.ErrorIs(t, errs[0], kerr.UnknownTopicOrPartition)
	require.False(t, outbox.IsPermanent(errs[0]), "%v", errs[0])
	require.ErrorIs(t, errs[1], outboxkafka.ErrInvalid)
	require.True(t, outbox.IsPermanent(errs[1]))
	require.ErrorIs(t, errs[2], outboxkafka.ErrInvalid)
	require.True(t, outbox.IsPermanent(errs[2]))
	require.ErrorIs(t, errs[3], kerr.UnknownTopicOrPartition)
}

func TestCancelledContext(t *testing.T) {
	t.Parallel()
	c, ns := cluster(t)
	transporttest.RequireCancelled(t, newTransport(t, client(t, c), outboxkafka.Options{}), transporttest.Deliveries(transporttest.Messages(ns, 5)))
}

func TestClassify(t *testing.T) {
	t.Parallel()
	permanent := []error{
		kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidTopicException,
		kerr.InvalidRecord, kerr.InvalidRequiredAcks, outboxkafka.ErrInvalid,
	}
	retryable := []error{
		kerr.UnknownTopicOrPartition, kerr.TopicAuthorizationFailed, kerr.OutOfOrderSequenceNumber,
		kerr.UnknownServerError, kgo.ErrRecordRetries, kgo.ErrClientClosed,
		kgo.ErrMaxBuffered, context.Canceled, errors.New("dial tcp: connection refused"), // a message, not the network error
	}
	transporttest.RequireClassify(t, outboxkafka.Classify, permanent, retryable)
	transporttest.RequireUnavailable(t, outboxkafka.Classify, []error{
		kerr.BrokerNotAvailable, kerr.LeaderNotAvailable, kerr.NotLeaderForPartition, kerr.NetworkException,
		kerr.NotEnoughReplicas, kerr.NotEnoughReplicasAfterAppend, kerr.CoordinatorNotAvailable,
		syscall.ECONNREFUSED, syscall.ECONNRESET, io.EOF, &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded},
		fmt.Errorf("%w, last err: %w", kgo.ErrRecordTimeout, syscall.ECONNREFUSED),
		kgo.ErrRecordTimeout, kerr.RequestTimedOut, // no acknowledgement in time: never the record's fault
	})
}

// With every connection to a one-broker cluster going through a proxy that is cut, the
// records of every batch time out and no broker answers: each fails as an outage. Once the
// proxy is restored, a batch is produced whole and a consumer reads it.
func TestUnavailableWhileCut(t *testing.T) {
	t.Parallel()
	ns, c, proxy, viaProxy := proxied(t, 1)
	cl := client(t, c, viaProxy, kgo.RecordDeliveryTimeout(time.Second), kgo.RetryBackoffFn(func(int) time.Duration { return 20 * time.Millisecond }))
	tr := newTransport(t, cl, outboxkafka.Options{Timeout: 500 * time.Millisecond})
	// The first batch goes through a transport of the same client that waits as long as a
	// deployed one: the client's first produce (the producer id, the topics' metadata, their
	// creation through the proxy) took longer than the half second the cut's detection is
	// given, under the race detector beside CI's other packages.
	warm := newTransport(t, cl, outboxkafka.Options{})
	require.Empty(t, transporttest.Failures(warm.Publish(context.Background(), transporttest.Deliveries(transporttest.Messages(ns, 5)))))

	delivered := transporttest.CutAndRestore(t, tr, func() []outbox.Delivery {
		return transporttest.Deliveries(transporttest.Messages(ns, 10))
	}, proxy.Cut, proxy.Restore)
	ids, _ := transporttest.IDs(consume(t, c, ns, 15))
	for _, d := range delivered {
		require.True(t, ids[d.ID], "record %s missing after the cut", d.ID)
	}
}

// ceMessage is a record as the CloudEvents SDK's Kafka protocol binding (kafka_sarama)
// reads it: the consumer message a sarama consumer would hand it, with the record's own
// headers, key and value.
func ceMessage(r *kgo.Record) binding.Message {
	cm := &sarama.ConsumerMessage{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp}
	for _, h := range r.Headers {
		cm.Headers = append(cm.Headers, &sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
	}
	return cesarama.NewMessageFromConsumerMessage(cm)
}

// A consumer decodes every record with the CloudEvents SDK's Kafka binding, in both modes, and finds the
// message's id, source, type, time, content type, partition key, header extensions and the
// payload as data; the record key is still the partition key.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	for _, mode := range []cloudevents.Mode{cloudevents.Binary, cloudevents.Structured} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			t.Parallel()
			c, ns := cluster(t)
			tr := newTransport(t, client(t, c), outboxkafka.Options{CloudEvents: &cloudevents.Options{Source: "/shop/orders", Mode: mode}})
			batch := transporttest.Deliveries(transporttest.Messages(ns, 12))
			contentType := "application/vnd.shop+json"
			batch[1].Headers = outbox.Headers{"content-type": contentType, "x-request-id": "r-1", "Tenant": "acme"}
			require.Empty(t, transporttest.Failures(tr.Publish(context.Background(), batch)))

			var ts []string
			for _, tp := range topics {
				ts = append(ts, ns+"."+tp)
			}
			cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(ts...),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			require.NoError(t, err)
			defer cl.Close()
			byID := map[string]cesdk.Event{}
			keys := map[string]string{}
			var other map[string]string
			var records []cloudeventsjs.Message
			transporttest.Poll(t, 15*time.Second, func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
					h := map[string]string{}
					for _, rh := range r.Headers {
						h[rh.Key] = string(rh.Value)
					}
					records = append(records, cloudeventsjs.Message{Binding: cloudeventsjs.Kafka, Headers: h, Key: string(r.Key), Body: r.Value})
					e, err := binding.ToEvent(context.Background(), ceMessage(r))
					require.NoError(t, err)
					require.NoError(t, e.Validate())
					byID[e.ID()], keys[e.ID()] = *e, string(r.Key)
					if e.ID() == batch[1].ID.String() {
						other = map[string]string{}
						for _, h := range r.Headers {
							other[h.Key] = string(h.Value)
						}
					}
				})
				return len(byID) == len(batch)
			}, "events received: %d of %d", len(byID), len(batch))
			for _, d := range batch {
				e := byID[d.ID.String()]
				require.Equal(t, "/shop/orders", e.Source())
				require.Equal(t, d.Topic, e.Type())
				require.True(t, d.CreatedAt.Equal(e.Time()))
				require.JSONEq(t, string(d.Payload), string(e.Data()))
				if mode == cloudevents.Binary {
					require.Equal(t, string(d.Payload), string(e.Data()))
				}
				pk, _ := e.Extensions()["partitionkey"].(string)
				require.Equal(t, d.PartitionKey, pk)
				require.Equal(t, d.PartitionKey, keys[d.ID.String()])
				if tp, ok := d.Headers["traceparent"]; ok {
					require.Equal(t, tp, e.Extensions()["traceparent"])
				}
			}
			odd := byID[batch[1].ID.String()]
			require.Equal(t, contentType, odd.DataContentType())
			require.Equal(t, string(batch[1].Payload), string(odd.Data()), "a +json payload arrives byte for byte")
			require.Equal(t, "acme", odd.Extensions()["tenant"])
			require.Equal(t, "r-1", other["x-request-id"], "a header that is no attribute name is sent as it is")
			require.Equal(t, "application/json", byID[batch[0].ID.String()].DataContentType())

			// A JavaScript consumer decodes every record with the JavaScript SDK.
			js := map[string]cloudeventsjs.Event{}
			for _, e := range cloudeventsjs.Decode(t, records) {
				require.Empty(t, e.Error)
				js[e.Attributes["id"]] = e
			}
			require.Len(t, js, len(batch))
			for _, d := range batch {
				ct := d.Headers["content-type"]
				if ct == "" {
					ct = "application/json"
				}
				cloudeventsjs.RequireDelivery(t, d, js[d.ID.String()], "/shop/orders", d.Topic, ct)
			}
			require.Equal(t, "acme", js[batch[1].ID.String()].Attributes["tenant"])
		})
	}
}

// The option needs a source; a message header that would replace an attribute is refused
// for good.
func TestCloudEventsRefusals(t *testing.T) {
	t.Parallel()
	c, ns := cluster(t)
	_, err := outboxkafka.New(client(t, c), outboxkafka.Options{CloudEvents: &cloudevents.Options{}})
	require.ErrorIs(t, err, outbox.ErrInvalid)
	tr := newTransport(t, client(t, c), outboxkafka.Options{CloudEvents: &cloudevents.Options{Source: "/s"}})
	batch := transporttest.Deliveries(transporttest.Messages(ns, 2))
	batch[0].Headers = outbox.Headers{"ce_id": "forged"}
	batch[1].Headers = outbox.Headers{"content-type": "a/b", "Content-Type": "c/d"}
	for i, err := range tr.Publish(context.Background(), batch) {
		require.True(t, outbox.IsPermanent(err), "message %d: %v", i, err)
	}
}

func TestOptionsValidation(t *testing.T) {
	t.Parallel()
	_, err := outboxkafka.New(nil, outboxkafka.Options{})
	require.ErrorIs(t, err, outboxkafka.ErrInvalid)
	c, _ := cluster(t)
	_, err = outboxkafka.New(client(t, c), outboxkafka.Options{Timeout: -1})
	require.ErrorIs(t, err, outboxkafka.ErrInvalid)
	_, err = outboxkafka.NewClient(nil)
	require.ErrorIs(t, err, outboxkafka.ErrInvalid)
	cl := client(t, c, kgo.DisableIdempotentWrite())
	_, err = outboxkafka.New(cl, outboxkafka.Options{})
	require.ErrorIs(t, err, outboxkafka.ErrInvalid)
	_, err = outboxkafka.New(cl, outboxkafka.Options{AllowNonIdempotent: true})
	require.NoError(t, err)
}

// The cluster drops every connection in the middle of a run: produces time out and are
// retried, nothing is dead-lettered, and once it is back every message is in the topics.
// Kafka keeps no record ids, so a record that was written but whose result came too late
// may appear twice; every id appears at least once.
func TestClusterOutage(t *testing.T) {
	t.Parallel()
	c, ns := cluster(t)
	var cut atomic.Bool
	c.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
		if cut.Load() {
			c.KeepControl()
			return nil, errors.New("connection cut by the test"), true
		}
		return nil, nil, false
	})
	cl := client(t, c, kgo.RecordDeliveryTimeout(time.Second), kgo.RetryBackoffFn(func(int) time.Duration { return 20 * time.Millisecond }))
	tr := newTransport(t, cl, outboxkafka.Options{Timeout: 500 * time.Millisecond})
	transporttest.Outage(t, ns, tr, func() { cut.Store(true) }, func() { cut.Store(false) },
		func() []transporttest.Received { return consume(t, c, ns, 120) }, false)
}

// A Publisher drains a PostgreSQL outbox into Kafka, and a consumer receives each message
// byte for byte.
func TestEndToEndFromPostgres(t *testing.T) {
	t.Parallel()
	c, ns := cluster(t)
	transporttest.EndToEnd(t, ns, newTransport(t, client(t, c), outboxkafka.Options{}), func() []transporttest.Received { return consume(t, c, ns, 300) })
}
