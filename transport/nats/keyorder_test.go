package outboxnats_test

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/outboxtest/transporttest"
	"github.com/outboxgo/outbox/transport/nats"
)

// TestKeyOrder: a key's messages reach the stream in their batch order, and none after one
// the stream refuses (larger than its max_msg_size) is stored (transporttest.KeyOrder).
func TestKeyOrder(t *testing.T) {
	t.Parallel()
	js := connect(t, server(t))
	ns, s := stream(t, js, func(c *jetstream.StreamConfig) { c.MaxMsgSize = 4096 })
	tr := newTransport(t, js, outboxnats.Options{})
	transporttest.KeyOrder(t, tr, transporttest.KeyOrderCase{
		Namespace: ns, Topic: "order.changed",
		Consume: func() []transporttest.Received { return consume(t, s) },
		Break:   func(d *outbox.Delivery) { d.Payload = []byte(`"` + strings.Repeat("x", 8000) + `"`) },
	})
}
