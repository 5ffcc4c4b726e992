package outboxamqp_test

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/outboxtest/transporttest"
	"github.com/outboxgo/outbox/transport/amqp"
)

// The broker is cut away for 10 s in the middle of a 5,000-message run: the publisher's
// circuit opens, nothing is dead and no attempt is spent, and delivery resumes within two
// probe intervals (transporttest.CircuitOutage, on PostgreSQL).
func TestCircuitOutage(t *testing.T) {
	t.Parallel()
	b := setup(t, "#", nil)
	u, proxy := proxied(t, b.url)
	tr := newTransport(t, outboxamqp.Options{URL: u, ReconnectMin: 20 * time.Millisecond, ReconnectMax: 100 * time.Millisecond})
	transporttest.CircuitOutage(t, b.exchange, tr, proxy.Cut, proxy.Restore, func() []transporttest.Received { return received(b) })
}

// The broker is taken away through a proxy for a few seconds, refusing or answering nothing
// with the connection up, while messages are waiting: the batches come back Unavailable,
// the circuit opens, no message spends more than one attempt, and all are delivered once
// the broker is back (transporttest.ProxyOutage).

func TestProxyOutage(t *testing.T) {
	t.Parallel()
	for _, kind := range transporttest.OutageKinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			b := setup(t, "#", nil)
			u, proxy := proxied(t, b.url)
			logs := &transporttest.Logs{}
			tr := newTransport(t, outboxamqp.Options{URL: u, ConfirmTimeout: time.Second, DialTimeout: 300 * time.Millisecond,
				ReconnectMin: 20 * time.Millisecond, ReconnectMax: 100 * time.Millisecond, Logger: logs.Logger()})
			transporttest.ProxyOutage(t, kind, b.exchange, tr, proxy, logs, func() []transporttest.Received { return received(b) })
		})
	}
}

// received returns the ids of what the broker delivered to b's queue.
func received(b *broker) []transporttest.Received {
	var got []transporttest.Received
	for _, d := range b.received() {
		if id, err := uuid.Parse(d.MessageId); err == nil {
			got = append(got, transporttest.Received{ID: id})
		}
	}
	return got
}
