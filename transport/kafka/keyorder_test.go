package outboxkafka_test

import (
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/outboxtest/transporttest"
	"github.com/outboxgo/outbox/transport/kafka"
)

// TestKeyOrder: a key's records reach their partition in batch order, and none after one
// that fails is written (transporttest.KeyOrder), whether the broker refuses it (larger
// than message.max.bytes: the client fails the partition's later records, whose sequence
// numbers no longer follow on) or the client does (larger than its batch limit: only
// that record fails, so the records after it must have waited for it).
func TestKeyOrder(t *testing.T) {
	t.Parallel()
	t.Run("broker refuses", func(t *testing.T) {
		t.Parallel()
		ns := transporttest.Name("kt")
		c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(3, ns+"."+topics[0]),
			kfake.BrokerConfigs(map[string]string{"message.max.bytes": "65536"}))
		require.NoError(t, err)
		t.Cleanup(c.Close)
		tr := newTransport(t, client(t, c, kgo.ProducerBatchMaxBytes(256<<10)), outboxkafka.Options{})
		transporttest.KeyOrder(t, tr, transporttest.KeyOrderCase{
			Namespace: ns, Topic: topics[0], Shared: true,
			Consume: func() []transporttest.Received { return consume(t, c, ns, 0) },
			Break:   func(d *outbox.Delivery) { d.Payload = incompressible(100_000) },
		})
	})
	t.Run("client refuses", func(t *testing.T) {
		t.Parallel()
		c, ns := cluster(t)
		tr := newTransport(t, client(t, c), outboxkafka.Options{})
		transporttest.KeyOrder(t, tr, transporttest.KeyOrderCase{
			Namespace: ns, Topic: topics[0],
			Consume: func() []transporttest.Received { return consume(t, c, ns, 0) },
			Break:   func(d *outbox.Delivery) { d.Payload = incompressible(1_100_000) },
		})
	})
}

// incompressible returns a JSON string of about n bytes that the client's compression
// cannot shrink below the broker's limit.
func incompressible(n int) []byte {
	b := make([]byte, n/2)
	_, _ = rand.Read(b)
	return []byte(`"` + hex.EncodeToString(b) + `"`)
}
