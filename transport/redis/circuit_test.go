package outboxredis_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxgo/outbox/outboxtest/testproxy"
	"github.com/outboxgo/outbox/outboxtest/transporttest"
	"github.com/outboxgo/outbox/transport/redis"
)

// The server is cut away for 10 s in the middle of a 5,000-message run: the publisher's
// circuit opens, nothing is dead and no attempt is spent, and delivery resumes within two
// probe intervals (transporttest.CircuitOutage, on PostgreSQL).
func TestCircuitOutage(t *testing.T) {
	t.Parallel()
	admin := client(t, server(t))
	ns := namespace(t, admin)
	proxy := testproxy.New(t, server(t))
	c := client(t, proxy.Addr(), func(o *redis.Options) {
		o.MaxRetries = -1
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 200*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond
	})
	transporttest.CircuitOutage(t, ns, newTransport(t, c, outboxredis.Options{}), proxy.Cut, proxy.Restore,
		func() []transporttest.Received { return consume(t, admin, ns) })
}
