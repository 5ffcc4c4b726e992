package outboxredis_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/outboxtest/transporttest"
	"github.com/outboxgo/outbox/transport/redis"
)

// TestKeyOrder: a key's messages reach the stream in their batch order, and none after one
// whose XADD fails (its stream key holds a string) is appended (transporttest.KeyOrder).
func TestKeyOrder(t *testing.T) {
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
	transporttest.KeyOrder(t, tr, transporttest.KeyOrderCase{
		Namespace: ns, Topic: topics[0],
		Consume: func() []transporttest.Received { return consume(t, c, ns) },
		Break:   func(d *outbox.Delivery) { d.Topic = "bad" },
	})
}
