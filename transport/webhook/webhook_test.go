package outboxwebhook_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	cesdk "github.com/cloudevents/sdk-go/v2"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/cloudevents"
	"github.com/outboxgo/outbox/outboxtest/cloudeventsjs"
	"github.com/outboxgo/outbox/outboxtest/testproxy"
	"github.com/outboxgo/outbox/outboxtest/transporttest"
	"github.com/outboxgo/outbox/transport/webhook"
)

// TestMain checks that no request, connection or server goroutine outlives the tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
	)
}

// The published Standard Webhooks test vector, as the reference libraries check it.
const (
	vectorSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	vectorID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	vectorTimestamp = 1614265330
	vectorBody      = `{"test": 2432232314}`
	vectorSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

func TestSignVector(t *testing.T) {
	t.Parallel()
	key, err := outboxwebhook.ParseSecret(vectorSecret)
	require.NoError(t, err)
	require.Equal(t, vectorSignature, outboxwebhook.Sign(key, vectorID, time.Unix(vectorTimestamp, 0), []byte(vectorBody)))
}

// verify checks a request the way a Standard Webhooks receiver does, written from the
// specification and independent of the package: the three headers present, the timestamp
// within five minutes, and one of the space-separated "v1," signatures equal, in constant
// time, to the HMAC-SHA256 of "id.timestamp.body" under the base64-decoded secret.
func verify(secret string, h http.Header, body []byte) error {
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return errors.New("missing webhook headers")
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("bad timestamp %q", ts)
	}
	if d := time.Since(time.Unix(sec, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return fmt.Errorf("timestamp %s too far from now", ts)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return err
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	want := mac.Sum(nil)
	for _, s := range strings.Split(sigs, " ") {
		version, b64, ok := strings.Cut(s, ",")
		if !ok || version != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(b64)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return errors.New("no valid signature")
}

func newSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return "whsec_" + base64.StdEncoding.EncodeToString(b)
}

// request is what the test server received.
type request struct {
	path   string
	header http.Header
	body   []byte
	err    error // the signature check
}

// server is a real HTTP server that records requests and answers with respond.
type server struct {
	*httptest.Server
	secret string
	mu     sync.Mutex
	got    []request
}

func newServer(t *testing.T, tls bool, respond func(w http.ResponseWriter, r *http.Request)) *server {
	t.Helper()
	s := &server{secret: newSecret()}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.got = append(s.got, request{path: r.URL.EscapedPath(), header: r.Header.Clone(), body: body, err: verify(s.secret, r.Header, body)})
		s.mu.Unlock()
		if respond != nil {
			respond(w, r)
		}
	})
	if tls {
		s.Server = httptest.NewTLSServer(h)
	} else {
		s.Server = httptest.NewServer(h)
	}
	t.Cleanup(s.Close)
	return s
}

func (s *server) requests() []request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]request(nil), s.got...)
}

func newTransport(t *testing.T, o outboxwebhook.Options) *outboxwebhook.Transport {
	t.Helper()
	tr, err := outboxwebhook.New(o)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, tr.Close()) })
	return tr
}

func delivery(namespace, topic, payload string) outbox.Delivery {
	return outbox.Delivery{ID: uuid.Must(uuid.NewV7()), Namespace: namespace, Topic: topic, Payload: []byte(payload), Attempt: 1}
}

// TestDelivery: over TLS, every message is one POST whose body is the payload byte for
// byte, signed so that an independent Standard Webhooks check accepts it, to the URL built
// from its namespace and topic, with its headers and metadata.
func TestDelivery(t *testing.T) {
	t.Parallel()
	srv := newServer(t, true, nil)
	tr := newTransport(t, outboxwebhook.Options{URL: srv.URL + "/hooks/{namespace}/{topic}", Secret: srv.secret, Client: srv.Client()})

	tenant := uuid.New()
	batch := []outbox.Delivery{
		delivery("shop", "order.created", `{"order":1,"note":"héllo ✓"}`),
		delivery("shop", "a b/c", `[1,  2]`),
		delivery("billing", "invoice.paid", `{"amount":"12.50"}`),
	}
	batch[0].Headers = outbox.Headers{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "Host": "evil.example", "webhook-id": "forged"}
	batch[0].PartitionKey = "order-1"
	batch[1].Headers = outbox.Headers{"content-type": "application/vnd.shop+json"}
	batch[2].TenantID = tenant
	batch[2].DedupeKey = tenant.String() + "/inv-1"
	batch[2].Attempt = 4

	errs := tr.Publish(context.Background(), batch)
	require.Len(t, errs, len(batch))
	for i, err := range errs {
		require.NoError(t, err, "message %d", i)
	}
	got := srv.requests()
	require.Len(t, got, len(batch))
	byID := map[string]request{}
	for _, r := range got {
		require.NoError(t, r.err)
		byID[r.header.Get("webhook-id")] = r
	}
	paths := []string{"/hooks/shop/order.created", "/hooks/shop/a%20b%2Fc", "/hooks/billing/invoice.paid"}
	for i, d := range batch {
		r, ok := byID[d.ID.String()]
		require.True(t, ok, "message %d not received", i)
		require.Equal(t, []byte(d.Payload), r.body)
		require.Equal(t, paths[i], r.path)
		require.Equal(t, d.Namespace, r.header.Get(outboxwebhook.HeaderNamespace))
		require.Equal(t, d.Topic, r.header.Get(outboxwebhook.HeaderTopic))
		require.Equal(t, strconv.Itoa(d.Attempt), r.header.Get(outboxwebhook.HeaderAttempt))
		require.Equal(t, outboxwebhook.DefaultUserAgent, r.header.Get("User-Agent"))
		require.Len(t, r.header.Values("webhook-id"), 1)
	}
	first, second, third := byID[batch[0].ID.String()], byID[batch[1].ID.String()], byID[batch[2].ID.String()]
	require.Equal(t, batch[0].Headers["traceparent"], first.header.Get("traceparent"))
	require.Equal(t, "order-1", first.header.Get(outboxwebhook.HeaderPartitionKey))
	require.Equal(t, outboxwebhook.DefaultContentType, first.header.Get("Content-Type"))
	require.Equal(t, "application/vnd.shop+json", second.header.Get("Content-Type"))
	require.Empty(t, second.header.Get(outboxwebhook.HeaderPartitionKey))
	require.Equal(t, tenant.String(), third.header.Get(outboxwebhook.HeaderTenantID))
	require.Equal(t, batch[2].DedupeKey, third.header.Get(outboxwebhook.HeaderDedupeKey))

	// A raw key signs the same way as its whsec_ form.
	key, err := outboxwebhook.ParseSecret(srv.secret)
	require.NoError(t, err)
	raw := newTransport(t, outboxwebhook.Options{URL: srv.URL + "/raw", Key: key, Client: srv.Client()})
	require.NoError(t, raw.Publish(context.Background(), []outbox.Delivery{delivery("a", "b", `{}`)})[0])
	last := srv.requests()[len(batch)]
	require.Equal(t, "/raw", last.path)
	require.NoError(t, last.err)
}

// TestStatusClassification: 2xx is delivered; 408, 429, 5xx and redirects (never
// followed) are retried; any other 4xx is permanent. One batch, one outcome per message.
func TestStatusClassification(t *testing.T) {
	t.Parallel()
	var redirected atomic.Int64
	srv := newServer(t, false, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/target" {
			redirected.Add(1)
			return
		}
		code, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/status/"))
		if code >= 300 && code < 400 {
			w.Header().Set("Location", "/target")
		}
		w.WriteHeader(code)
		_, _ = io.WriteString(w, "answer "+strconv.Itoa(code))
	})
	tr := newTransport(t, outboxwebhook.Options{
		URLFunc:   func(d *outbox.Delivery) (string, error) { return srv.URL + "/status/" + d.Topic, nil },
		Secret:    srv.secret,
		AllowHTTP: true,
	})
	type outcome int
	const (
		delivered outcome = iota
		retried
		permanent
	)
	cases := []struct {
		code int
		want outcome
	}{
		{200, delivered}, {201, delivered}, {202, delivered}, {204, delivered},
		{301, retried}, {302, retried}, {307, retried}, {308, retried},
		{400, permanent}, {401, permanent}, {403, permanent}, {404, permanent}, {405, permanent},
		{409, permanent}, {410, permanent}, {413, permanent}, {415, permanent}, {422, permanent},
		{408, retried}, {429, retried},
		{500, retried}, {501, retried}, {502, retried}, {503, retried}, {504, retried}, {505, retried},
	}
	batch := make([]outbox.Delivery, len(cases))
	for i, c := range cases {
		batch[i] = delivery("ns", strconv.Itoa(c.code), `{}`)
	}
	errs := tr.Publish(context.Background(), batch)
	require.Len(t, errs, len(cases))
	for i, c := range cases {
		err := errs[i]
		switch c.want {
		case delivered:
			require.NoError(t, err, "status %d", c.code)
			continue
		case retried:
			require.Error(t, err, "status %d", c.code)
			require.False(t, outbox.IsPermanent(err), "status %d: %v", c.code, err)
			down := c.code == 502 || c.code == 503 || c.code == 504
			require.Equal(t, down, outbox.IsUnavailable(err), "status %d: %v", c.code, err)
		case permanent:
			require.True(t, outbox.IsPermanent(err), "status %d: %v", c.code, err)
		}
		var se *outboxwebhook.StatusError
		require.ErrorAs(t, err, &se, "status %d", c.code)
		require.Equal(t, c.code, se.StatusCode)
		require.Equal(t, c.want == retried, se.Retryable())
		require.Contains(t, se.Body, "answer "+strconv.Itoa(c.code))
		_, hinted := outbox.RetryAfterDelay(err)
		require.False(t, hinted, "status %d has no Retry-After", c.code)
	}
	require.Zero(t, redirected.Load(), "a redirect was followed")
	require.Len(t, srv.requests(), len(cases))
}

// TestRetryAfter: a Retry-After in seconds or as an HTTP date becomes the delay of the
// next attempt, capped by MaxRetryAfter; a malformed one is ignored; a permanent status
// stays permanent whatever its Retry-After.
func TestRetryAfter(t *testing.T) {
	t.Parallel()
	srv := newServer(t, false, func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(r.URL.Query().Get("code"))
		w.Header().Set("Retry-After", r.URL.Query().Get("after"))
		w.WriteHeader(code)
	})
	now := time.Now()
	cases := []struct {
		code   int
		after  string
		want   time.Duration // -1: no hint
		within time.Duration
	}{
		{503, "7", 7 * time.Second, 0},
		{429, "0", 0, 0},
		{429, now.Add(90 * time.Second).UTC().Format(http.TimeFormat), 90 * time.Second, 3 * time.Second},
		{503, now.Add(-time.Hour).UTC().Format(http.TimeFormat), 0, 0},
		{500, "99999999", 2 * time.Minute, 0},
		{503, "soon", -1, 0},
		{503, "-5", -1, 0},
	}
	tr := newTransport(t, outboxwebhook.Options{
		URLFunc: func(d *outbox.Delivery) (string, error) {
			var c struct {
				Code  int
				After string
			}
			c.Code, _ = strconv.Atoi(d.Topic)
			c.After = string(d.Payload[1 : len(d.Payload)-1])
			return fmt.Sprintf("%s/?code=%d&after=%s", srv.URL, c.Code, strings.ReplaceAll(c.After, " ", "%20")), nil
		},
		Secret: srv.secret, AllowHTTP: true, MaxRetryAfter: 2 * time.Minute,
	})
	batch := make([]outbox.Delivery, len(cases))
	for i, c := range cases {
		batch[i] = delivery("ns", strconv.Itoa(c.code), `"`+c.after+`"`)
	}
	errs := tr.Publish(context.Background(), batch)
	for i, c := range cases {
		require.Error(t, errs[i])
		require.False(t, outbox.IsPermanent(errs[i]))
		require.Equal(t, c.code == 503, outbox.IsUnavailable(errs[i]), "case %d: %v", i, errs[i])
		d, ok := outbox.RetryAfterDelay(errs[i])
		if c.want < 0 {
			require.False(t, ok, "case %d (%q): %v", i, c.after, errs[i])
			continue
		}
		require.True(t, ok, "case %d (%q): %v", i, c.after, errs[i])
		require.InDelta(t, c.want, d, float64(c.within), "case %d (%q)", i, c.after)
	}

	// A 4xx other than 408 and 429 is permanent even with a Retry-After.
	perm := newTransport(t, outboxwebhook.Options{URL: srv.URL + "/?code=400&after=5", Secret: srv.secret, AllowHTTP: true})
	err := perm.Publish(context.Background(), []outbox.Delivery{delivery("a", "b", `{}`)})[0]
	require.True(t, outbox.IsPermanent(err))
}

// TestTimeout: a receiver slower than Timeout fails the request, retryably (its server still
// answers the HEAD request that checks it), and Publish returns soon after the timeout; so
// does a cancelled context.
func TestTimeout(t *testing.T) {
	t.Parallel()
	srv := newServer(t, false, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead {
			return
		}
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	})
	tr := newTransport(t, outboxwebhook.Options{URL: srv.URL, Secret: srv.secret, AllowHTTP: true, Timeout: 100 * time.Millisecond})
	start := time.Now()
	errs := tr.Publish(context.Background(), []outbox.Delivery{delivery("a", "b", `{}`), delivery("a", "b", `{}`)})
	require.Less(t, time.Since(start), 5*time.Second)
	for _, err := range errs {
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.False(t, outbox.IsPermanent(err))
		require.False(t, outbox.IsUnavailable(err), "a receiver that hangs on a message while its server answers is not an outage: %v", err)
	}

	slow := newTransport(t, outboxwebhook.Options{URL: srv.URL, Secret: srv.secret, AllowHTTP: true, Concurrency: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start = time.Now()
	errs = slow.Publish(ctx, []outbox.Delivery{delivery("a", "b", `{}`), delivery("a", "b", `{}`), delivery("a", "b", `{}`)})
	require.Less(t, time.Since(start), 5*time.Second)
	for _, err := range errs {
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
}

// TestNetworkError: a refused connection is an outage, not dead-lettered.
func TestNetworkError(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	tr := newTransport(t, outboxwebhook.Options{URL: "http://" + addr + "/", Secret: newSecret(), AllowHTTP: true})
	err = tr.Publish(context.Background(), []outbox.Delivery{delivery("a", "b", `{}`)})[0]
	require.Error(t, err)
	require.False(t, outbox.IsPermanent(err))
	require.True(t, outbox.IsUnavailable(err), "%v", err)
	var se *outboxwebhook.StatusError
	require.False(t, errors.As(err, &se))
}

// TestUnavailableWhileCut: with the receiver cut away by a proxy, every request of every
// batch fails as an outage (connections refused or dropped); once restored, a batch is
// delivered whole.
func TestUnavailableWhileCut(t *testing.T) {
	t.Parallel()
	srv := newServer(t, false, nil)
	proxy := testproxy.New(t, strings.TrimPrefix(srv.URL, "http://"))
	tr := newTransport(t, outboxwebhook.Options{URL: "http://" + proxy.Addr() + "/{topic}", Secret: srv.secret, AllowHTTP: true, Timeout: 2 * time.Second})
	fresh := func() []outbox.Delivery {
		return []outbox.Delivery{delivery("a", "x", `{"n":1}`), delivery("a", "y", `{"n":2}`), delivery("a", "z", `{"n":3}`)}
	}
	require.Empty(t, nonNil(tr.Publish(context.Background(), fresh())))
	delivered := transporttest.CutAndRestore(t, tr, fresh, proxy.Cut, proxy.Restore)
	got := map[string]bool{}
	for _, r := range srv.requests() {
		got[r.header.Get("webhook-id")] = true
	}
	for _, d := range delivered {
		require.True(t, got[d.ID.String()], "message %s not received after the cut", d.ID)
	}
}

// TestMixedOutcomes: in one batch, a message for an endpoint that is down is an outage, one
// answered 500 is retried, one answered 404 is dead-lettered, and the rest are delivered.
func TestMixedOutcomes(t *testing.T) {
	t.Parallel()
	srv := newServer(t, false, func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		w.WriteHeader(code)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	require.NoError(t, ln.Close())
	tr := newTransport(t, outboxwebhook.Options{
		URLFunc: func(d *outbox.Delivery) (string, error) {
			if d.Topic == "down" {
				return "http://" + dead + "/", nil
			}
			return srv.URL + "/" + d.Topic, nil
		},
		Secret: srv.secret, AllowHTTP: true,
	})
	batch := []outbox.Delivery{delivery("a", "200", `{}`), delivery("a", "down", `{}`), delivery("a", "500", `{}`), delivery("a", "404", `{}`), delivery("a", "204", `{}`)}
	errs := tr.Publish(context.Background(), batch)
	require.NoError(t, errs[0])
	require.True(t, outbox.IsUnavailable(errs[1]), "%v", errs[1])
	require.Error(t, errs[2])
	require.False(t, outbox.IsUnavailable(errs[2]) || outbox.IsPermanent(errs[2]), "%v", errs[2])
	require.True(t, outbox.IsPermanent(errs[3]), "%v", errs[3])
	require.NoError(t, errs[4])
}

func nonNil(errs []error) []error {
	var out []error
	for _, err := range errs {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// TestHTTPSRequired: plain http URLs are refused unless AllowHTTP: at New for a URL
// template, and as a permanent error, without a request, for a URL from URLFunc.
func TestHTTPSRequired(t *testing.T) {
	t.Parallel()
	srv := newServer(t, false, nil)
	_, err := outboxwebhook.New(outboxwebhook.Options{URL: srv.URL + "/{topic}", Secret: srv.secret})
	require.ErrorIs(t, err, outbox.ErrInvalid)
	require.ErrorContains(t, err, "https")

	tr := newTransport(t, outboxwebhook.Options{URLFunc: func(*outbox.Delivery) (string, error) { return srv.URL, nil }, Secret: srv.secret})
	err = tr.Publish(context.Background(), []outbox.Delivery{delivery("a", "b", `{}`)})[0]
	require.ErrorIs(t, err, outboxwebhook.ErrInsecureURL)
	require.True(t, outbox.IsPermanent(err))
	require.Empty(t, srv.requests())

	allowed := newTransport(t, outboxwebhook.Options{URL: srv.URL + "/{topic}", Secret: srv.secret, AllowHTTP: true})
	require.NoError(t, allowed.Publish(context.Background(), []outbox.Delivery{delivery("a", "b", `{}`)})[0])
	require.Len(t, srv.requests(), 1)
}

// TestBadMessages: a message whose header or URL cannot be sent fails alone, permanently,
// and the rest of the batch is delivered; an error from URLFunc is reported as returned.
func TestBadMessages(t *testing.T) {
	t.Parallel()
	srv := newServer(t, true, nil)
	noRoute := errors.New("no endpoint for this tenant")
	tr := newTransport(t, outboxwebhook.Options{
		URLFunc: func(d *outbox.Delivery) (string, error) {
			switch d.Topic {
			case "unrouted":
				return "", noRoute
			case "badurl":
				return "https://[::1/x", nil
			}
			return srv.URL + "/ok", nil
		},
		Secret: srv.secret, Client: srv.Client(),
	})
	batch := []outbox.Delivery{
		delivery("a", "ok", `{"n":0}`),
		delivery("a", "ok", `{"n":1}`),
		delivery("a", "unrouted", `{"n":2}`),
		delivery("a", "badurl", `{"n":3}`),
		delivery("a", "ok", `{"n":4}`),
		delivery("a", "ok", `{"n":5}`),
	}
	batch[1].Headers = outbox.Headers{"x-note": "two\r\nlines"}
	batch[4].Headers = outbox.Headers{"bad name": "v"}
	errs := tr.Publish(context.Background(), batch)
	require.NoError(t, errs[0])
	require.True(t, outbox.IsPermanent(errs[1]), "%v", errs[1])
	require.ErrorIs(t, errs[2], noRoute)
	require.False(t, outbox.IsPermanent(errs[2]))
	require.True(t, outbox.IsPermanent(errs[3]), "%v", errs[3])
	require.True(t, outbox.IsPermanent(errs[4]), "%v", errs[4])
	require.NoError(t, errs[5])
	require.Len(t, srv.requests(), 2)
}

// TestConcurrencyBound: the server never sees more requests in flight than Concurrency,
// across two overlapping Publish calls, and does see that many.
func TestConcurrencyBound(t *testing.T) {
	t.Parallel()
	const limit = 4
	var inflight, peak atomic.Int64
	srv := newServer(t, false, func(w http.ResponseWriter, r *http.Request) {
		n := inflight.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		// Hold each request until more than the limit are in flight, which only an
		// unbounded transport reaches, or 200 ms pass: the limit is then reached too.
		for deadline := time.Now().Add(200 * time.Millisecond); inflight.Load() <= limit && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		inflight.Add(-1)
	})
	tr := newTransport(t, outboxwebhook.Options{URL: srv.URL, Secret: srv.secret, AllowHTTP: true, Concurrency: limit})
	batch := func() []outbox.Delivery {
		b := make([]outbox.Delivery, 12)
		for i := range b {
			b[i] = delivery("a", "b", `{}`)
		}
		return b
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for _, err := range tr.Publish(context.Background(), batch()) {
				require.NoError(t, err)
			}
		})
	}
	wg.Wait()
	require.Len(t, srv.requests(), 24)
	require.EqualValues(t, limit, peak.Load())
}

// TestOptionsValidation: bad options are refused with an error matching ErrInvalid that
// never quotes the secret.
func TestOptionsValidation(t *testing.T) {
	t.Parallel()
	short := "whsec_" + base64.StdEncoding.EncodeToString([]byte("too-short-key"))
	for name, o := range map[string]outboxwebhook.Options{
		"no url":        {Secret: vectorSecret},
		"both urls":     {URL: "https://x/", URLFunc: func(*outbox.Delivery) (string, error) { return "", nil }, Secret: vectorSecret},
		"scheme":        {URL: "ftp://x/", Secret: vectorSecret},
		"no host":       {URL: "https:///path", Secret: vectorSecret},
		"no secret":     {URL: "https://x/"},
		"both secrets":  {URL: "https://x/", Secret: vectorSecret, Key: make([]byte, 32)},
		"prefix":        {URL: "https://x/", Secret: "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
		"base64":        {URL: "https://x/", Secret: "whsec_not*base64!"},
		"short secret":  {URL: "https://x/", Secret: short},
		"short key":     {URL: "https://x/", Key: make([]byte, 23)},
		"long key":      {URL: "https://x/", Key: make([]byte, 65)},
		"concurrency":   {URL: "https://x/", Secret: vectorSecret, Concurrency: -1},
		"timeout":       {URL: "https://x/", Secret: vectorSecret, Timeout: -time.Second},
		"maxRetryAfter": {URL: "https://x/", Secret: vectorSecret, MaxRetryAfter: -1},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := outboxwebhook.New(o)
			require.ErrorIs(t, err, outbox.ErrInvalid)
			var ve *outbox.ValidationError
			require.ErrorAs(t, err, &ve)
			require.NotContains(t, err.Error(), "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
		})
	}
}

// TestVerify: Verify accepts the published vector and a rotated signature list holding a
// valid one, and refuses a tampered body, another key, a stale or future timestamp and
// missing headers.
func TestVerify(t *testing.T) {
	t.Parallel()
	key, err := outboxwebhook.ParseSecret(vectorSecret)
	require.NoError(t, err)
	at := time.Unix(vectorTimestamp, 0)
	header := func(sig string) http.Header {
		h := http.Header{}
		h.Set("webhook-id", vectorID)
		h.Set("webhook-timestamp", strconv.Itoa(vectorTimestamp))
		h.Set("webhook-signature", sig)
		return h
	}
	require.NoError(t, outboxwebhook.Verify(key, header(vectorSignature), []byte(vectorBody), 0, at))
	require.NoError(t, outboxwebhook.Verify(key, header("v1,bm9wZQ== "+vectorSignature), []byte(vectorBody), 0, at.Add(4*time.Minute)))
	for name, check := range map[string]error{
		"tampered body": outboxwebhook.Verify(key, header(vectorSignature), []byte(`{"test": 2432232315}`), 0, at),
		"other key":     outboxwebhook.Verify(make([]byte, 32), header(vectorSignature), []byte(vectorBody), 0, at),
		"stale":         outboxwebhook.Verify(key, header(vectorSignature), []byte(vectorBody), 0, at.Add(6*time.Minute)),
		"future":        outboxwebhook.Verify(key, header(vectorSignature), []byte(vectorBody), time.Minute, at.Add(-2*time.Minute)),
		"missing":       outboxwebhook.Verify(key, http.Header{}, []byte(vectorBody), 0, at),
		"v1a only":      outboxwebhook.Verify(key, header("v1a,"+strings.TrimPrefix(vectorSignature, "v1,")), []byte(vectorBody), 0, at),
	} {
		require.ErrorIs(t, check, outboxwebhook.ErrSignature, name)
	}
}

// TestCloudEvents: a receiver decodes every request with the CloudEvents SDK's HTTP binding,
// in both modes, and finds a valid event with the message's id, source, type, time, content
// type, partition key, header extensions and the payload as data; the signature covers the
// body that was sent.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	for _, mode := range []cloudevents.Mode{cloudevents.Binary, cloudevents.Structured} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			t.Parallel()
			secret := newSecret()
			var mu sync.Mutex
			events := map[string]cesdk.Event{}
			raw := map[string]http.Header{}
			var requests []cloudeventsjs.Message
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				h := map[string]string{}
				for k, v := range r.Header {
					h[k] = v[0]
				}
				mu.Lock()
				requests = append(requests, cloudeventsjs.Message{Binding: cloudeventsjs.HTTP, Headers: h, Body: body})
				mu.Unlock()
				if err := verify(secret, r.Header, body); err != nil {
					w.WriteHeader(http.StatusUnauthorized)
					return
				}
				r.Body = io.NopCloser(bytes.NewReader(body))
				e, err := cehttp.NewEventFromHTTPRequest(r)
				if err != nil || e.Validate() != nil {
					w.WriteHeader(http.StatusBadRequest)
					_, _ = fmt.Fprint(w, err, e.Validate())
					return
				}
				mu.Lock()
				events[e.ID()], raw[e.ID()] = *e, r.Header.Clone()
				mu.Unlock()
			}))
			t.Cleanup(srv.Close)
			tr := newTransport(t, outboxwebhook.Options{URL: srv.URL + "/{topic}", Secret: secret, AllowHTTP: true,
				CloudEvents: &cloudevents.Options{Source: "https://shop.example/orders", Mode: mode}})
			created := time.Date(2025, 1, 2, 3, 4, 5, 600_000_000, time.UTC)
			batch := []outbox.Delivery{
				delivery("shop", "order.created", `{"order":1,"note":"héllo"}`),
				delivery("shop", "order.paid", `[1, 2]`),
			}
			contentType := "application/vnd.shop+json"
			batch[0].PartitionKey, batch[0].CreatedAt = "order-1", created
			batch[0].Headers = outbox.Headers{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x-request-id": "r-1"}
			batch[1].CreatedAt = created
			batch[1].Headers = outbox.Headers{"content-type": contentType, "Tenant": "acme"}
			for i, err := range tr.Publish(context.Background(), batch) {
				require.NoError(t, err, "message %d", i)
			}
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, events, 2)
			for _, d := range batch {
				e := events[d.ID.String()]
				require.Equal(t, "1.0", e.SpecVersion())
				require.Equal(t, "https://shop.example/orders", e.Source())
				require.Equal(t, d.Topic, e.Type())
				require.True(t, created.Equal(e.Time()), "%s", e.Time())
				require.JSONEq(t, string(d.Payload), string(e.Data()))
				if mode == cloudevents.Binary {
					require.Equal(t, string(d.Payload), string(e.Data()))
				}
			}
			first, second := events[batch[0].ID.String()], events[batch[1].ID.String()]
			require.Equal(t, "order-1", first.Extensions()["partitionkey"])
			require.Equal(t, batch[0].Headers["traceparent"], first.Extensions()["traceparent"])
			require.Equal(t, "application/json", first.DataContentType())
			require.Equal(t, "r-1", raw[batch[0].ID.String()].Get("x-request-id"), "a header that is no attribute name is sent as it is")
			require.Equal(t, contentType, second.DataContentType())
			require.Equal(t, string(batch[1].Payload), string(second.Data()), "a +json payload arrives byte for byte")
			require.Equal(t, "acme", second.Extensions()["tenant"])
			require.NotContains(t, second.Extensions(), "partitionkey")

			// A JavaScript receiver decodes every request with the JavaScript SDK.
			js := map[string]cloudeventsjs.Event{}
			for _, e := range cloudeventsjs.Decode(t, requests) {
				require.Empty(t, e.Error)
				js[e.Attributes["id"]] = e
			}
			require.Len(t, js, len(batch))
			cloudeventsjs.RequireDelivery(t, batch[0], js[batch[0].ID.String()], "https://shop.example/orders", batch[0].Topic, "application/json")
			cloudeventsjs.RequireDelivery(t, batch[1], js[batch[1].ID.String()], "https://shop.example/orders", batch[1].Topic, contentType)
			require.Equal(t, "acme", js[batch[1].ID.String()].Attributes["tenant"])
		})
	}
}

// TestCloudEventsHeaders: binary attribute values are percent-encoded as the HTTP binding
// requires; a message header that would replace an attribute is refused for good; the
// option needs a source.
func TestCloudEventsHeaders(t *testing.T) {
	t.Parallel()
	srv := newServer(t, false, nil)
	_, err := outboxwebhook.New(outboxwebhook.Options{URL: srv.URL, Secret: srv.secret, AllowHTTP: true, CloudEvents: &cloudevents.Options{}})
	require.ErrorIs(t, err, outbox.ErrInvalid)

	tr := newTransport(t, outboxwebhook.Options{URL: srv.URL, Secret: srv.secret, AllowHTTP: true, CloudEvents: &cloudevents.Options{Source: "/shop"}})
	batch := []outbox.Delivery{delivery("a", "b", `{}`), delivery("a", "b", `{}`), delivery("a", "b", `{}`)}
	batch[0].Headers = outbox.Headers{"subject": `order 1 "ü" 100%`}
	batch[1].Headers = outbox.Headers{"Ce-Id": "forged"}
	batch[2].Headers = outbox.Headers{"content-type": "a/b", "Content-Type": "c/d"}
	errs := tr.Publish(context.Background(), batch)
	require.NoError(t, errs[0])
	require.True(t, outbox.IsPermanent(errs[1]), "%v", errs[1])
	require.True(t, outbox.IsPermanent(errs[2]), "%v", errs[2])
	got := srv.requests()
	require.Len(t, got, 1)
	require.Equal(t, "order%201%20%22%C3%BC%22%20100%25", got[0].header.Get("ce-subject"))
	require.NoError(t, got[0].err)
}
