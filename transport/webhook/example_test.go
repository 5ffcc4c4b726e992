package outboxwebhook_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/transport/webhook"
)

// The transport posts each message to the URL built from its namespace and topic, signed
// with the endpoint's secret; the receiver here checks the signature. In a service, pass
// the transport to outbox.NewPublisher instead of calling Publish.
func Example() {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	key, err := outboxwebhook.ParseSecret(secret)
	if err != nil {
		log.Fatal(err)
	}
	receiver := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if outboxwebhook.Verify(key, r.Header, body, 0, time.Now()) != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		fmt.Printf("%s received %s\n", r.URL.Path, body)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer receiver.Close()

	tr, err := outboxwebhook.New(outboxwebhook.Options{
		URL:    receiver.URL + "/hooks/{namespace}/{topic}",
		Secret: secret,
		Client: receiver.Client(), // trusts the test server's certificate
	})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()

	errs := tr.Publish(context.Background(), []outbox.Delivery{{
		ID: uuid.New(), Namespace: "shop", Topic: "order.created", Payload: []byte(`{"order":1}`), Attempt: 1,
	}})
	fmt.Println("error:", errs[0])
	// Output:
	// /hooks/shop/order.created received {"order":1}
	// error: <nil>
}
