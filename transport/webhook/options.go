package outboxwebhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/cloudevents"
)

// Defaults of [Options].
const (
	DefaultConcurrency = 8
	// DefaultTimeout is within the 15 to 30 s that Standard Webhooks recommends.
	DefaultTimeout       = 15 * time.Second
	DefaultMaxRetryAfter = time.Hour
	DefaultUserAgent     = "outbox-webhook/1"
	// DefaultContentType is the Content-Type of a message without a "content-type" header:
	// outbox payloads are JSON.
	DefaultContentType = "application/json"
)

// Key length bounds of the Standard Webhooks symmetric scheme.
const (
	MinKeyBytes = 24
	MaxKeyBytes = 64
)

// SecretPrefix starts a secret serialized the Standard Webhooks way: "whsec_" followed by
// the standard base64 of the key.
const SecretPrefix = "whsec_"

// Options configure a [Transport]. Zero fields take the documented defaults; [New] refuses
// inconsistent settings with an error matching [outbox.ErrInvalid].
type Options struct {
	// URL is the endpoint of every message, in which "{namespace}" and "{topic}" are
	// replaced by the message's namespace and topic, path-escaped:
	// "https://hooks.example.com/{namespace}/{topic}". Exactly one of URL and URLFunc is
	// required.
	URL string

	// URLFunc returns a message's endpoint. An error fails that message as it is (wrap it
	// with [outbox.Permanent] to dead-letter it).
	URLFunc func(d *outbox.Delivery) (string, error)

	// Secret is the signing secret as Standard Webhooks serializes it: "whsec_" and the
	// base64 of a key of [MinKeyBytes] to [MaxKeyBytes] bytes. Exactly one of Secret and
	// Key is required.
	Secret string

	// Key is the signing key as raw bytes, [MinKeyBytes] to [MaxKeyBytes] of them.
	Key []byte

	// Concurrency bounds the requests in flight, across every Publish call of the
	// transport. Default [DefaultConcurrency].
	Concurrency int

	// Timeout bounds each request, from connecting to reading the response. Default
	// [DefaultTimeout].
	Timeout time.Duration

	// MaxRetryAfter caps the delay a Retry-After header may impose. Default
	// [DefaultMaxRetryAfter].
	MaxRetryAfter time.Duration

	// AllowHTTP lets plain http:// URLs through. Default false: only https:// URLs are
	// called, and a message for another URL is dead-lettered.
	AllowHTTP bool

	// Client sends the requests. The transport uses a copy whose redirects are never
	// followed. Give its transport at least Concurrency idle connections per host
	// (http.Transport.MaxIdleConnsPerHost, 2 by default), or most requests pay a new
	// connection and TLS handshake. Default: a client of its own with Concurrency idle
	// connections per host.
	Client *http.Client

	// UserAgent is sent with every request. Default [DefaultUserAgent].
	UserAgent string

	// CloudEvents, when set, sends every message as a CloudEvent under the HTTP protocol
	// binding: in the binary mode, the attributes as ce-* headers (ce-id, ce-source,
	// ce-specversion, ce-type, ce-time, ce-partitionkey, one per extension; values
	// percent-encoded as the binding requires) and datacontenttype as Content-Type, the
	// payload as the body; in the structured mode, the event as JSON in the body with
	// Content-Type application/cloudevents+json. The signature covers the body that is
	// sent. Default nil: no CloudEvents.
	CloudEvents *cloudevents.Options

	// Logger receives one line when the endpoint stops answering (a batch without a
	// response, and no answer to a HEAD request) and one when it answers again. Default
	// [slog.Default].
	Logger *slog.Logger
}

func invalid(field, format string, args ...any) error {
	return &outbox.ValidationError{Index: -1, Field: field, Reason: fmt.Sprintf(format, args...)}
}

// validate applies the defaults and checks the settings; it returns the signing key.
func (o *Options) validate() ([]byte, error) {
	if (o.URL == "") == (o.URLFunc == nil) {
		return nil, invalid("URL", "exactly one of URL and URLFunc is required")
	}
	if o.URL != "" {
		if _, err := checkURL(expand(o.URL, "namespace", "topic"), o.AllowHTTP); err != nil {
			return nil, invalid("URL", "%v", err)
		}
	}
	var key []byte
	switch {
	case (o.Secret == "") == (len(o.Key) == 0):
		return nil, invalid("Secret", "exactly one of Secret and Key is required")
	case o.Secret != "":
		k, err := ParseSecret(o.Secret)
		if err != nil {
			return nil, invalid("Secret", "%v", err)
		}
		key = k
	default:
		if n := len(o.Key); n < MinKeyBytes || n > MaxKeyBytes {
			return nil, invalid("Key", "must be %d to %d bytes, got %d", MinKeyBytes, MaxKeyBytes, n)
		}
		key = append([]byte(nil), o.Key...)
	}
	switch {
	case o.Concurrency == 0:
		o.Concurrency = DefaultConcurrency
	case o.Concurrency < 0:
		return nil, invalid("Concurrency", "must be at least 1, got %d", o.Concurrency)
	}
	switch {
	case o.Timeout == 0:
		o.Timeout = DefaultTimeout
	case o.Timeout < 0:
		return nil, invalid("Timeout", "must be positive, got %s", o.Timeout)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	switch {
	case o.MaxRetryAfter == 0:
		o.MaxRetryAfter = DefaultMaxRetryAfter
	case o.MaxRetryAfter < 0:
		return nil, invalid("MaxRetryAfter", "must be positive, got %s", o.MaxRetryAfter)
	}
	if o.UserAgent == "" {
		o.UserAgent = DefaultUserAgent
	}
	if err := o.CloudEvents.Validate(); err != nil {
		return nil, err
	}
	return key, nil
}

// ParseSecret decodes a Standard Webhooks secret, "whsec_" followed by the standard base64
// of a key of [MinKeyBytes] to [MaxKeyBytes] bytes. The error never quotes the secret.
func ParseSecret(secret string) ([]byte, error) {
	b64, ok := strings.CutPrefix(secret, SecretPrefix)
	if !ok {
		return nil, errors.New(`secret must start with "whsec_" (pass raw key bytes as Key)`)
	}
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, errors.New(`secret is not "whsec_" followed by standard base64`)
	}
	if n := len(key); n < MinKeyBytes || n > MaxKeyBytes {
		return nil, fmt.Errorf("secret key must be %d to %d bytes, got %d", MinKeyBytes, MaxKeyBytes, n)
	}
	return key, nil
}

// Sign returns the webhook-signature value of a message: "v1," and the standard base64 of
// the HMAC-SHA256, under key, of "<id>.<timestamp>.<body>", timestamp in Unix seconds.
func Sign(key []byte, id string, timestamp time.Time, body []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write(strconv.AppendInt(nil, timestamp.Unix(), 10))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// ErrInsecureURL marks a plain http:// URL refused because [Options.AllowHTTP] is false.
var ErrInsecureURL = errors.New("webhook: URL is not https")

// checkURL parses an endpoint and refuses what the transport will not call.
func checkURL(raw string, allowHTTP bool) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("webhook: bad URL: %w", err)
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && allowHTTP:
	case u.Scheme == "http":
		return nil, fmt.Errorf("%w: %s (set AllowHTTP to call it)", ErrInsecureURL, u.Redacted())
	default:
		return nil, fmt.Errorf("webhook: URL %s: scheme must be https", u.Redacted())
	}
	if u.Host == "" {
		return nil, fmt.Errorf("webhook: URL %s has no host", u.Redacted())
	}
	return u, nil
}

// expand fills the URL template.
func expand(tmpl, namespace, topic string) string {
	return strings.NewReplacer("{namespace}", url.PathEscape(namespace), "{topic}", url.PathEscape(topic)).Replace(tmpl)
}
