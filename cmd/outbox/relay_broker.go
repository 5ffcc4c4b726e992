package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/cloudevents"
	"github.com/outboxgo/outbox/transport/amqp"
	"github.com/outboxgo/outbox/transport/kafka"
	"github.com/outboxgo/outbox/transport/nats"
	"github.com/outboxgo/outbox/transport/redis"
	"github.com/outboxgo/outbox/transport/webhook"
)

// brokerSpec is a parsed --broker with its options, checked before anything connects.
type brokerSpec struct {
	scheme string
	u      *url.URL
	shown  string // the URL without its password
	opts   map[string]string
	ce     *cloudevents.Options
	seeds  []string // kafka: every host:port the URL lists
}

// brokerOptions lists each scheme's options: the reference prints them.
var brokerOptions = map[string][]string{
	"nats":    {"subject", "ack_timeout", "expect_stream"},
	"kafka":   {"topic", "timeout", "allow_non_idempotent"},
	"amqp":    {"exchange", "routing_key", "transient", "permanent_unroutable", "dial_timeout", "confirm_timeout", "reconnect_min", "reconnect_max"},
	"redis":   {"stream", "max_len", "timeout"},
	"webhook": {"secret", "concurrency", "timeout", "max_retry_after", "user_agent"},
}

// commonBrokerOptions are accepted by every transport.
var commonBrokerOptions = []string{"cloudevents_source", "cloudevents_mode"}

// parseBroker checks the broker URL and its options without connecting. Options come from
// the URL's query (every scheme but webhooks, whose query belongs to the receiver) and
// from broker_options, which win.
func parseBroker(raw string, extra map[string]string) (*brokerSpec, error) {
	// kafka://h1:9092,h2:9092 lists several seed brokers, which url.Parse refuses as a host.
	var seeds []string
	if rest, ok := strings.CutPrefix(raw, "kafka://"); ok {
		end := strings.IndexAny(rest, "/?")
		if end < 0 {
			end = len(rest)
		}
		seeds = strings.Split(rest[:end], ",")
		raw = "kafka://" + seeds[0] + rest[end:]
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return nil, usagef("--broker %q is not a URL such as nats://127.0.0.1:4222", redactURL(raw))
	}
	b := &brokerSpec{u: u, shown: u.Redacted(), opts: map[string]string{}, seeds: seeds}
	switch u.Scheme {
	case "nats", "tls":
		b.scheme = "nats"
	case "kafka":
		b.scheme = "kafka"
	case "amqp", "amqps":
		b.scheme = "amqp"
	case "redis", "rediss":
		b.scheme = "redis"
	case "http", "https":
		b.scheme = "webhook"
	default:
		return nil, usagef("--broker %s: unknown scheme %q (use nats, kafka, amqp, amqps, redis, rediss, https or http)", b.shown, u.Scheme)
	}
	if b.scheme != "webhook" {
		q := u.Query()
		for k, vs := range q {
			b.opts[k] = vs[len(vs)-1]
		}
		u.RawQuery = ""
		b.shown = u.Redacted()
	}
	if len(seeds) > 1 {
		b.shown = "kafka://" + strings.Join(seeds, ",")
	}
	maps.Copy(b.opts, extra)
	known := append(slices.Clone(brokerOptions[b.scheme]), commonBrokerOptions...)
	for _, k := range slices.Sorted(maps.Keys(b.opts)) {
		if !slices.Contains(known, k) {
			return nil, usagef("broker option %q is not one of %s's: %s", k, b.scheme, strings.Join(known, ", "))
		}
	}
	if src := b.opts["cloudevents_source"]; src != "" {
		b.ce = &cloudevents.Options{Source: src}
		switch b.opts["cloudevents_mode"] {
		case "", "binary":
		case "structured":
			b.ce.Mode = cloudevents.Structured
		default:
			return nil, usagef("broker option cloudevents_mode %q: use binary or structured", b.opts["cloudevents_mode"])
		}
		if err := b.ce.Validate(); err != nil {
			return nil, usagef("broker option cloudevents_source: %v", err)
		}
	} else if b.opts["cloudevents_mode"] != "" {
		return nil, usagef("broker option cloudevents_mode needs cloudevents_source")
	}
	if b.scheme == "webhook" {
		if b.opts["secret"] == "" {
			return nil, usagef("a webhook broker needs its signing secret: broker option secret (whsec_..., best in OUTBOX_BROKER_OPTIONS=secret=... or the config file)")
		}
		// The webhook transport connects only when it publishes: building it checks the
		// secret and the URL template.
		tr, err := outboxwebhook.New(outboxwebhook.Options{URL: u.String(), Secret: b.opts["secret"], AllowHTTP: u.Scheme == "http"})
		if err != nil {
			return nil, usagef("webhook: %v", err)
		}
		_ = tr.Close()
	}
	// Parse every typed option now, so that a bad one is bad input.
	for _, k := range []string{"ack_timeout", "timeout", "dial_timeout", "confirm_timeout", "reconnect_min", "reconnect_max", "max_retry_after"} {
		if _, err := b.duration(k); err != nil {
			return nil, err
		}
	}
	for _, k := range []string{"allow_non_idempotent", "transient", "permanent_unroutable"} {
		if _, err := b.bool(k); err != nil {
			return nil, err
		}
	}
	for _, k := range []string{"max_len", "concurrency"} {
		if _, err := b.int(k); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func (b *brokerSpec) duration(k string) (time.Duration, error) {
	v := b.opts[k]
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, usagef("broker option %s %q is not a duration (such as 5s)", k, v)
	}
	return d, nil
}

func (b *brokerSpec) bool(k string) (bool, error) {
	v := b.opts[k]
	if v == "" {
		return false, nil
	}
	x, err := strconv.ParseBool(v)
	if err != nil {
		return false, usagef("broker option %s %q is not true or false", k, v)
	}
	return x, nil
}

func (b *brokerSpec) int(k string) (int, error) {
	v := b.opts[k]
	if v == "" {
		return 0, nil
	}
	x, err := strconv.Atoi(v)
	if err != nil || x < 0 {
		return 0, usagef("broker option %s %q is not a whole number", k, v)
	}
	return x, nil
}

// template returns a routing function from a template naming {namespace} and {topic}.
func template(t string) func(d outbox.Delivery) string {
	return func(d outbox.Delivery) string {
		return strings.NewReplacer("{namespace}", d.Namespace, "{topic}", d.Topic).Replace(t)
	}
}

// broker is a connected transport: what to publish through, how to tell it is reachable,
// and how to close it.
type broker struct {
	tr    outbox.Transport
	ping  func(ctx context.Context) error
	close func()
}

// connect builds the transport. Clients that connect lazily (Kafka, Redis, AMQP, webhooks)
// do not fail here when the broker is down; NATS's first connection is retried in the
// background.
func (b *brokerSpec) connect(log *slog.Logger) (*broker, error) {
	d := func(k string) time.Duration { v, _ := b.duration(k); return v }
	bo := func(k string) bool { v, _ := b.bool(k); return v }
	n := func(k string) int { v, _ := b.int(k); return v }
	switch b.scheme {
	case "nats":
		nc, err := nats.Connect(b.u.String(), nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.Name("outbox relay"),
			nats.ReconnectWait(500*time.Millisecond))
		if err != nil {
			return nil, fmt.Errorf("nats: %v", err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("nats: %v", err)
		}
		o := outboxnats.Options{AckTimeout: d("ack_timeout"), ExpectStream: b.opts["expect_stream"], CloudEvents: b.ce, Logger: log}
		if s := b.opts["subject"]; s != "" {
			o.Subject = template(s)
		}
		tr, err := outboxnats.New(js, o)
		if err != nil {
			nc.Close()
			return nil, usagef("nats options: %v", err)
		}
		return &broker{tr: tr, close: nc.Close, ping: func(ctx context.Context) error {
			if !nc.IsConnected() {
				return errors.New("not connected")
			}
			return nc.FlushWithContext(ctx)
		}}, nil
	case "kafka":
		client, err := outboxkafka.NewClient(b.seeds, kgo.WithLogger(nil))
		if err != nil {
			return nil, fmt.Errorf("kafka: %v", err)
		}
		o := outboxkafka.Options{Timeout: d("timeout"), AllowNonIdempotent: bo("allow_non_idempotent"), CloudEvents: b.ce, Logger: log}
		if s := b.opts["topic"]; s != "" {
			o.Topic = template(s)
		}
		tr, err := outboxkafka.New(client, o)
		if err != nil {
			client.Close()
			return nil, usagef("kafka options: %v", err)
		}
		return &broker{tr: tr, close: client.Close, ping: client.Ping}, nil
	case "amqp":
		o := outboxamqp.Options{URL: b.u.String(), Transient: bo("transient"), PermanentUnroutable: bo("permanent_unroutable"),
			DialTimeout: d("dial_timeout"), ConfirmTimeout: d("confirm_timeout"), ReconnectMin: d("reconnect_min"), ReconnectMax: d("reconnect_max"),
			CloudEvents: b.ce, Logger: log}
		if ex, rk := b.opts["exchange"], b.opts["routing_key"]; ex != "" || rk != "" {
			o.Route = func(dl *outbox.Delivery) (string, string, error) {
				e, r, err := outboxamqp.DefaultRoute(dl)
				if ex != "" {
					e = template(ex)(*dl)
				}
				if rk != "" {
					r = template(rk)(*dl)
				}
				return e, r, err
			}
		}
		tr, err := outboxamqp.New(o)
		if err != nil {
			return nil, usagef("amqp options: %v", err)
		}
		addr := b.u.Host
		if b.u.Port() == "" {
			addr = net.JoinHostPort(b.u.Hostname(), map[string]string{"amqp": "5672", "amqps": "5671"}[b.u.Scheme])
		}
		return &broker{tr: tr, close: func() { _ = tr.Close() }, ping: func(ctx context.Context) error { return amqpPing(ctx, addr, b.u.Scheme == "amqp") }}, nil
	case "redis":
		ro, err := redis.ParseURL(b.u.String())
		if err != nil {
			return nil, usagef("--broker %s: %v", b.shown, err)
		}
		client := redis.NewClient(ro)
		o := outboxredis.Options{MaxLen: int64(n("max_len")), Timeout: d("timeout"), CloudEvents: b.ce, Logger: log}
		if s := b.opts["stream"]; s != "" {
			o.Stream = template(s)
		}
		tr, err := outboxredis.New(client, o)
		if err != nil {
			_ = client.Close()
			return nil, usagef("redis options: %v", err)
		}
		return &broker{tr: tr, close: func() { _ = client.Close() }, ping: func(ctx context.Context) error { return client.Ping(ctx).Err() }}, nil
	case "webhook":
		o := outboxwebhook.Options{URL: b.u.String(), Secret: b.opts["secret"], Concurrency: n("concurrency"), Timeout: d("timeout"),
			MaxRetryAfter: d("max_retry_after"), UserAgent: b.opts["user_agent"], AllowHTTP: b.u.Scheme == "http", CloudEvents: b.ce, Logger: log}
		tr, err := outboxwebhook.New(o)
		if err != nil {
			return nil, usagef("webhook options: %v", err)
		}
		addr := b.u.Host
		if b.u.Port() == "" {
			addr = net.JoinHostPort(b.u.Hostname(), map[string]string{"http": "80", "https": "443"}[b.u.Scheme])
		}
		// A webhook has no ping: a TCP connection tells the receiver's host is there, and
		// the circuit breaker (also part of readiness) tells whether it answers.
		return &broker{tr: tr, close: func() { _ = tr.Close() }, ping: func(ctx context.Context) error {
			var dl net.Dialer
			c, err := dl.DialContext(ctx, "tcp", addr)
			if err == nil {
				_ = c.Close()
			}
			return err
		}}, nil
	}
	return nil, fmt.Errorf("unknown broker scheme %q", b.scheme)
}

// amqpPing opens a TCP connection, sends AMQP 0-9-1's protocol header and waits for the
// first byte of the server's answer (connection.start): a broker that accepts and then
// says nothing is as unreachable as one that refuses. On amqps it only connects.
func amqpPing(ctx context.Context, addr string, plain bool) error {
	var dl net.Dialer
	c, err := dl.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if !plain {
		return nil
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Write([]byte("AMQP\x00\x00\x09\x01")); err != nil {
		return err
	}
	var one [1]byte
	if _, err := io.ReadFull(c, one[:]); err != nil {
		return fmt.Errorf("no answer to the AMQP handshake: %v", err)
	}
	return nil
}
