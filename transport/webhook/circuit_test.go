package outboxwebhook_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/outboxtest/testproxy"
	"github.com/outboxgo/outbox/outboxtest/transporttest"
	"github.com/outboxgo/outbox/transport/webhook"
)

// The endpoint (a real httptest server) is cut away for 10 s in the middle of a
// 5,000-message run: the publisher's circuit opens, nothing is dead and no attempt is
// spent, and delivery resumes within two probe intervals (transporttest.CircuitOutage, on
// PostgreSQL).
func TestCircuitOutage(t *testing.T) {
	t.Parallel()
	srv := newServer(t, false, nil)
	proxy := testproxy.New(t, strings.TrimPrefix(srv.URL, "http://"))
	tr := newTransport(t, outboxwebhook.Options{URL: "http://" + proxy.Addr() + "/{topic}", Secret: srv.secret, AllowHTTP: true,
		Timeout: 2 * time.Second, Concurrency: 16})
	transporttest.CircuitOutage(t, transporttest.Name("wh"), tr, proxy.Cut, proxy.Restore, func() []transporttest.Received { return received(srv) })
}

// The endpoint is taken away through a proxy for a few seconds, refusing or answering
// nothing with the connections up, while messages are waiting: the batches come back
// Unavailable, the circuit opens, no message spends more than one attempt, and all are
// delivered once the endpoint is back (transporttest.ProxyOutage).

func TestProxyOutage(t *testing.T) {
	t.Parallel()
	for _, kind := range transporttest.OutageKinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, false, nil)
			proxy := testproxy.New(t, strings.TrimPrefix(srv.URL, "http://"))
			logs := &transporttest.Logs{}
			tr := newTransport(t, outboxwebhook.Options{URL: "http://" + proxy.Addr() + "/{topic}", Secret: srv.secret, AllowHTTP: true,
				Timeout: 500 * time.Millisecond, Concurrency: 16, Logger: logs.Logger()})
			transporttest.ProxyOutage(t, kind, transporttest.Name("wh"), tr, proxy, logs, func() []transporttest.Received { return received(srv) })
		})
	}
}

// received returns the ids of the requests srv received.
func received(srv *server) []transporttest.Received {
	var got []transporttest.Received
	for _, r := range srv.requests() {
		if id, err := uuid.Parse(r.header.Get("webhook-id")); err == nil {
			got = append(got, transporttest.Received{ID: id})
		}
	}
	return got
}
