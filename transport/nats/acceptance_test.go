//go:build acceptance

package outboxnats_test

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/outboxgo/outbox/outboxtest/testproxy"
	"github.com/outboxgo/outbox/outboxtest/transporttest"
	"github.com/outboxgo/outbox/transport/nats"
)

// TestDefaultsOutage: a JetStream server that keeps its connection open and answers nothing
// costs no attempts with the Publisher's and the transport's default options
// (transporttest.DefaultsOutage). The client reconnects for ever, as a service's should.
func TestDefaultsOutage(t *testing.T) {
	t.Parallel()
	proxy := testproxy.New(t, strings.TrimPrefix(server(t), "nats://"))
	ns, s := stream(t, connect(t, server(t)), nil)
	js := connect(t, "nats://"+proxy.Addr(), nats.MaxReconnects(-1))
	logs := &transporttest.Logs{}
	tr := newTransport(t, js, outboxnats.Options{Logger: logs.Logger()})
	transporttest.DefaultsOutage(t, ns, tr, proxy, logs, func() []transporttest.Received { return consume(t, s) })
}
