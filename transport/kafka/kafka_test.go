package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/transporttest"
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
	cl, err := kafka.NewClient(c.ListenAddrs(), extra...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

func newTransport(t testing.TB, cl *kgo.Client, opts kafka.Options) *kafka.Transport {
	t.Helper()
	tr, err := kafka.New(cl, opts)
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
	id, err := uuid.Parse(h[kafka.HeaderID])
	require.NoError(t, err)
	g := transporttest.Received{
		Route: r.Topic, ID: id, Namespace: h[kafka.HeaderNamespace], Topic: h[kafka.HeaderTopic],
		DedupeKey: h[kafka.HeaderDedupeKey], PartitionKey: string(r.Key), Payload: r.Value,
	}
	if v := h[kafka.HeaderTenantID]; v != "" {
		g.TenantID = uuid.MustParse(v)
	}
	g.Attempt, err = strconv.Atoi(h[kafka.HeaderAttempt])
	require.NoError(t, err)
	g.Headers = transporttest.Strip(h, kafka.HeaderID, kafka.HeaderNamespace, kafka.HeaderTopic,
		kafka.HeaderTenantID, kafka.HeaderDedupeKey, kafka.HeaderAttempt)
	return g
}

func TestPublishByteForByte(t *testing.T) {
	t.Parallel()
	c, ns := cluster(t)
	tr := newTransport(t, client(t, c), kafka.Options{})
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
	tr := newTransport(t, client(t, c), kafka.Options{Topic: func(outbox.Delivery) string { return ns + ".order.created" }})
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
	tr := newTransport(t, client(t, c), kafka.Options{})
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
	tr := newTransport(t, client(t, c, kgo.UnknownTopicRetries(1)), kafka.Options{Topic: func(d outbox.Delivery) string {
		switch d.Topic {
		case "order.created":
			return ns + ".missing"
		case "order.paid":
			return ns + "/bad name"
		}
		return kafka.DefaultTopic(d)
	}})
	batch := transporttest.Deliveries(transporttest.Messages(ns, 4)) // created, paid, shipped, created
	batch[2].Headers = outbox.Headers{"outbox-id": "spoofed"}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	errs := tr.Publish(ctx, batch)
	require.ErrorIs(t, errs[0], kerr.UnknownTopicOrPartition)
	require.False(t, outbox.IsPermanent(errs[0]), "%v", errs[0])
	require.ErrorIs(t, errs[1], kafka.ErrInvalid)
	require.True(t, outbox.IsPermanent(errs[1]))
	require.ErrorIs(t, errs[2], kafka.ErrInvalid)
	require.True(t, outbox.IsPermanent(errs[2]))
	require.ErrorIs(t, errs[3], kerr.UnknownTopicOrPartition)
}

func TestCancelledContext(t *testing.T) {
	t.Parallel()
	c, ns := cluster(t)
	transporttest.RequireCancelled(t, newTransport(t, client(t, c), kafka.Options{}), transporttest.Deliveries(transporttest.Messages(ns, 5)))
}

func TestClassify(t *testing.T) {
	t.Parallel()
	permanent := []error{
		kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidTopicException,
		kerr.InvalidRecord, kerr.InvalidRequiredAcks, kafka.ErrInvalid,
	}
	retryable := []error{
		kerr.NotLeaderForPartition, kerr.RequestTimedOut, kerr.NotEnoughReplicas, kerr.LeaderNotAvailable,
		kerr.UnknownTopicOrPartition, kerr.TopicAuthorizationFailed, kerr.OutOfOrderSequenceNumber,
		kerr.UnknownServerError, kgo.ErrRecordTimeout, kgo.ErrRecordRetries, kgo.ErrClientClosed,
		kgo.ErrMaxBuffered, context.Canceled, errors.New("dial tcp: connection refused"),
	}
	transporttest.RequireClassify(t, kafka.Classify, permanent, retryable)
}

func TestOptionsValidation(t *testing.T) {
	t.Parallel()
	_, err := kafka.New(nil, kafka.Options{})
	require.ErrorIs(t, err, kafka.ErrInvalid)
	c, _ := cluster(t)
	_, err = kafka.New(client(t, c), kafka.Options{Timeout: -1})
	require.ErrorIs(t, err, kafka.ErrInvalid)
	_, err = kafka.NewClient(nil)
	require.ErrorIs(t, err, kafka.ErrInvalid)
	cl := client(t, c, kgo.DisableIdempotentWrite())
	_, err = kafka.New(cl, kafka.Options{})
	require.ErrorIs(t, err, kafka.ErrInvalid)
	_, err = kafka.New(cl, kafka.Options{AllowNonIdempotent: true})
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
	tr := newTransport(t, cl, kafka.Options{Timeout: 500 * time.Millisecond})
	transporttest.Outage(t, ns, tr, func() { cut.Store(true) }, func() { cut.Store(false) },
		func() []transporttest.Received { return consume(t, c, ns, 120) }, false)
}

// A Publisher drains a PostgreSQL outbox into Kafka, and a consumer receives each message
// byte for byte.
func TestEndToEndFromPostgres(t *testing.T) {
	t.Parallel()
	c, ns := cluster(t)
	transporttest.EndToEnd(t, ns, newTransport(t, client(t, c), kafka.Options{}), func() []transporttest.Received { return consume(t, c, ns, 300) })
}
