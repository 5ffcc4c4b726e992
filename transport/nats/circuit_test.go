package outboxnats_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/outboxgo/outbox/outboxtest/testproxy"
	"github.com/outboxgo/outbox/outboxtest/transporttest"
	"github.com/outboxgo/outbox/transport/nats"
)

// The server is cut away for 10 s in the middle of a 5,000-message run: the publisher's
// circuit opens, nothing is dead and no attempt is spent, and delivery resumes within two
// probe intervals (transporttest.CircuitOutage, on PostgreSQL).
func TestCircuitOutage(t *testing.T) {
	t.Parallel()
	proxy := testproxy.New(t, strings.TrimPrefix(server(t), "nats://"))
	admin := connect(t, server(t))
	ns, s := stream(t, admin, nil)
	js := connect(t, "nats://"+proxy.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	tr := newTransport(t, js, outboxnats.Options{AckTimeout: 300 * time.Millisecond})
	transporttest.CircuitOutage(t, ns, tr, proxy.Cut, proxy.Restore, func() []transporttest.Received { return consume(t, s) })
}

// The server is taken away through a proxy for a few seconds, refusing, answering nothing
// with the connection up, or flapping, while messages are waiting: the batches come back
// Unavailable, the circuit opens, no message spends more than one attempt, and all are
// delivered once the server is back (transporttest.ProxyOutage).
func TestProxyOutage(t *testing.T) {
	t.Parallel()
	for _, kind := range transporttest.OutageKinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			proxy := testproxy.New(t, strings.TrimPrefix(server(t), "nats://"))
			admin := connect(t, server(t))
			ns, s := stream(t, admin, nil)
			js := connect(t, "nats://"+proxy.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
				nats.Timeout(300*time.Millisecond))
			logs := &transporttest.Logs{}
			tr := newTransport(t, js, outboxnats.Options{AckTimeout: 500 * time.Millisecond, Logger: logs.Logger()})
			transporttest.ProxyOutage(t, kind, ns, tr, proxy, logs, func() []transporttest.Received { return consume(t, s) })
		})
	}
}
