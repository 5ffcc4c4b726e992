// Package outboxnats is an [outbox.Transport] for NATS JetStream.
//
// Each batch is published asynchronously and every acknowledgement is awaited, so that
// [Transport.Publish] reports one outcome per message. The delivery's id is sent as the
// Nats-Msg-Id header: a stream drops a message whose id it has seen within its duplicate
// window (two minutes by default), so a redelivery after a lost acknowledgement is not
// stored twice.
//
// # Key order
//
// A partition key's messages in a batch keep their order ([Transport.Publish]). On a stream
// whose configuration allows atomic batch publish (AllowAtomicPublish, NATS Server 2.12 and
// later), a key's run goes as one atomic batch (headers Nats-Batch-Id, Nats-Batch-Sequence,
// and Nats-Batch-Commit on the last), one acknowledgement for the run, in consecutive batches
// of at most the server's max_batch_size ([DefaultMaxAtomicBatch] until the server says its
// limit is lower). The transport learns whether a stream allows it from the stream's info,
// once per subject. Elsewhere a key's messages go one acknowledgement after another. Inside an
// atomic batch the server refuses a message id it has seen within the duplicate window
// rather than acknowledging it as a duplicate, so such a run goes again one message at a
// time, where the seen ones are acknowledged and not stored twice.
//
// # Mapping
//
// The subject is "<namespace>.<topic>" unless [Options.Subject] says otherwise: an event
// enqueued with namespace "shop" and topic "order.created" goes to subject
// "shop.order.created", which a stream with subjects ["shop.>"] captures. The payload is the
// message data, byte for byte. Headers:
//
//	Nats-Msg-Id           the delivery id (stable across redeliveries)
//	Outbox-Namespace      the namespace
//	Outbox-Topic          the topic
//	Outbox-Partition-Key  the partition key, when set
//	Outbox-Tenant-Id      the tenant id, when set
//	Outbox-Dedupe-Key     the dedupe key, when set
//	Outbox-Attempt        the attempt number, 1 for the first
//
// followed by the message's own headers, which may not use these names. A message header
// such as Nats-TTL or Nats-Expected-Stream is passed on and takes effect.
//
// # Errors
//
// A message that can never be stored fails with [outbox.Permanent] and is dead-lettered at
// once: larger than the server's max_payload or the stream's max_msg_size, a subject or
// header the protocol cannot carry. An outage fails with [outbox.Unavailable], which costs
// the message no attempt: the connection is closed, disconnected or reconnecting, its
// reconnect buffer is full, a network error, an acknowledgement that did not come within
// [Options.AckTimeout] while the connection is down, a batch without a single
// acknowledgement from a server that does not answer a ping within AckTimeout either (a
// stalled server; the connection is then made anew), JetStream not enabled, and "no
// responders" on the subject ([ErrNoStream]: no stream captures it, or its server is
// away). The last is an outage rather than a dead letter because a missing stream is
// fixed by creating it, often by a deployment that runs after the service starts; until
// then the events wait in the outbox. Everything else is retried under the publisher's
// retry policy: an acknowledgement that did not come while the server answers (a slow
// stream), a full stream.
//
// # CloudEvents
//
// With [Options.CloudEvents], every message is a CloudEvent under the NATS protocol binding
// (binary mode by default: every attribute, datacontenttype included, as a ce-* header whose
// value is percent-encoded as the binding requires, the content type without optional
// spaces so that it needs no encoding; structured mode: the event as JSON in
// the payload, with Content-Type application/cloudevents+json). The message's own headers
// that are not attribute names are sent as before, and a message header named Content-Type
// or starting with "ce-" is refused for good, so that it cannot replace an attribute.
package outboxnats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/cloudevents"
)

// Header names set on every message besides the message's own headers.
const (
	HeaderNamespace    = "Outbox-Namespace"
	HeaderTopic        = "Outbox-Topic"
	HeaderPartitionKey = "Outbox-Partition-Key"
	HeaderTenantID     = "Outbox-Tenant-Id"
	HeaderDedupeKey    = "Outbox-Dedupe-Key"
	HeaderAttempt      = "Outbox-Attempt"
)

// CloudEventsPrefix starts the header names of a CloudEvent's attributes in the binary mode,
// datacontenttype included (ce-datacontenttype), as the NATS protocol binding of CloudEvents
// names them; HeaderContentType carries the structured mode's content type.
const (
	CloudEventsPrefix = "ce-"
	HeaderContentType = "Content-Type"
)

// DefaultAckTimeout is the wait for a batch's acknowledgements when [Options.AckTimeout] is
// zero.
const DefaultAckTimeout = 5 * time.Second

// ErrNoStream means that no stream captures the subject a message was published to (the
// server answered "no responders"). Create a stream whose subjects include it. The message's
// error is marked [outbox.Unavailable]: it waits in the outbox, spending no attempt, until
// the stream exists.
var ErrNoStream = errors.New("outbox/nats: no stream captures the subject")

// ErrInvalid marks a message the transport cannot put on the wire (an empty or malformed
// subject, a header name or value NATS cannot carry). Such a message fails with
// [outbox.Permanent]; [Options] errors from [New] match it too.
var ErrInvalid = errors.New("outbox/nats: invalid")

// Options configure a [Transport]. The zero value is valid.
type Options struct {
	// Subject maps a delivery to the subject it is published to. Default
	// [DefaultSubject]: "<namespace>.<topic>".
	Subject func(d outbox.Delivery) string

	// AckTimeout bounds the wait for the acknowledgements of one batch, counted from the
	// last message sent; a batch that repeats a partition key goes in rounds
	// ([Transport.Publish]), each bounded so. Messages unacknowledged then fail and are retried; the stream's
	// duplicate window drops those that were stored after all. When not one message of the
	// batch was answered, the transport pings the server, waiting AckTimeout again: a
	// server that does not answer is down, so the batch fails [outbox.Unavailable] and the
	// connection is made anew. Default [DefaultAckTimeout].
	AckTimeout time.Duration

	// ExpectStream, when set, makes the server refuse a message that would be stored in
	// any other stream (Nats-Expected-Stream). Such a refusal is permanent.
	ExpectStream string

	// CloudEvents, when set, sends every message as a CloudEvent under the NATS protocol
	// binding: in the binary mode, the attributes as ce-* headers (ce-id, ce-source,
	// ce-specversion, ce-type, ce-time, ce-datacontenttype, ce-partitionkey, one per
	// extension), their values percent-encoded, the payload as the data; in the structured mode, the
	// event as JSON in the payload with Content-Type application/cloudevents+json. The
	// Outbox-* headers and Nats-Msg-Id are sent as before. Default nil: no CloudEvents.
	CloudEvents *cloudevents.Options

	// Logger receives one line when the server stops answering (a batch got no
	// acknowledgement and the server no ping) and one when it answers again. Default
	// [slog.Default].
	Logger *slog.Logger
}

// DefaultSubject returns "<namespace>.<topic>".
func DefaultSubject(d outbox.Delivery) string { return d.Namespace + "." + d.Topic }

func (o *Options) validate() error {
	if o.Subject == nil {
		o.Subject = DefaultSubject
	}
	switch {
	case o.AckTimeout == 0:
		o.AckTimeout = DefaultAckTimeout
	case o.AckTimeout < 0:
		return fmt.Errorf("%w options: AckTimeout must be positive, got %s", ErrInvalid, o.AckTimeout)
	}
	if o.ExpectStream != "" && strings.ContainsAny(o.ExpectStream, " \t\r\n.*>") {
		return fmt.Errorf("%w options: ExpectStream %q is not a stream name", ErrInvalid, o.ExpectStream)
	}
	if err := o.CloudEvents.Validate(); err != nil {
		return fmt.Errorf("%w options: %w", ErrInvalid, err)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

// Transport publishes deliveries to NATS JetStream. It is safe for concurrent use, and
// implements [outbox.Transport].
type Transport struct {
	js      jetstream.JetStream
	opts    Options
	link    link
	streams streams
}

var (
	_ outbox.Transport         = (*Transport)(nil)
	_ outbox.TransportKeyOrder = (*Transport)(nil)
)

// New returns a transport publishing with js. The caller owns js's connection and closes it
// after the publisher stopped. Connect with reconnection enabled (the nats.go default), so
// that the connection comes back after the server does. js's limit on pending asynchronous
// publishes (jetstream.WithPublishAsyncMaxPending, 4000 by default) should exceed the
// publisher's BatchSize × Concurrency, or messages beyond it fail with
// jetstream.ErrTooManyStalledMsgs and are retried. jetstream.WithPublishAsyncTimeout lets js
// forget acknowledgements that never come; without it, one that outlived AckTimeout is kept
// until the connection reconnects.
func New(js jetstream.JetStream, opts Options) (*Transport, error) {
	if js == nil {
		return nil, fmt.Errorf("%w options: JetStream is nil", ErrInvalid)
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	return &Transport{js: js, opts: opts, link: link{log: opts.Logger}}, nil
}

// System returns "nats", the messaging.system of OpenTelemetry's conventions, for telemetry
// ([outbox.TransportSystem]).
func (t *Transport) System() string { return "nats" }

// Destination reports the subject d is published to and the server the connection is on
// now, for telemetry ([outbox.TransportDestination]).
func (t *Transport) Destination(d outbox.Delivery) outbox.Destination {
	dst := outbox.Destination{Name: t.opts.Subject(d)}
	if nc := t.js.Conn(); nc != nil {
		dst.ServerAddress, dst.ServerPort = serverOf(nc.ConnectedUrl())
	}
	return dst
}

// Publish sends every message of batch without waiting, then waits for each
// acknowledgement, and returns one outcome per message. Messages that share a namespace
// and a partition key go as one atomic batch when the stream that captures them allows
// atomic publish (NATS Server 2.12 and later): the stream stores them in order or none of
// them, and a refusal fails them all, the first with the cause; a refusal that blames one
// message, or a duplicate message id, sends them again one by one, so that each meets its
// own fate. Elsewhere they go one after another, each once the one ahead of it was
// acknowledged, so that a stream never stores one whose predecessor it refused. Different
// keys, and messages without a key, still go together ([Transport.KeepsKeyOrder]).
func (t *Transport) Publish(ctx context.Context, batch []outbox.Delivery) []error {
	if !repeatsKey(batch) {
		return outbox.PublishInKeyOrder(ctx, batch, nil, t.publish)
	}
	o := t.ordered(ctx)
	return outbox.PublishInKeyOrder(ctx, batch, o.wait, o.publish)
}

// repeatsKey reports whether two messages of batch share a namespace and a partition key.
func repeatsKey(batch []outbox.Delivery) bool {
	seen := make(map[partKey]bool, len(batch))
	for i := range batch {
		if batch[i].PartitionKey == "" {
			continue
		}
		k := partKey{batch[i].Namespace, batch[i].PartitionKey}
		if seen[k] {
			return true
		}
		seen[k] = true
	}
	return false
}

// KeepsKeyOrder reports true: Publish keeps the order of a partition key's messages inside
// a batch ([outbox.TransportKeyOrder]).
func (t *Transport) KeepsKeyOrder() bool { return true }

// publish sends batch pipelined and waits for every acknowledgement.
func (t *Transport) publish(ctx context.Context, batch []outbox.Delivery) []error {
	return t.send(ctx, batch, nil)
}

// send sends batch pipelined and waits for every acknowledgement: the messages of each of
// groups (positions in batch, in order) as one atomic batch, the others one each.
func (t *Transport) send(ctx context.Context, batch []outbox.Delivery, groups [][]int) []error {
	errs := make([]error, len(batch))
	// futures[i] is the acknowledgement of the message at i, or of the commit of the batch
	// whose last message is at i; group[i] that batch.
	futures := make([]jetstream.PubAckFuture, len(batch))
	group := make([][]int, len(batch))
	sentAt := make([]bool, len(batch)) // the message at i went to the server
	var redo [][]int                   // batches to publish anew: nothing of them was stored
	var smaller []bool
	inGroup := make([]bool, len(batch))
	for _, g := range groups {
		for _, i := range g {
			inGroup[i] = true
		}
	}
	var sent bool
	for _, g := range groups {
		if err := ctx.Err(); err != nil {
			for _, i := range g {
				errs[i] = err
			}
			continue
		}
		f, again, err := t.sendGroup(batch, g)
		switch {
		case again:
			redo, smaller = append(redo, g), append(smaller, false)
		case err != nil:
			failGroup(errs, batch, g, err)
		default:
			last := g[len(g)-1]
			futures[last], group[last], sent = f, g, true
			for _, i := range g {
				sentAt[i] = true
			}
		}
	}
	for i := range batch {
		if inGroup[i] {
			continue
		}
		if err := ctx.Err(); err != nil {
			errs[i] = err
			continue
		}
		m, err := t.message(batch[i])
		if err != nil {
			errs[i] = outbox.Permanent(err)
			continue
		}
		f, err := t.js.PublishMsgAsync(m)
		if err != nil {
			errs[i] = t.classify(batch[i], m.Subject, err)
			continue
		}
		futures[i], sentAt[i], sent = f, true, true
	}
	if !sent {
		t.link.note(false, errs)
		t.again(ctx, batch, redo, smaller, errs)
		return errs
	}
	timer := time.NewTimer(t.opts.AckTimeout)
	defer timer.Stop()
	var late error    // set once the deadline passed or ctx was cancelled
	answered := false // an acknowledgement or a refusal came from the server
	// refused takes the server's answer err to the message or batch whose future is at i.
	refused := func(i int, f jetstream.PubAckFuture, err error) {
		errs[i] = t.classify(batch[i], f.Msg().Subject, err)
		answered = answered || !outbox.IsUnavailable(errs[i])
		g := group[i]
		if g == nil {
			return
		}
		stream, _ := t.atomicStream(ctx, f.Msg().Subject)
		if again, small := t.groupRefused(err, stream, len(g)); again {
			errs[i] = nil
			redo, smaller = append(redo, g), append(smaller, small)
			return
		}
		failGroup(errs, batch, g, t.classify(batch[g[0]], f.Msg().Subject, fmt.Errorf("atomic batch refused at its commit (message %s): %w", batch[i].ID, err)))
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		if late == nil {
			select {
			case <-f.Ok():
				answered = true
				continue
			case err := <-f.Err():
				refused(i, f, err)
				continue
			case <-timer.C:
				late = fmt.Errorf("outbox/nats: no acknowledgement within %s", t.opts.AckTimeout)
			case <-ctx.Done():
				late = ctx.Err()
			}
		}
		// Past the deadline: take what has resolved, fail the rest.
		select {
		case <-f.Ok():
			answered = true
		case err := <-f.Err():
			refused(i, f, err)
		default:
			if g := group[i]; g != nil {
				failGroup(errs, batch, g, t.late(late, batch[g[0]]))
			} else {
				errs[i] = t.late(late, batch[i])
			}
		}
	}
	if late != nil && !answered && ctx.Err() == nil {
		// Not one answer: a server that does not answer a ping either is down, however
		// open its connection looks, and no message is at fault.
		if down := t.check(); down != nil {
			for i := range batch {
				if sentAt[i] && errs[i] != nil && !outbox.IsUnavailable(errs[i]) {
					errs[i] = outbox.Unavailable(fmt.Errorf("%w: %w", errs[i], down))
				}
			}
		}
	}
	t.link.note(answered, errs)
	t.again(ctx, batch, redo, smaller, errs)
	return errs
}

// check asks the server for a round trip within AckTimeout, and reports why it cannot be
// reached when it does not answer; a connection whose server stays silent is made anew.
func (t *Transport) check() error {
	nc := t.js.Conn()
	if nc == nil {
		return nil
	}
	if !nc.IsConnected() {
		return nats.ErrDisconnected
	}
	if err := nc.FlushTimeout(t.opts.AckTimeout); err != nil {
		if nc.IsConnected() {
			_ = nc.ForceReconnect()
		}
		return fmt.Errorf("outbox/nats: the server did not answer a ping within %s: %w", t.opts.AckTimeout, err)
	}
	return nil
}

// late is the outcome of a message whose acknowledgement did not come: an outage when the
// connection is down (the client holds the message in its reconnect buffer), a failure of
// this attempt otherwise (a slow server, or a cancelled publish).
func (t *Transport) late(cause error, d outbox.Delivery) error {
	err := fmt.Errorf("%w (message %s)", cause, d.ID)
	if errors.Is(cause, context.Canceled) {
		return err
	}
	if nc := t.js.Conn(); nc != nil && !nc.IsConnected() {
		return outbox.Unavailable(fmt.Errorf("%w: %w", err, nats.ErrDisconnected))
	}
	return err
}

// message builds the NATS message of d.
func (t *Transport) message(d outbox.Delivery) (*nats.Msg, error) {
	subject := t.opts.Subject(d)
	if !validSubject(subject) {
		return nil, fmt.Errorf("%w subject %q for message %s", ErrInvalid, subject, d.ID)
	}
	own, data := d.Headers, []byte(d.Payload)
	h := make(nats.Header, len(d.Headers)+16)
	if ce := t.opts.CloudEvents; ce != nil {
		e, err := cloudevents.Of(ce, d)
		if err != nil {
			return nil, fmt.Errorf("%w %w", ErrInvalid, err)
		}
		own = e.Other
		if ce.Mode == cloudevents.Structured {
			if data, err = e.JSON(d.Payload); err != nil {
				return nil, fmt.Errorf("%w CloudEvent of message %s: %w", ErrInvalid, d.ID, err)
			}
			h[HeaderContentType] = []string{cloudevents.ContentType}
		} else {
			// The binding's values are percent-encoded, so that no attribute can break
			// the header block (line breaks, spaces, non-ASCII are all encoded).
			for _, a := range e.Attributes {
				h[CloudEventsPrefix+a.Name] = []string{cloudevents.PercentEncode(a.Value)}
			}
			// Compacted first: "text/plain;charset=utf-8" needs no encoding, so consumers
			// whose binding does not decode header values read it as it was meant.
			h[CloudEventsPrefix+"datacontenttype"] = []string{cloudevents.PercentEncode(cloudevents.CompactMediaType(e.DataContentType))}
		}
	}
	for k, v := range own {
		if reserved(k) || t.opts.CloudEvents != nil && (strings.EqualFold(k, HeaderContentType) ||
			len(k) >= len(CloudEventsPrefix) && strings.EqualFold(k[:len(CloudEventsPrefix)], CloudEventsPrefix)) {
			return nil, fmt.Errorf("%w header %q on message %s: the name is reserved for the transport", ErrInvalid, k, d.ID)
		}
		if !validHeaderName(k) || strings.ContainsAny(v, "\r\n") {
			return nil, fmt.Errorf("%w header %q on message %s: NATS header names are printable ASCII without ':' or spaces, values have no line breaks", ErrInvalid, k, d.ID)
		}
		h[k] = []string{v}
	}
	h[jetstream.MsgIDHeader] = []string{d.ID.String()}
	h[HeaderNamespace] = []string{d.Namespace}
	h[HeaderTopic] = []string{d.Topic}
	h[HeaderAttempt] = []string{strconv.Itoa(d.Attempt)}
	if d.PartitionKey != "" {
		h[HeaderPartitionKey] = []string{d.PartitionKey}
	}
	if d.TenantID != [16]byte{} {
		h[HeaderTenantID] = []string{d.TenantID.String()}
	}
	if d.DedupeKey != "" {
		h[HeaderDedupeKey] = []string{d.DedupeKey}
	}
	for _, k := range []string{HeaderNamespace, HeaderTopic, HeaderPartitionKey, HeaderDedupeKey} {
		if v := h.Get(k); strings.ContainsAny(v, "\r\n") {
			return nil, fmt.Errorf("%w %s of message %s: NATS header values have no line breaks", ErrInvalid, k, d.ID)
		}
	}
	if t.opts.ExpectStream != "" {
		h[jetstream.ExpectedStreamHeader] = []string{t.opts.ExpectStream}
	}
	return &nats.Msg{Subject: subject, Header: h, Data: data}, nil
}

// reserved reports whether name is one the transport sets itself.
func reserved(name string) bool {
	for _, r := range []string{jetstream.MsgIDHeader, HeaderNamespace, HeaderTopic, HeaderPartitionKey, HeaderTenantID, HeaderDedupeKey, HeaderAttempt} {
		if strings.EqualFold(name, r) {
			return true
		}
	}
	return false
}

func validHeaderName(k string) bool {
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= ' ' || c >= 0x7f || c == ':' {
			return false
		}
	}
	return k != ""
}

// validSubject accepts a subject a message can be published to: non-empty dot-separated
// tokens without whitespace or wildcards.
func validSubject(s string) bool {
	if s == "" {
		return false
	}
	for tok := range strings.SplitSeq(s, ".") {
		if tok == "" || tok == "*" || tok == ">" || strings.ContainsAny(tok, " \t\r\n\f") {
			return false
		}
	}
	return true
}

// Classify reports how the transport treats a publish error: wrapped with
// [outbox.Permanent] when retrying cannot help, with [outbox.Unavailable] when the server
// cannot be reached, returned as it is otherwise. Publish applies
// it to every failure; it is exported for transports that wrap this one.
func Classify(err error) error {
	if err == nil {
		return nil
	}
	if outbox.IsPermanent(err) || outbox.IsUnavailable(err) {
		return err
	}
	if errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadSubject) ||
		errors.Is(err, nats.ErrBadHeaderMsg) || errors.Is(err, ErrInvalid) {
		return outbox.Permanent(err)
	}
	if outbox.IsUnreachable(err) {
		return outbox.Unavailable(err)
	}
	for _, u := range unavailable {
		if errors.Is(err, u) {
			return outbox.Unavailable(err)
		}
	}
	var jsErr jetstream.JetStreamError
	if errors.As(err, &jsErr) {
		if api := jsErr.APIError(); api != nil {
			switch {
			case api.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
				return outbox.Permanent(err)
			case api.ErrorCode == jetstream.JSErrCodeStreamNotFound:
				return err // Nats-Expected-Stream names a stream that does not exist (yet)
			case api.Code == 400:
				// The server refused this message as it is: a wrong expected stream, a
				// malformed TTL or schedule header, a subject the stream forbids.
				return outbox.Permanent(err)
			}
		}
	}
	return err
}

// classify wraps err with the message's id and subject, and [Classify]s it. A timeout while
// the connection is down is an outage.
func (t *Transport) classify(d outbox.Delivery, subject string, err error) error {
	if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
		return outbox.Unavailable(fmt.Errorf("%w %q (message %s): %w", ErrNoStream, subject, d.ID, err))
	}
	if errors.Is(err, jetstream.ErrAsyncPublishTimeout) || errors.Is(err, nats.ErrTimeout) {
		if nc := t.js.Conn(); nc != nil && !nc.IsConnected() {
			err = fmt.Errorf("%w: %w", err, nats.ErrDisconnected)
		}
	}
	return Classify(fmt.Errorf("outbox/nats: publish %s to %q: %w", d.ID, subject, err))
}

// unavailable are the client's errors that say the server cannot be reached now.
var unavailable = []error{
	nats.ErrConnectionClosed, nats.ErrDisconnected, nats.ErrConnectionReconnecting, nats.ErrNoServers,
	nats.ErrReconnectBufExceeded, nats.ErrStaleConnection, nats.ErrNoResponders, jetstream.ErrNoStreamResponse,
	ErrNoStream, jetstream.ErrJetStreamNotEnabled,
}

// serverOf returns the host and port of a server URL such as "nats://host:4222", with NATS's
// port when it names none.
func serverOf(raw string) (string, int) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", 0
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		port = 4222
	}
	return u.Hostname(), port
}

// link logs what the transport sees of the server: one line when it stops answering, one
// when it answers again.
type link struct {
	log  *slog.Logger
	down atomic.Bool
}

// note takes a batch's outcome: any answer means the server is there; an Unavailable
// failure without one, that it is not.
func (l *link) note(answered bool, errs []error) {
	if answered {
		if l.down.CompareAndSwap(true, false) {
			l.log.Info("outbox/nats: the server answers again")
		}
		return
	}
	for _, err := range errs {
		if outbox.IsUnavailable(err) {
			if l.down.CompareAndSwap(false, true) {
				l.log.Warn("outbox/nats: the server cannot be reached; batches fail Unavailable until it answers", "err", err)
			}
			return
		}
	}
}
