//go:build acceptance

package outboxredis_test

import (
	"testing"

	"github.com/outboxgo/outbox/outboxtest/testproxy"
	"github.com/outboxgo/outbox/outboxtest/transporttest"
	"github.com/outboxgo/outbox/transport/redis"
)

// TestDefaultsOutage: a Redis server that keeps its connection open and answers nothing
// costs no attempts with the Publisher's, the transport's and go-redis's default options
// (transporttest.DefaultsOutage).
func TestDefaultsOutage(t *testing.T) {
	t.Parallel()
	admin := client(t, server(t))
	ns := namespace(t, admin)
	proxy := testproxy.New(t, server(t))
	logs := &transporttest.Logs{}
	tr := newTransport(t, client(t, proxy.Addr()), outboxredis.Options{Logger: logs.Logger()})
	transporttest.DefaultsOutage(t, ns, tr, proxy, logs, func() []transporttest.Received { return consume(t, admin, ns) })
}
