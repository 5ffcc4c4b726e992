// Package outboxredis is an [outbox.Transport] for Redis Streams, built on go-redis.
//
// A batch is sent as one pipeline of XADD commands, one per message, and each command's
// own reply is returned, so that [Transport.Publish] reports one outcome per message.
// Redis streams keep no message ids of their own choosing: a redelivery after a lost reply
// is appended again, so consumers deduplicate on the "id" field.
//
// # Mapping
//
// The stream is "<namespace>:<topic>" unless [Options.Stream] says otherwise: an event
// enqueued with namespace "shop" and topic "order.created" is appended to the stream
// "shop:order.created". Each entry has these fields, in this order:
//
//	id             the delivery id (stable across redeliveries)
//	namespace      the namespace
//	topic          the topic
//	partition_key  the partition key, when set
//	tenant_id      the tenant id, when set
//	dedupe_key     the dedupe key, when set
//	attempt        the attempt number, 1 for the first
//	headers        the message's headers as a JSON object, when it has any
//	payload        the payload, byte for byte
//
// With [Options.MaxLen] set, every XADD trims its stream to about that many entries
// (MAXLEN ~), so that a stream nobody trims does not grow without bound.
//
// # Errors
//
// An entry Redis can never append fails with [outbox.Permanent] and is dead-lettered at
// once: the stream's key holds another type (WRONGTYPE), or the server refused the command
// itself (an ERR reply, such as an argument above proto-max-bulk-len). An outage fails with
// [outbox.Unavailable], which costs the message no attempt: a refused, reset or closed
// connection, a dial or I/O timeout, and the replies of a server that cannot take writes
// now (LOADING, BUSY, TRYAGAIN, CLUSTERDOWN, MASTERDOWN, READONLY, NOREPLICAS, "max number
// of clients"), and a batch without a single reply from a server that does not answer a
// PING within [Options.Timeout] either. Everything else is retried under the publisher's retry policy: out of
// memory, persistence errors, redirections, authentication or permission errors, which an
// operator fixes, and replies this transport does not know.
//
// # CloudEvents
//
// With [Options.CloudEvents], every entry also carries a CloudEvent's attributes as ce_*
// fields. CloudEvents has no Redis binding; the names follow its Kafka binding, and only
// the binary mode exists.
package outboxredis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/cloudevents"
)

// Field names of every stream entry.
const (
	FieldID           = "id"
	FieldNamespace    = "namespace"
	FieldTopic        = "topic"
	FieldPartitionKey = "partition_key"
	FieldTenantID     = "tenant_id"
	FieldDedupeKey    = "dedupe_key"
	FieldAttempt      = "attempt"
	FieldHeaders      = "headers"
	FieldPayload      = "payload"
)

// ErrInvalid marks an entry the transport refuses to send (an empty stream name) and
// options [New] refuses. Such an entry fails with [outbox.Permanent].
var ErrInvalid = errors.New("outbox/redis: invalid")

// Options configure a [Transport]. The zero value is valid.
type Options struct {
	// Stream maps a delivery to the stream it is appended to. Default [DefaultStream]:
	// "<namespace>:<topic>".
	Stream func(d outbox.Delivery) string

	// MaxLen, when above zero, trims each stream to about this many entries on every XADD
	// (MAXLEN ~ MaxLen): Redis removes whole macro nodes only, so a stream may hold
	// somewhat more. Default 0: no trimming.
	MaxLen int64

	// CloudEvents, when set, adds a CloudEvent's attributes to every entry as fields named
	// "ce_" and the attribute's name (ce_id, ce_source, ce_specversion, ce_type, ce_time,
	// ce_datacontenttype, ce_partitionkey, one per extension), after the attempt field; the
	// payload field is the event's data, and the headers field keeps only the headers that
	// are not attribute names. CloudEvents defines no binding for Redis: the names follow
	// its Kafka binding. Only the binary mode is accepted. Default nil: no CloudEvents.
	CloudEvents *cloudevents.Options

	// Timeout bounds one Publish, the pipeline of a batch and, when no command of it got a
	// reply, the PING that checks the server. A batch that outlives it fails; when the
	// server does not answer the PING either, the batch fails [outbox.Unavailable]. The
	// client's dial, read and write timeouts and retries still bound each try within it.
	// Default [DefaultTimeout].
	Timeout time.Duration

	// Logger receives one line when the server stops answering and one when it answers
	// again. Default [slog.Default].
	Logger *slog.Logger
}

// DefaultTimeout is [Options.Timeout] when it is zero.
const DefaultTimeout = 5 * time.Second

// CloudEventsPrefix starts the field names of a CloudEvent's attributes.
const CloudEventsPrefix = "ce_"

// DefaultStream returns "<namespace>:<topic>".
func DefaultStream(d outbox.Delivery) string { return d.Namespace + ":" + d.Topic }

// Transport appends deliveries to Redis streams. It is safe for concurrent use, and
// implements [outbox.Transport].
type Transport struct {
	client redis.UniversalClient
	opts   Options
	link   link
}

var (
	_ outbox.Transport         = (*Transport)(nil)
	_ outbox.TransportKeyOrder = (*Transport)(nil)
)

// New returns a transport appending with client (a *redis.Client, *redis.ClusterClient or
// any other [redis.UniversalClient]), which the caller configured and closes after the
// publisher stopped. [Options.Timeout] bounds a batch.
func New(client redis.UniversalClient, opts Options) (*Transport, error) {
	if client == nil {
		return nil, fmt.Errorf("%w options: client is nil", ErrInvalid)
	}
	if opts.Stream == nil {
		opts.Stream = DefaultStream
	}
	switch {
	case opts.Timeout == 0:
		opts.Timeout = DefaultTimeout
	case opts.Timeout < 0:
		return nil, fmt.Errorf("%w options: Timeout must be positive, got %s", ErrInvalid, opts.Timeout)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxLen < 0 {
		return nil, fmt.Errorf("%w options: MaxLen must not be negative, got %d", ErrInvalid, opts.MaxLen)
	}
	if err := opts.CloudEvents.Validate(); err != nil {
		return nil, fmt.Errorf("%w options: %w", ErrInvalid, err)
	}
	if opts.CloudEvents != nil && opts.CloudEvents.Mode != cloudevents.Binary {
		return nil, fmt.Errorf("%w options: CloudEvents.Mode: Redis has no CloudEvents binding that defines a structured mode", ErrInvalid)
	}
	return &Transport{client: client, opts: opts, link: link{log: opts.Logger}}, nil
}

// System returns "redis", the messaging.system of OpenTelemetry's conventions, for telemetry
// ([outbox.TransportSystem]).
func (t *Transport) System() string { return "redis" }

// Destination reports the stream d is appended to and, for a client of one server (a
// *redis.Client), its address, for telemetry ([outbox.TransportDestination]).
func (t *Transport) Destination(d outbox.Delivery) outbox.Destination {
	dst := outbox.Destination{Name: t.opts.Stream(d)}
	if c, ok := t.client.(interface{ Options() *redis.Options }); ok {
		if o := c.Options(); o.Network == "unix" {
			dst.ServerAddress = o.Addr
		} else {
			dst.ServerAddress, dst.ServerPort = serverOf(o.Addr)
		}
	}
	return dst
}

// Publish appends every message of batch with one pipeline and returns each XADD's outcome.
// Messages that share a namespace and a partition key go one after another, each in a
// pipeline of its own once the one ahead of it was appended, so that no stream gets one
// whose predecessor failed; different keys, and messages without a key, still share each
// pipeline ([Transport.KeepsKeyOrder]).
func (t *Transport) Publish(ctx context.Context, batch []outbox.Delivery) []error {
	return outbox.PublishInKeyOrder(ctx, batch, nil, t.publish)
}

// KeepsKeyOrder reports true: Publish keeps the order of a partition key's messages inside
// a batch ([outbox.TransportKeyOrder]).
func (t *Transport) KeepsKeyOrder() bool { return true }

// publish appends batch with one pipeline.
func (t *Transport) publish(ctx context.Context, batch []outbox.Delivery) []error {
	errs := make([]error, len(batch))
	cmds := make([]*redis.StringCmd, len(batch))
	streams := make([]string, len(batch))
	pipe := t.client.Pipeline()
	for i := range batch {
		args, err := t.args(batch[i])
		if err != nil {
			errs[i] = outbox.Permanent(err)
			continue
		}
		streams[i] = args.Stream
		cmds[i] = pipe.XAdd(ctx, args)
	}
	if pipe.Len() == 0 {
		return errs
	}
	// Exec's error is the first command's; every command carries its own.
	if err := t.within(ctx, func(ctx context.Context) error { _, _ = pipe.Exec(ctx); return nil }); err != nil {
		for i, cmd := range cmds {
			if cmd != nil {
				errs[i] = Classify(fmt.Errorf("outbox/redis: xadd %s to %q: %w", batch[i].ID, streams[i], err))
			}
		}
		t.check(ctx, errs)
		return errs
	}
	answered := false // a reply from the server, success or refusal
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		var re redis.Error
		err := cmd.Err()
		answered = answered || err == nil || errors.As(err, &re)
		if err != nil {
			errs[i] = Classify(fmt.Errorf("outbox/redis: xadd %s to %q: %w", batch[i].ID, streams[i], err))
		}
	}
	if answered {
		t.link.note(true, nil)
		return errs
	}
	t.check(ctx, errs)
	return errs
}

// errTimeout is the outcome of a pipeline or PING that outlived [Options.Timeout].
var errTimeout = errors.New("no reply within the transport's Timeout")

// within runs fn with ctx bounded by [Options.Timeout] and returns its error, or returns at
// that deadline even
// when the client is still blocked on a read (its ReadTimeout, not the context, bounds
// reads unless ContextTimeoutEnabled is set); fn then ends in the background, when the
// client's own timeouts end it.
func (t *Transport) within(ctx context.Context, fn func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, t.opts.Timeout)
	defer cancel()
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		err = fn(ctx)
	}()
	select {
	case <-done:
		return err
	case <-ctx.Done():
		if errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
			return errTimeout
		}
		return ctx.Err()
	}
}

// check takes a batch in which no command got a reply: when the server does not answer a
// PING within Timeout either, it is down and no message is at fault, so every failure
// becomes [outbox.Unavailable].
func (t *Transport) check(ctx context.Context, errs []error) {
	if ctx.Err() != nil {
		return
	}
	t.link.note(false, errs) // failures already known to be an outage (refused, reset)
	ping := t.within(ctx, func(ctx context.Context) error { return t.client.Ping(ctx).Err() })
	if errors.Is(ping, redis.ErrClosed) || ctx.Err() != nil {
		return // the client was closed under the publisher, or the publish cancelled
	}
	if ping == nil {
		t.link.note(true, nil)
		return
	}
	for i, err := range errs {
		if err != nil && !outbox.IsUnavailable(err) {
			errs[i] = outbox.Unavailable(fmt.Errorf("%w; PING: %w", err, ping))
		}
	}
	t.link.note(false, errs)
}

// args builds the XADD of d.
func (t *Transport) args(d outbox.Delivery) (*redis.XAddArgs, error) {
	stream := t.opts.Stream(d)
	if stream == "" {
		return nil, fmt.Errorf("%w stream name for message %s: empty", ErrInvalid, d.ID)
	}
	v := make([]any, 0, 18)
	v = append(v, FieldID, d.ID.String(), FieldNamespace, d.Namespace, FieldTopic, d.Topic)
	if d.PartitionKey != "" {
		v = append(v, FieldPartitionKey, d.PartitionKey)
	}
	if d.TenantID != [16]byte{} {
		v = append(v, FieldTenantID, d.TenantID.String())
	}
	if d.DedupeKey != "" {
		v = append(v, FieldDedupeKey, d.DedupeKey)
	}
	v = append(v, FieldAttempt, strconv.Itoa(d.Attempt))
	headers := d.Headers
	if t.opts.CloudEvents != nil {
		e, err := cloudevents.Of(t.opts.CloudEvents, d)
		if err != nil {
			return nil, fmt.Errorf("%w %w", ErrInvalid, err)
		}
		for _, a := range e.Attributes {
			v = append(v, CloudEventsPrefix+a.Name, a.Value)
		}
		v = append(v, CloudEventsPrefix+"datacontenttype", e.DataContentType)
		headers = e.Other
	}
	if len(headers) > 0 {
		h, err := json.Marshal(map[string]string(headers))
		if err != nil {
			return nil, fmt.Errorf("%w headers of message %s: %w", ErrInvalid, d.ID, err)
		}
		v = append(v, FieldHeaders, string(h))
	}
	v = append(v, FieldPayload, string(d.Payload))
	return &redis.XAddArgs{Stream: stream, MaxLen: t.opts.MaxLen, Approx: t.opts.MaxLen > 0, Values: v}, nil
}

// unavailable are the prefixes of Redis error replies that say the server cannot take any
// write now: it is loading, busy with a script, failing over, or without its cluster or
// replicas, or has no room for another client.
var unavailable = []string{
	"LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "NOREPLICAS",
	"ERR max number of clients",
}

// retried are the prefixes of Redis error replies that pass without the message changing,
// and are not outages: the operator frees memory, fixes persistence or permissions.
var retried = []string{"OOM", "MISCONF", "MOVED", "ASK", "NOAUTH", "NOPERM", "WRONGPASS"}

// Classify reports how the transport treats an XADD error: wrapped with
// [outbox.Permanent] when retrying cannot help, with [outbox.Unavailable] when the server
// cannot be reached or cannot take writes now, returned as it is otherwise. Publish applies
// it to every failure; it is exported for transports that wrap this one.
func Classify(err error) error {
	if err == nil || outbox.IsPermanent(err) || outbox.IsUnavailable(err) {
		return err
	}
	if errors.Is(err, ErrInvalid) {
		return outbox.Permanent(err)
	}
	var re redis.Error
	if !errors.As(err, &re) {
		if outbox.IsUnreachable(err) {
			return outbox.Unavailable(err) // refused, reset or closed connections, dial and I/O timeouts
		}
		return err // a closed client, a pool timeout, a cancelled context
	}
	msg := re.Error()
	for _, p := range unavailable {
		if strings.HasPrefix(msg, p) {
			return outbox.Unavailable(err)
		}
	}
	for _, p := range retried {
		if strings.HasPrefix(msg, p) {
			return err
		}
	}
	if strings.HasPrefix(msg, "WRONGTYPE") || strings.HasPrefix(msg, "ERR") {
		return outbox.Permanent(err)
	}
	return err // an error reply this transport does not know: let the attempt limit decide
}

// serverOf returns the host and port of "host:port", with Redis's port when it has none.
func serverOf(addr string) (string, int) {
	if h, p, err := net.SplitHostPort(addr); err == nil {
		if port, err := strconv.Atoi(p); err == nil {
			return h, port
		}
		return h, 6379
	}
	return addr, 6379
}

// link logs what the transport sees of the server: one line when it stops answering, one
// when it answers again.
type link struct {
	log  *slog.Logger
	down atomic.Bool
}

// note takes a batch's outcome: a reply means the server is there; an Unavailable failure
// without one, that it is not.
func (l *link) note(answered bool, errs []error) {
	if answered {
		if l.down.CompareAndSwap(true, false) {
			l.log.Info("outbox/redis: the server answers again")
		}
		return
	}
	for _, err := range errs {
		if outbox.IsUnavailable(err) {
			if l.down.CompareAndSwap(false, true) {
				l.log.Warn("outbox/redis: the server cannot be reached; batches fail Unavailable until it answers", "err", err)
			}
			return
		}
	}
}
