//go:build acceptance

package outboxwebhook_test

import (
	"strings"
	"testing"

	"github.com/outboxgo/outbox/outboxtest/testproxy"
	"github.com/outboxgo/outbox/outboxtest/transporttest"
	"github.com/outboxgo/outbox/transport/webhook"
)

// TestDefaultsOutage: an endpoint that keeps its connections open and answers nothing costs
// no attempts with the Publisher's and the transport's default options
// (transporttest.DefaultsOutage).
func TestDefaultsOutage(t *testing.T) {
	t.Parallel()
	srv := newServer(t, false, nil)
	proxy := testproxy.New(t, strings.TrimPrefix(srv.URL, "http://"))
	logs := &transporttest.Logs{}
	tr := newTransport(t, outboxwebhook.Options{URL: "http://" + proxy.Addr() + "/{topic}", Secret: srv.secret, AllowHTTP: true, Logger: logs.Logger()})
	transporttest.DefaultsOutage(t, transporttest.Name("wh"), tr, proxy, logs, func() []transporttest.Received { return received(srv) })
}
