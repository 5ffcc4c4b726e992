package outboxwebhook_test

import (
	"net/http"
	"strconv"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/outboxtest/transporttest"
	"github.com/outboxgo/outbox/transport/webhook"
)

// TestKeyOrder: an endpoint receives a key's messages in their batch order, and none after
// one it answered 500 (transporttest.KeyOrder).
func TestKeyOrder(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	refuse := map[string]bool{}
	var got []transporttest.Received // the requests answered 2xx, in their order
	srv := newServer(t, false, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		id := r.Header.Get("webhook-id")
		if refuse[id] {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		attempt, _ := strconv.Atoi(r.Header.Get(outboxwebhook.HeaderAttempt))
		got = append(got, transporttest.Received{ID: uuid.MustParse(id),
			Namespace: r.Header.Get(outboxwebhook.HeaderNamespace), Topic: r.Header.Get(outboxwebhook.HeaderTopic),
			PartitionKey: r.Header.Get(outboxwebhook.HeaderPartitionKey), Attempt: attempt})
		w.WriteHeader(http.StatusNoContent)
	})
	tr := newTransport(t, outboxwebhook.Options{
		URLFunc: func(d *outbox.Delivery) (string, error) { return srv.URL + "/" + d.Topic, nil },
		Secret:  srv.secret, AllowHTTP: true,
	})
	transporttest.KeyOrder(t, tr, transporttest.KeyOrderCase{
		Namespace: "shop", Topic: "order.changed",
		Consume: func() []transporttest.Received {
			// The bodies are the payloads; the server's record of each request has them.
			bodies := map[string][]byte{}
			for _, r := range srv.requests() {
				bodies[r.header.Get("webhook-id")] = r.body
			}
			mu.Lock()
			defer mu.Unlock()
			out := make([]transporttest.Received, len(got))
			for i, g := range got {
				g.Payload = bodies[g.ID.String()]
				out[i] = g
			}
			return out
		},
		Break: func(d *outbox.Delivery) {
			mu.Lock()
			defer mu.Unlock()
			refuse[d.ID.String()] = true
		},
	})
}
