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
	transporttest.CircuitOutage(t, b.exchange, tr, proxy.Cut, proxy.Restore, func() []transporttest.Received {
		var got []transporttest.Received
		for _, d := range b.received() {
			id, err := uuid.Parse(d.MessageId)
			if err == nil {
				got = append(got, transporttest.Received{ID: id})
			}
		}
		return got
	})
}
