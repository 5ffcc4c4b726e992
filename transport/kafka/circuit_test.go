package outboxkafka_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxgo/outbox/outboxtest/testproxy"
	"github.com/outboxgo/outbox/outboxtest/transporttest"
	"github.com/outboxgo/outbox/transport/kafka"
)

// The cluster is cut away for 10 s in the middle of a 5,000-message run: the publisher's
// circuit opens, nothing is dead and no attempt is spent, and delivery resumes within two
// probe intervals (transporttest.CircuitOutage, on PostgreSQL).
func TestCircuitOutage(t *testing.T) {
	t.Parallel()
	ns, c, proxy, viaProxy := proxied(t, 3)
	cl := client(t, c, viaProxy, kgo.RecordDeliveryTimeout(time.Second), kgo.RetryBackoffFn(func(int) time.Duration { return 20 * time.Millisecond }))
	tr := newTransport(t, cl, outboxkafka.Options{Timeout: 3 * time.Second})
	transporttest.CircuitOutage(t, ns, tr, proxy.Cut, proxy.Restore,
		func() []transporttest.Received { return consume(t, c, ns, 5000) })
}

// The cluster is taken away through a proxy for a few seconds, refusing, answering nothing
// with the connections up, or flapping, while messages are waiting: the batches come back
// Unavailable, the circuit opens, no message spends more than one attempt, and all are
// delivered once the cluster is back (transporttest.ProxyOutage, kfake behind the proxy).
func TestProxyOutage(t *testing.T) {
	t.Parallel()
	for _, kind := range transporttest.OutageKinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			ns, c, proxy, viaProxy := proxied(t, 3)
			cl := client(t, c, viaProxy, kgo.RecordDeliveryTimeout(time.Second), kgo.RequestTimeoutOverhead(300*time.Millisecond),
				kgo.RetryBackoffFn(func(int) time.Duration { return 20 * time.Millisecond }))
			logs := &transporttest.Logs{}
			tr := newTransport(t, cl, outboxkafka.Options{Timeout: 2 * time.Second, Logger: logs.Logger()})
			transporttest.ProxyOutage(t, kind, ns, tr, proxy, logs, func() []transporttest.Received { return consume(t, c, ns, 400) })
		})
	}
}

// proxied starts a one-broker kfake cluster with the topics of a new namespace, partitions
// each, and a proxy in front of it; viaProxy makes a client dial every broker through the
// proxy, so that the proxy takes every connection of the client to the cluster.
func proxied(t *testing.T, partitions int32) (ns string, c *kfake.Cluster, proxy *testproxy.Proxy, viaProxy kgo.Opt) {
	t.Helper()
	ns = transporttest.Name("kt")
	var seed []string
	for _, tp := range topics {
		seed = append(seed, ns+"."+tp)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, seed...))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	proxy = testproxy.New(t, c.ListenAddrs()[0])
	viaProxy = kgo.Dialer(func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, proxy.Addr())
	})
	return ns, c, proxy, viaProxy
}
