package outboxamqp_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/outboxtest/transporttest"
	"github.com/outboxgo/outbox/transport/amqp"
)

// TestKeyOrder: a key's messages reach the queue in their batch order, and none after one
// the broker returns as unroutable is published (transporttest.KeyOrder).
func TestKeyOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, "ok", nil)
	tr := newTransport(t, outboxamqp.Options{URL: b.url})
	transporttest.KeyOrder(t, tr, transporttest.KeyOrderCase{
		Namespace: b.exchange, Topic: "ok",
		Consume: func() []transporttest.Received {
			var got []transporttest.Received
			for _, d := range b.received() {
				id, err := uuid.Parse(d.MessageId)
				require.NoError(t, err)
				str := func(k string) string { s, _ := d.Headers[k].(string); return s }
				attempt, _ := d.Headers[outboxamqp.HeaderAttempt].(int64)
				got = append(got, transporttest.Received{Route: d.RoutingKey, ID: id,
					Namespace: str(outboxamqp.HeaderNamespace), Topic: str(outboxamqp.HeaderTopic),
					PartitionKey: str(outboxamqp.HeaderPartitionKey), Attempt: int(attempt), Payload: d.Body})
			}
			return got
		},
		Break: func(d *outbox.Delivery) { d.Topic = "nobody.listens" },
	})
}
