// Package outboxkafka is an [outbox.Transport] for Apache Kafka, built on franz-go.
//
// A batch is produced at once and each record's own result is returned, so that
// [Transport.Publish] reports one outcome per message. The client should be an idempotent
// producer (franz-go's default, and [NewClient]'s): the broker then drops the copies its own
// retries would write. A redelivery after a lost acknowledgement is a new record, so
// consumers deduplicate on the Outbox-Id header.
//
// # Mapping
//
// The topic is "<namespace>.<topic>" unless [Options.Topic] says otherwise: an event
// enqueued with namespace "shop" and topic "order.created" goes to Kafka topic
// "shop.order.created". The record key is the partition key, so that the events of one
// entity keep their order on one partition; a message without a partition key has no key
// and is spread by the client's partitioner. The value is the payload, byte for byte.
// Record headers:
//
//	Outbox-Id          the delivery id (stable across redeliveries)
//	Outbox-Namespace   the namespace
//	Outbox-Topic       the topic
//	Outbox-Tenant-Id   the tenant id, when set
//	Outbox-Dedupe-Key  the dedupe key, when set
//	Outbox-Attempt     the attempt number, 1 for the first
//
// followed by the message's own headers, which may not use these names.
//
// # Errors
//
// A record the cluster can never accept fails with [outbox.Permanent] and is dead-lettered
// at once: larger than the producer's batch limit or the topic's max.message.bytes, an
// invalid topic name, and any other error that Kafka itself marks as not retriable, with
// the exceptions below. An outage fails with [outbox.Unavailable], which costs the message
// no attempt: a dial that fails, a connection that drops, BROKER_NOT_AVAILABLE,
// LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER, NETWORK_EXCEPTION, NOT_ENOUGH_REPLICAS,
// COORDINATOR_NOT_AVAILABLE, KAFKA_STORAGE_ERROR, REQUEST_TIMED_OUT, and records that time out
// ([Options.Timeout] or the client's delivery timeout). A record times out because no
// broker acknowledged it in time, never because of what it holds (a record Kafka refuses
// fails with an error of its own), so a timeout is an outage too: while the cluster comes
// back, a batch that timed out must not spend attempts because a broker answered a moment
// later. Retried under the publisher's retry policy: Kafka's other retriable errors, a
// closed client, a topic that does not exist (a deployment may
// create it later), authorization failures (an operator fixes the ACL) and errors of the
// idempotent producer's state, which the client recovers from.
//
// # CloudEvents
//
// With [Options.CloudEvents], every record is a CloudEvent under the Kafka protocol binding
// (binary mode by default: ce_* headers and content-type; structured mode: the event as
// JSON in the value). A message header named content-type or starting with "ce_" is then
// refused for good, so that it cannot replace an attribute.
package outboxkafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/cloudevents"
)

// Record header names set on every record besides the message's own headers.
const (
	HeaderID        = "Outbox-Id"
	HeaderNamespace = "Outbox-Namespace"
	HeaderTopic     = "Outbox-Topic"
	HeaderTenantID  = "Outbox-Tenant-Id"
	HeaderDedupeKey = "Outbox-Dedupe-Key"
	HeaderAttempt   = "Outbox-Attempt"
)

var reservedHeaders = []string{HeaderID, HeaderNamespace, HeaderTopic, HeaderTenantID, HeaderDedupeKey, HeaderAttempt}

// DefaultTimeout is the wait for a batch's results when [Options.Timeout] is zero.
const DefaultTimeout = 30 * time.Second

// DefaultDeliveryTimeout is the record delivery timeout [NewClient] sets.
const DefaultDeliveryTimeout = 30 * time.Second

// ErrInvalid marks a record the transport refuses to produce (an invalid topic name, a
// reserved header) and options [New] refuses. Such a record fails with [outbox.Permanent].
var ErrInvalid = errors.New("outbox/kafka: invalid")

// Options configure a [Transport]. The zero value is valid.
type Options struct {
	// Topic maps a delivery to the Kafka topic it is produced to. Default [DefaultTopic]:
	// "<namespace>.<topic>".
	Topic func(d outbox.Delivery) string

	// Timeout bounds the wait for one batch's results. Records without a result then fail
	// and are retried; the client may still write them later, so the retry can duplicate
	// them. It keeps a publish from waiting for as long as the cluster is away, as the
	// client does with a record already sent. Default [DefaultTimeout].
	Timeout time.Duration

	// AllowNonIdempotent accepts a client built with kgo.DisableIdempotentWrite, for
	// clusters that refuse idempotent producers. The client's own retries may then write a
	// record twice. Default false: [New] refuses such a client.
	AllowNonIdempotent bool

	// CloudEvents, when set, sends every message as a CloudEvent under the Kafka protocol
	// binding: in the binary mode, the attributes as ce_* record headers (ce_id, ce_source,
	// ce_specversion, ce_type, ce_time, ce_partitionkey, one per extension) and
	// datacontenttype as the content-type header, the payload as the value; in the
	// structured mode, the event as JSON in the value with content-type
	// application/cloudevents+json. The record key stays the partition key and the Outbox-*
	// headers are sent as before. Default nil: no CloudEvents.
	CloudEvents *cloudevents.Options

	// Logger receives one line when the cluster stops answering (a batch without a result
	// from any broker) and one when it answers again. Default [slog.Default].
	Logger *slog.Logger
}

// CloudEventsPrefix starts the record header names of a CloudEvent's attributes in the
// binary mode, as the Kafka protocol binding of CloudEvents names them; HeaderContentType
// carries its datacontenttype.
const (
	CloudEventsPrefix = "ce_"
	HeaderContentType = "content-type"
)

// DefaultTopic returns "<namespace>.<topic>".
func DefaultTopic(d outbox.Delivery) string { return d.Namespace + "." + d.Topic }

// Transport produces deliveries to Kafka. It is safe for concurrent use, and implements
// [outbox.Transport].
type Transport struct {
	client *kgo.Client
	opts   Options
	link   link
	// idempotent is false for a client built with kgo.DisableIdempotentWrite.
	idempotent bool
	// limit is the client's largest record batch for a topic, write its largest request
	// and buffered its MaxBufferedBytes (0: none).
	limit    func(topic string) int32
	write    int32
	buffered int64
}

var (
	_ outbox.Transport         = (*Transport)(nil)
	_ outbox.TransportKeyOrder = (*Transport)(nil)
)

// New returns a transport producing with client, which the caller configured (seed brokers,
// TLS, SASL) and closes after the publisher stopped. Set kgo.RecordDeliveryTimeout on it
// ([NewClient] does): without one, a record already sent to a broker that went away is
// retried by the client until the broker returns, and the publisher waits for it.
func New(client *kgo.Client, opts Options) (*Transport, error) {
	if client == nil {
		return nil, fmt.Errorf("%w options: client is nil", ErrInvalid)
	}
	if opts.Topic == nil {
		opts.Topic = DefaultTopic
	}
	switch {
	case opts.Timeout == 0:
		opts.Timeout = DefaultTimeout
	case opts.Timeout < 0:
		return nil, fmt.Errorf("%w options: Timeout must be positive, got %s", ErrInvalid, opts.Timeout)
	}
	if err := opts.CloudEvents.Validate(); err != nil {
		return nil, fmt.Errorf("%w options: %w", ErrInvalid, err)
	}
	if v, _ := client.OptValue(kgo.DisableIdempotentWrite).(bool); v && !opts.AllowNonIdempotent {
		return nil, fmt.Errorf("%w options: the client has idempotent writes disabled; set AllowNonIdempotent to accept duplicates from its retries", ErrInvalid)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	tr := &Transport{client: client, opts: opts, link: link{log: opts.Logger}, idempotent: true}
	if v, _ := client.OptValue(kgo.DisableIdempotentWrite).(bool); v {
		tr.idempotent = false
	}
	tr.limit, _ = client.OptValue(kgo.ProducerBatchMaxBytesFn).(func(string) int32)
	tr.write, _ = client.OptValue(kgo.BrokerMaxWriteBytes).(int32)
	if v, ok := client.OptValue(kgo.MaxBufferedBytes).(int64); ok {
		tr.buffered = v
	}
	return tr, nil
}

// NewClient returns a franz-go client for the seed brokers with the settings the transport
// expects: idempotent writes (the default), acknowledgement by all in-sync replicas (the
// default with idempotence), and a record delivery timeout of [DefaultDeliveryTimeout].
// extra options are applied after these and may override them.
func NewClient(seeds []string, extra ...kgo.Opt) (*kgo.Client, error) {
	if len(seeds) == 0 {
		return nil, fmt.Errorf("%w options: no seed brokers", ErrInvalid)
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(seeds...),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordDeliveryTimeout(DefaultDeliveryTimeout),
	}, extra...)
	return kgo.NewClient(opts...)
}

// System returns "kafka", the messaging.system of OpenTelemetry's conventions, for telemetry
// ([outbox.TransportSystem]).
func (t *Transport) System() string { return "kafka" }

// Destination reports the topic d is produced to and the first seed broker, for telemetry
// ([outbox.TransportDestination]): which broker leads the record's partition is known only
// once it is produced.
func (t *Transport) Destination(d outbox.Delivery) outbox.Destination {
	dst := outbox.Destination{Name: t.opts.Topic(d)}
	if seeds, _ := t.client.OptValue(kgo.SeedBrokers).([]string); len(seeds) > 0 {
		dst.ServerAddress, dst.ServerPort = serverOf(seeds[0])
	}
	return dst
}

// Publish produces every message of batch and waits for each record's result.
//
// A partition key's records go to one partition, in their order, and the idempotent
// producer keeps them there in that order: when the broker refuses one, it refuses every
// later record of the partition too (their sequence numbers no longer follow on) and the
// client fails them. So a key's messages go together, except where that reasoning does not
// hold: a key's message bound for another Kafka topic than the one ahead of it, and a
// record so large that the client itself might refuse it before sending (only it would
// fail, not those after it), wait until the one ahead of them was delivered
// ([Transport.KeepsKeyOrder]).
func (t *Transport) Publish(ctx context.Context, batch []outbox.Delivery) []error {
	return outbox.PublishInKeyOrder(ctx, batch, t.apart, t.publish)
}

// KeepsKeyOrder reports whether Publish keeps the order of a partition key's messages
// inside a batch ([outbox.TransportKeyOrder]): true, unless the client has idempotent
// writes disabled ([Options.AllowNonIdempotent]), whose retries may reorder a partition.
// It relies on the client's partitioner sending one key to one partition, as franz-go's
// default and every key-hashing partitioner do.
func (t *Transport) KeepsKeyOrder() bool { return t.idempotent }

// bigMargin is what a record's own headers, CloudEvents attributes, framing and the
// produce request around it may add to the sizes [Transport.big] counts, generously.
const bigMargin = 4 << 10

// apart reports whether d must wait for the result of ahead, its key's message before it:
// when they go to different topics, or when either might be refused by the client for its
// size alone.
func (t *Transport) apart(ahead, d *outbox.Delivery) bool {
	return t.opts.Topic(*ahead) != t.opts.Topic(*d) || t.big(ahead) || t.big(d)
}

// big reports whether d's record might exceed the client's batch or buffer limit.
func (t *Transport) big(d *outbox.Delivery) bool {
	size := int64(len(d.PartitionKey) + len(d.Payload) + len(d.DedupeKey) + len(d.Namespace) + len(d.Topic))
	for k, v := range d.Headers {
		size += int64(len(k) + len(v))
	}
	size += bigMargin
	if t.buffered > 0 && size > t.buffered || t.write > 0 && size > int64(t.write) {
		return true
	}
	return t.limit != nil && size > int64(t.limit(t.opts.Topic(*d)))
}

// publish produces batch and waits for each record's result.
func (t *Transport) publish(ctx context.Context, batch []outbox.Delivery) []error {
	errs := make([]error, len(batch))
	records := make([]*kgo.Record, 0, len(batch))
	index := make(map[*kgo.Record]int, len(batch))
	for i := range batch {
		r, err := t.record(batch[i])
		if err != nil {
			errs[i] = outbox.Permanent(err)
			continue
		}
		records = append(records, r)
		index[r] = i
	}
	if len(records) == 0 {
		return errs
	}
	done := make(chan kgo.ProduceResults, 1)
	go func() { done <- t.client.ProduceSync(ctx, records...) }()
	timer := time.NewTimer(t.opts.Timeout)
	defer timer.Stop()
	var results kgo.ProduceResults
	select {
	case results = <-done:
	case <-timer.C:
		failAll(errs, batch, outbox.Unavailable(fmt.Errorf("outbox/kafka: no result within %s", t.opts.Timeout)))
		t.link.note(false, errs)
		return errs
	case <-ctx.Done():
		return failAll(errs, batch, ctx.Err())
	}
	// ProduceSync reports results in completion order; the record pointer says whose.
	answered := false // a broker acknowledged or refused a record
	for _, res := range results {
		if res.Err == nil {
			answered = true
			continue
		}
		i := index[res.Record]
		errs[i] = Classify(fmt.Errorf("outbox/kafka: produce %s to %q: %w", batch[i].ID, res.Record.Topic, res.Err))
		answered = answered || !outbox.IsUnavailable(errs[i])
	}
	if ctx.Err() == nil {
		t.link.note(answered, errs)
	}
	return errs
}

// failAll sets err on every message that has no outcome yet.
func failAll(errs []error, batch []outbox.Delivery, err error) []error {
	for i := range errs {
		if errs[i] == nil {
			errs[i] = fmt.Errorf("%w (message %s)", err, batch[i].ID)
		}
	}
	return errs
}

// record builds the Kafka record of d.
func (t *Transport) record(d outbox.Delivery) (*kgo.Record, error) {
	topic := t.opts.Topic(d)
	if !validTopic(topic) {
		return nil, fmt.Errorf("%w topic %q for message %s: Kafka topics are 1 to 249 of [a-zA-Z0-9._-], not \".\" or \"..\"", ErrInvalid, topic, d.ID)
	}
	hs := make([]kgo.RecordHeader, 0, len(d.Headers)+6)
	add := func(k, v string) { hs = append(hs, kgo.RecordHeader{Key: k, Value: []byte(v)}) }
	add(HeaderID, d.ID.String())
	add(HeaderNamespace, d.Namespace)
	add(HeaderTopic, d.Topic)
	if d.TenantID != [16]byte{} {
		add(HeaderTenantID, d.TenantID.String())
	}
	if d.DedupeKey != "" {
		add(HeaderDedupeKey, d.DedupeKey)
	}
	add(HeaderAttempt, strconv.Itoa(d.Attempt))
	own, value := d.Headers, []byte(d.Payload)
	if ce := t.opts.CloudEvents; ce != nil {
		e, err := cloudevents.Of(ce, d)
		if err != nil {
			return nil, fmt.Errorf("%w %w", ErrInvalid, err)
		}
		own = e.Other
		if ce.Mode == cloudevents.Structured {
			if value, err = e.JSON(d.Payload); err != nil {
				return nil, fmt.Errorf("%w CloudEvent of message %s: %w", ErrInvalid, d.ID, err)
			}
			add(HeaderContentType, cloudevents.ContentType)
		} else {
			for _, a := range e.Attributes {
				add(CloudEventsPrefix+a.Name, a.Value)
			}
			add(HeaderContentType, e.DataContentType)
		}
	}
	for k, v := range own {
		for _, r := range reservedHeaders {
			if strings.EqualFold(k, r) {
				return nil, fmt.Errorf("%w header %q on message %s: the name is reserved for the transport", ErrInvalid, k, d.ID)
			}
		}
		if t.opts.CloudEvents != nil && (strings.EqualFold(k, HeaderContentType) ||
			len(k) >= len(CloudEventsPrefix) && strings.EqualFold(k[:len(CloudEventsPrefix)], CloudEventsPrefix)) {
			return nil, fmt.Errorf("%w header %q on message %s: it would replace a CloudEvents attribute", ErrInvalid, k, d.ID)
		}
		add(k, v)
	}
	r := &kgo.Record{Topic: topic, Value: value, Headers: hs}
	if d.PartitionKey != "" {
		r.Key = []byte(d.PartitionKey)
	}
	return r, nil
}

func validTopic(s string) bool {
	if s == "" || len(s) > 249 || s == "." || s == ".." {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// retriedAnyway are Kafka errors marked not retriable that an operator or the client fixes
// without the message changing: a missing topic or permission, the idempotent producer's
// state, and a broker error Kafka could not name.
var retriedAnyway = []*kerr.Error{
	kerr.UnknownTopicOrPartition, kerr.UnknownTopicID,
	kerr.TopicAuthorizationFailed, kerr.ClusterAuthorizationFailed, kerr.SaslAuthenticationFailed,
	kerr.TransactionalIDAuthorizationFailed,
	kerr.OutOfOrderSequenceNumber, kerr.DuplicateSequenceNumber, kerr.InvalidProducerEpoch,
	kerr.UnknownProducerID, kerr.InvalidProducerIDMapping, kerr.ProducerFenced,
	kerr.UnknownServerError,
}

// unavailable are the Kafka errors that say a broker or a partition's leader cannot be
// reached: the cluster is restarting, electing a leader or short of in-sync replicas.
var unavailable = []*kerr.Error{
	kerr.BrokerNotAvailable, kerr.LeaderNotAvailable, kerr.NotLeaderForPartition, kerr.NetworkException,
	kerr.NotEnoughReplicas, kerr.NotEnoughReplicasAfterAppend, kerr.CoordinatorNotAvailable,
	kerr.KafkaStorageError, kerr.RequestTimedOut,
}

// Classify reports how the transport treats a produce error: wrapped with
// [outbox.Permanent] when retrying cannot help, with [outbox.Unavailable] when the cluster
// cannot be reached or did not acknowledge a record in time, returned as it is otherwise.
// Publish applies it to every failure; it is exported for transports that wrap this one.
func Classify(err error) error {
	if err == nil || outbox.IsPermanent(err) || outbox.IsUnavailable(err) {
		return err
	}
	if errors.Is(err, ErrInvalid) {
		return outbox.Permanent(err)
	}
	var first *kgo.ErrFirstReadEOF
	if outbox.IsUnreachable(err) || errors.As(err, &first) || errors.Is(err, kgo.ErrRecordTimeout) {
		return outbox.Unavailable(err) // dials that fail, connections that drop, no acknowledgement in time
	}
	var ke *kerr.Error
	if errors.As(err, &ke) {
		for _, u := range unavailable {
			if ke == u {
				return outbox.Unavailable(err)
			}
		}
	}
	if ke == nil || ke.Retriable {
		return err // the client's own errors (a closed client), retriable codes
	}
	for _, r := range retriedAnyway {
		if ke == r {
			return err
		}
	}
	return outbox.Permanent(err)
}

// serverOf returns the host and port of a seed broker's "host:port", with Kafka's port when
// it has none.
func serverOf(addr string) (string, int) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return addr, 9092
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return h, 9092
	}
	return h, port
}

// link logs what the transport sees of the cluster: one line when it stops answering, one
// when it answers again.
type link struct {
	log  *slog.Logger
	down atomic.Bool
}

// note takes a batch's outcome: a result from a broker means the cluster is there; an
// Unavailable failure without one, that it is not.
func (l *link) note(answered bool, errs []error) {
	if answered {
		if l.down.CompareAndSwap(true, false) {
			l.log.Info("outbox/kafka: the cluster answers again")
		}
		return
	}
	for _, err := range errs {
		if outbox.IsUnavailable(err) {
			if l.down.CompareAndSwap(false, true) {
				l.log.Warn("outbox/kafka: the cluster cannot be reached; batches fail Unavailable until it answers", "err", err)
			}
			return
		}
	}
}
