package outboxwebhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/cloudevents"
)

// Transport posts outbox messages to webhook endpoints. It is safe for concurrent use.
// Build one with [New]; [Transport.Close] releases its idle connections.
type Transport struct {
	opts   Options
	key    []byte
	client *http.Client
	own    bool          // client is the transport's own
	sem    chan struct{} // one token per request in flight
	link   link
}

var (
	_ outbox.Transport         = (*Transport)(nil)
	_ outbox.TransportKeyOrder = (*Transport)(nil)
)

// New returns a Transport with opts, checked and completed with their defaults.
func New(opts Options) (*Transport, error) {
	key, err := opts.validate()
	if err != nil {
		return nil, err
	}
	t := &Transport{opts: opts, key: key, sem: make(chan struct{}, opts.Concurrency), link: link{log: opts.Logger}}
	if opts.Client != nil {
		c := *opts.Client
		t.client = &c
	} else {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = opts.Concurrency
		t.client, t.own = &http.Client{Transport: tr}, true
	}
	t.client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return t, nil
}

// Close closes the idle connections of the transport's own client. The transport still
// works after Close, opening new connections.
func (t *Transport) Close() error {
	if t.own {
		t.client.CloseIdleConnections()
	}
	return nil
}

// System returns "webhook", the messaging.system of OpenTelemetry's conventions, for telemetry
// ([outbox.TransportSystem]).
func (t *Transport) System() string { return "webhook" }

// Publish posts every message of the batch, at most [Options.Concurrency] at a time, and
// reports one outcome per message. See the package documentation for the outcomes.
// Messages that share a namespace and a partition key are posted one after another, each
// once the one ahead of it got a 2xx, so that the endpoint never receives one whose
// predecessor failed; different keys, and messages without a key, still go concurrently
// ([Transport.KeepsKeyOrder]).
func (t *Transport) Publish(ctx context.Context, batch []outbox.Delivery) []error {
	return outbox.PublishInKeyOrder(ctx, batch, nil, t.publish)
}

// KeepsKeyOrder reports true: Publish keeps the order of a partition key's messages inside
// a batch ([outbox.TransportKeyOrder]).
func (t *Transport) KeepsKeyOrder() bool { return true }

// publish posts batch concurrently.
func (t *Transport) publish(ctx context.Context, batch []outbox.Delivery) []error {
	if len(batch) == 0 {
		return nil
	}
	errs := make([]error, len(batch))
	var (
		wg       sync.WaitGroup
		answered atomic.Bool // a request got a response
		down     atomic.Bool // a request got none, and neither did a HEAD request after it
		checked  sync.Once
	)
	for i := range batch {
		if down.Load() && !answered.Load() {
			// A batch of requests that each wait out Timeout would outlast the publisher's
			// PublishTimeout, and the cancelled ones would spend attempts: what is not sent
			// yet fails at once, as an outage.
			errs[i] = outbox.Unavailable(fmt.Errorf("outbox/webhook: not sent: the endpoint answered neither a request nor a HEAD request within %s", t.opts.Timeout))
			continue
		}
		select {
		case t.sem <- struct{}{}:
		case <-ctx.Done():
			for j := i; j < len(batch); j++ {
				errs[j] = ctx.Err()
			}
			wg.Wait()
			return errs
		}
		wg.Go(func() {
			defer func() { <-t.sem }()
			err := t.post(ctx, &batch[i])
			errs[i] = err
			var se *StatusError
			switch {
			case err == nil || errors.As(err, &se):
				answered.Store(true)
			case !outbox.IsPermanent(err) && !errors.Is(err, context.Canceled) && ctx.Err() == nil:
				checked.Do(func() {
					if !answered.Load() && !t.answers(ctx, &batch[i]) {
						down.Store(true)
					}
				})
			}
		})
	}
	wg.Wait()
	if down.Load() && !answered.Load() {
		for i, e := range errs {
			var se *StatusError
			if e != nil && !outbox.IsPermanent(e) && !outbox.IsUnavailable(e) && !errors.As(e, &se) && !errors.Is(e, context.Canceled) {
				errs[i] = outbox.Unavailable(fmt.Errorf("%w; the endpoint did not answer a HEAD request within %s either", e, t.opts.Timeout))
			}
		}
	}
	t.link.note(answered.Load(), errs)
	return errs
}

// answers reports whether the endpoint of d answers a HEAD request within Timeout (any
// status is an answer). It is asked once a request got no response: an endpoint that
// answers neither is down and no message is at fault, so every failure without a response
// becomes [outbox.Unavailable].
func (t *Transport) answers(ctx context.Context, d *outbox.Delivery) bool {
	raw, err := t.url(d)
	if err != nil {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, t.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, raw, nil)
	if err != nil {
		return true
	}
	req.Header.Set("User-Agent", t.opts.UserAgent)
	resp, err := t.client.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return true
}

// StatusError is a response whose status is not 2xx.
type StatusError struct {
	// StatusCode is the response's status.
	StatusCode int
	// Body is the start of the response body, at most 256 bytes, for the logs.
	Body string
	// RetryAfter is the delay the Retry-After header asked for, 0 when none.
	RetryAfter time.Duration
}

func (e *StatusError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "webhook: status %d %s", e.StatusCode, http.StatusText(e.StatusCode))
	if e.Body != "" {
		fmt.Fprintf(&b, ": %q", e.Body)
	}
	return b.String()
}

// Retryable reports whether the status is worth another attempt: 408, 429, and anything
// that is not 4xx.
func (e *StatusError) Retryable() bool {
	c := e.StatusCode
	return c == http.StatusRequestTimeout || c == http.StatusTooManyRequests || c < 400 || c >= 500
}

// Unavailable reports whether the status says the endpoint is down rather than the message
// refused: 502 Bad Gateway, 503 Service Unavailable and 504 Gateway Timeout.
func (e *StatusError) Unavailable() bool {
	c := e.StatusCode
	return c == http.StatusBadGateway || c == http.StatusServiceUnavailable || c == http.StatusGatewayTimeout
}

// Header keys the transport sets besides the Standard Webhooks ones.
const (
	HeaderNamespace    = "Outbox-Namespace"
	HeaderTopic        = "Outbox-Topic"
	HeaderAttempt      = "Outbox-Attempt"
	HeaderPartitionKey = "Outbox-Partition-Key"
	HeaderTenantID     = "Outbox-Tenant-Id"
	HeaderDedupeKey    = "Outbox-Dedupe-Key"
)

// notForwarded are the message headers never sent: HTTP's framing and hop-by-hop headers,
// and those the transport sets itself.
var notForwarded = map[string]bool{
	"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Connection": true,
	"Keep-Alive": true, "Upgrade": true, "Te": true, "Trailer": true,
	"Proxy-Authorization": true, "Proxy-Connection": true, "Content-Type": true,
	"Webhook-Id": true, "Webhook-Timestamp": true, "Webhook-Signature": true,
}

// Destination reports the host and port of d's endpoint, for telemetry
// ([outbox.TransportDestination]): the host is the destination's name as well, since the
// URL's path and query may hold a secret and are not reported. A message whose URL cannot
// be built has no destination.
func (t *Transport) Destination(d outbox.Delivery) outbox.Destination {
	raw, err := t.url(&d)
	if err != nil {
		return outbox.Destination{}
	}
	host, port := hostPort(raw)
	return outbox.Destination{Name: host, ServerAddress: host, ServerPort: port}
}

// url returns d's endpoint, from URLFunc or the URL template.
func (t *Transport) url(d *outbox.Delivery) (string, error) {
	if t.opts.URLFunc != nil {
		return t.opts.URLFunc(d)
	}
	return expand(t.opts.URL, d.Namespace, d.Topic), nil
}

// post sends one message and classifies the outcome.
func (t *Transport) post(ctx context.Context, d *outbox.Delivery) error {
	raw, err := t.url(d)
	if err != nil {
		return err
	}
	u, err := checkURL(raw, t.opts.AllowHTTP)
	if err != nil {
		return outbox.Permanent(err)
	}
	h, body, err := t.header(d)
	if err != nil {
		return outbox.Permanent(err)
	}

	ctx, cancel := context.WithTimeout(ctx, t.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return outbox.Permanent(fmt.Errorf("webhook: request: %w", err))
	}
	req.Header = h
	resp, err := t.client.Do(req)
	if err != nil {
		err = fmt.Errorf("webhook: POST %s: %w", u.Redacted(), err)
		if outbox.IsUnreachable(err) || strings.Contains(err.Error(), "server closed idle connection") {
			// No connection, or it went away before the answer. net/http reports a kept-alive
			// connection that the server closed before the request went out with an
			// unexported error of that text; the request never reached the receiver.
			return outbox.Unavailable(err)
		}
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
		return nil
	}
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	se := &StatusError{StatusCode: resp.StatusCode, Body: strings.ToValidUTF8(string(snippet), "?")}
	ra, hasRA := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	if hasRA {
		se.RetryAfter = min(ra, t.opts.MaxRetryAfter)
	}
	var out error = se
	switch {
	case !se.Retryable():
		return outbox.Permanent(se)
	case hasRA:
		out = outbox.RetryAfter(se, se.RetryAfter)
	}
	if se.Unavailable() {
		out = outbox.Unavailable(out)
	}
	return out
}

// header builds the request's header and body for d, refusing message headers that HTTP
// cannot carry.
func (t *Transport) header(d *outbox.Delivery) (http.Header, []byte, error) {
	h := make(http.Header, len(d.Headers)+16)
	contentType := DefaultContentType
	own, body := d.Headers, []byte(d.Payload)
	if ce := t.opts.CloudEvents; ce != nil {
		e, err := cloudevents.Of(ce, *d)
		if err != nil {
			return nil, nil, err
		}
		own, contentType = e.Other, e.DataContentType
		if ce.Mode == cloudevents.Structured {
			if body, err = e.JSON(d.Payload); err != nil {
				return nil, nil, fmt.Errorf("webhook: CloudEvent of message %s: %w", d.ID, err)
			}
			contentType = cloudevents.ContentType
		} else {
			for _, a := range e.Attributes {
				h[http.CanonicalHeaderKey(CloudEventsPrefix+a.Name)] = []string{cloudevents.PercentEncode(a.Value)}
			}
		}
	}
	for k, v := range own {
		if !validName(k) {
			return nil, nil, fmt.Errorf("webhook: header name %q cannot be sent over HTTP", k)
		}
		if !validValue(v) {
			return nil, nil, fmt.Errorf("webhook: header %q: value cannot be sent over HTTP", k)
		}
		ck := http.CanonicalHeaderKey(k)
		if t.opts.CloudEvents != nil && (ck == "Content-Type" || strings.HasPrefix(ck, "Ce-")) {
			return nil, nil, fmt.Errorf("webhook: header %q would replace a CloudEvents attribute", k)
		}
		if ck == "Content-Type" {
			contentType = v
		}
		if notForwarded[ck] || strings.HasPrefix(ck, "Outbox-") {
			continue
		}
		h[ck] = append(h[ck], v)
	}
	set := func(k, v string) error {
		if !validValue(v) {
			return fmt.Errorf("webhook: %s cannot be sent over HTTP", k)
		}
		h[k] = []string{v}
		return nil
	}
	id := d.ID.String()
	now := time.Now()
	h["Webhook-Id"] = []string{id}
	h["Webhook-Timestamp"] = []string{strconv.FormatInt(now.Unix(), 10)}
	h["Webhook-Signature"] = []string{Sign(t.key, id, now, body)}
	h["User-Agent"] = []string{t.opts.UserAgent}
	h[HeaderAttempt] = []string{strconv.Itoa(d.Attempt)}
	errs := []error{set("Content-Type", contentType), set(HeaderNamespace, d.Namespace), set(HeaderTopic, d.Topic)}
	if d.PartitionKey != "" {
		errs = append(errs, set(HeaderPartitionKey, d.PartitionKey))
	}
	if d.TenantID != [16]byte{} {
		h[HeaderTenantID] = []string{d.TenantID.String()}
	}
	if d.DedupeKey != "" {
		errs = append(errs, set(HeaderDedupeKey, d.DedupeKey))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}
	return h, body, nil
}

// CloudEventsPrefix starts the header names of a CloudEvent's attributes in the binary
// mode, as the HTTP protocol binding of CloudEvents names them; datacontenttype is the
// Content-Type.
const CloudEventsPrefix = "ce-"

// validName reports whether s is an HTTP token (RFC 9110 field-name).
func validName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// validValue reports whether s can be an HTTP field value: no control characters but tab.
func validValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// parseRetryAfter reads a Retry-After value: delay seconds or an HTTP date. A date in the
// past gives 0.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		return time.Duration(min(secs, int64(1<<62)/int64(time.Second))) * time.Second, true
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(at.Sub(now), 0), true
	}
	return 0, false
}

// hostPort returns the host and port of an http or https URL, the scheme's port when it
// names none, or "", 0 for a URL it cannot parse.
func hostPort(raw string) (string, int) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", 0
	}
	if port, err := strconv.Atoi(u.Port()); err == nil {
		return u.Hostname(), port
	}
	if u.Scheme == "http" {
		return u.Hostname(), 80
	}
	return u.Hostname(), 443
}

// link logs what the transport sees of the endpoint: one line when it stops answering, one
// when it answers again.
type link struct {
	log  *slog.Logger
	down atomic.Bool
}

// note takes a batch's outcome: a response means the endpoint is there; an Unavailable
// failure without one, that it is not.
func (l *link) note(answered bool, errs []error) {
	if answered {
		if l.down.CompareAndSwap(true, false) {
			l.log.Info("outbox/webhook: the endpoint answers again")
		}
		return
	}
	for _, err := range errs {
		if outbox.IsUnavailable(err) {
			if l.down.CompareAndSwap(false, true) {
				l.log.Warn("outbox/webhook: the endpoint cannot be reached; batches fail Unavailable until it answers", "err", err)
			}
			return
		}
	}
}
