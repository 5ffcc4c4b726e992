package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/transport/webhook"
)

// webhookConcurrency is the requests in flight of each side, the transport's default.
const webhookConcurrency = outboxwebhook.DefaultConcurrency

// newWebhook measures against an in-process HTTPS receiver (httptest.NewTLSServer, HTTP/1.1
// with keep-alive) that verifies every signature and answers 204. Both sides call it over
// TLS through http.Transports of their own cloned from the same configuration, with
// webhookConcurrency idle connections per host, so that each pays one handshake per
// connection and nothing per request beyond what the other pays.
func newWebhook(_ context.Context) (*broker, error) {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	var received atomic.Int64
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if err := outboxwebhook.Verify(key, r.Header, body, 0, time.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		received.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	httpTransport := func() *http.Transport {
		tr := srv.Client().Transport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = webhookConcurrency
		return tr
	}
	trHTTP, clientHTTP := httpTransport(), httpTransport()
	tr, err := outboxwebhook.New(outboxwebhook.Options{
		URL: srv.URL + "/{namespace}/{topic}", Key: key, Concurrency: webhookConcurrency,
		Client: &http.Client{Transport: trHTTP},
	})
	if err != nil {
		srv.Close()
		return nil, err
	}
	return &broker{
		name: "webhook", transport: tr,
		client: webhookClient(&http.Client{Transport: clientHTTP, Timeout: outboxwebhook.DefaultTimeout}, srv.URL, key),
		stored: func(context.Context) (int64, error) { return received.Load(), nil },
		reset: func(context.Context) error {
			received.Store(0)
			return nil
		},
		close: func() {
			trHTTP.CloseIdleConnections()
			clientHTTP.CloseIdleConnections()
			srv.Close()
		},
	}, nil
}

// webhookClient is what a hand-written relay does with net/http: one POST per message, at
// most webhookConcurrency in flight across batches, the Standard Webhooks signature
// computed inline, and the transport's headers.
func webhookClient(hc *http.Client, base string, key []byte) outbox.Transport {
	sem := make(chan struct{}, webhookConcurrency)
	post := func(ctx context.Context, d *outbox.Delivery) error {
		id := d.ID.String()
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(id + "." + ts + "."))
		mac.Write(d.Payload)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost,
			base+"/"+url.PathEscape(d.Namespace)+"/"+url.PathEscape(d.Topic), bytes.NewReader(d.Payload))
		if err != nil {
			return err
		}
		req.Header = http.Header{
			"Content-Type":                   {"application/json"},
			"User-Agent":                     {"relay/1"},
			"Webhook-Id":                     {id},
			"Webhook-Timestamp":              {ts},
			"Webhook-Signature":              {"v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))},
			outboxwebhook.HeaderNamespace:    {d.Namespace},
			outboxwebhook.HeaderTopic:        {d.Topic},
			outboxwebhook.HeaderAttempt:      {strconv.Itoa(d.Attempt)},
			outboxwebhook.HeaderPartitionKey: {d.PartitionKey},
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	return outbox.TransportFunc(func(ctx context.Context, ds []outbox.Delivery) []error {
		errs := make([]error, len(ds))
		var wg sync.WaitGroup
		for i := range ds {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				for j := i; j < len(ds); j++ {
					errs[j] = ctx.Err()
				}
				wg.Wait()
				return errs
			}
			wg.Go(func() {
				defer func() { <-sem }()
				errs[i] = post(ctx, &ds[i])
			})
		}
		wg.Wait()
		return errs
	})
}
