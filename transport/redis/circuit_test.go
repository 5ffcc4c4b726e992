package outboxredis_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"

	"github.com/outboxgo/outbox/outboxtest/testproxy"
	"github.com/outboxgo/outbox/outboxtest/transporttest"
	"github.com/outboxgo/outbox/transport/redis"
)

// The server is cut away for 10 s in the middle of a 5,000-message run: the publisher's
// circuit opens, nothing is dead and no attempt is spent, and delivery resumes within two
// probe intervals (transporttest.CircuitOutage, on PostgreSQL).
func TestCircuitOutage(t *testing.T) {
	t.Parallel()
	admin := client(t, server(t))
	ns := namespace(t, admin)
	proxy := testproxy.New(t, server(t))
	c := client(t, proxy.Addr(), func(o *redis.Options) {
		o.MaxRetries = -1
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 200*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond
	})
	transporttest.CircuitOutage(t, ns, newTransport(t, c, outboxredis.Options{}), proxy.Cut, proxy.Restore,
		func() []transporttest.Received { return consume(t, admin, ns) })
}

// The server is taken away through a proxy for a few seconds, refusing, answering nothing
// with the connections up, or flapping, while messages are waiting: the batches come back
// Unavailable, the circuit opens, no message spends more than one attempt, and all are
// delivered once the server is back (transporttest.ProxyOutage).
func TestProxyOutage(t *testing.T) {
	t.Parallel()
	for _, kind := range transporttest.OutageKinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			admin := client(t, server(t))
			ns := namespace(t, admin)
			proxy := testproxy.New(t, server(t))
			c := client(t, proxy.Addr(), func(o *redis.Options) {
				o.MaxRetries = -1 // the client's backoff between refused dials would outlast a short cut
				o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 200*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond
			})
			logs := &transporttest.Logs{}
			tr := newTransport(t, c, outboxredis.Options{Timeout: time.Second, Logger: logs.Logger()})
			transporttest.ProxyOutage(t, kind, ns, tr, proxy, logs, func() []transporttest.Received { return consume(t, admin, ns) })
		})
	}
}

// A first publish into a server that accepts the connection and never answers returns
// within the transport's Timeout, whatever the client's own timeouts and retries (3 s reads,
// 3 retries by default), and fails Unavailable.
func TestHungFirstPublishIsBounded(t *testing.T) {
	t.Parallel()
	proxy := testproxy.New(t, server(t))
	proxy.Blackhole()
	c := client(t, proxy.Addr())
	tr := newTransport(t, c, outboxredis.Options{Timeout: 300 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	start := time.Now()
	errs := tr.Publish(context.Background(), transporttest.Deliveries(transporttest.Messages("rt_hung", 3)))
	took := time.Since(start)
	require.Less(t, took, 2*time.Second, "Publish took %s", took)
	for i, err := range errs {
		require.True(t, outbox.IsUnavailable(err), "message %d: %v", i, err)
	}
	proxy.Restore() // lets the client's abandoned reads end before the leak check
}
