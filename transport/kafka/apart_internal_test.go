package outboxkafka

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxgo/outbox"
)

// TestApart: a key's record goes with the one ahead of it unless they go to different topics
// or either is close enough to the client's size limits that the client alone may refuse it.
func TestApart(t *testing.T) {
	t.Parallel()
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"), kgo.ProducerBatchMaxBytes(64<<10))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	tr, err := New(cl, Options{})
	require.NoError(t, err)
	small := outbox.Delivery{Namespace: "shop", Topic: "order.paid", PartitionKey: "k", Payload: []byte(`{}`)}
	other := small
	other.Topic = "order.shipped"
	big := small
	big.Payload = []byte(`"` + strings.Repeat("x", 61<<10) + `"`) // fits 64 KiB, not with the margin
	require.False(t, tr.apart(&small, &small))
	require.True(t, tr.apart(&small, &other))
	require.True(t, tr.apart(&small, &big))
	require.True(t, tr.apart(&big, &small))
	var calls []int
	outbox.PublishInKeyOrder(context.Background(), []outbox.Delivery{small, other, other, small, big}, tr.apart,
		func(_ context.Context, b []outbox.Delivery) []error { calls = append(calls, len(b)); return nil })
	require.Equal(t, []int{1, 2, 1, 1}, calls, "rounds {0}, {1, 2}, {3}, {4}")
	require.True(t, tr.KeepsKeyOrder())

	loose, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"), kgo.DisableIdempotentWrite())
	require.NoError(t, err)
	t.Cleanup(loose.Close)
	tr, err = New(loose, Options{AllowNonIdempotent: true})
	require.NoError(t, err)
	require.False(t, tr.KeepsKeyOrder(), "retries with several requests in flight may reorder a partition")
}
