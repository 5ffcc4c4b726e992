//go:build acceptance

package outboxamqp_test

import (
	"testing"

	"github.com/outboxgo/outbox/outboxtest/transporttest"
	"github.com/outboxgo/outbox/transport/amqp"
)

// TestDefaultsOutage: a RabbitMQ broker that keeps its connection open and answers nothing
// costs no attempts with the Publisher's and the transport's default options
// (transporttest.DefaultsOutage).
func TestDefaultsOutage(t *testing.T) {
	t.Parallel()
	b := setup(t, "#", nil)
	u, proxy := proxied(t, b.url)
	logs := &transporttest.Logs{}
	tr := newTransport(t, outboxamqp.Options{URL: u, Logger: logs.Logger()})
	transporttest.DefaultsOutage(t, b.exchange, tr, proxy, logs, func() []transporttest.Received { return received(b) })
}
