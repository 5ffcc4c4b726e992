//go:build acceptance

package outboxkafka_test

import (
	"testing"

	"github.com/outboxgo/outbox/outboxtest/transporttest"
	"github.com/outboxgo/outbox/transport/kafka"
)

// TestDefaultsOutage: a Kafka broker that keeps its connections open and answers nothing
// costs no attempts with the Publisher's, the transport's and franz-go's default options
// (transporttest.DefaultsOutage).
func TestDefaultsOutage(t *testing.T) {
	t.Parallel()
	ns, c, proxy, viaProxy := proxied(t, 3)
	logs := &transporttest.Logs{}
	tr := newTransport(t, client(t, c, viaProxy), outboxkafka.Options{Logger: logs.Logger()})
	transporttest.DefaultsOutage(t, ns, tr, proxy, logs, func() []transporttest.Received { return consume(t, c, ns, 400) })
}
