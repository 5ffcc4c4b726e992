package outbox

import (
	"context"
	"encoding/json"
	"time"

	"github.com/google/uuid"
)

// Delivery is one claimed message as a [Transport] receives it. Its fields are the
// producer's, read back byte for byte from the table; the payload has been checked against
// the SHA-256 taken at enqueue before the transport sees it.
type Delivery struct {
	// ID is the message id, stable across redeliveries: consumers deduplicate on it (or on
	// DedupeKey when the producer set one).
	ID        uuid.UUID
	Namespace string
	Topic     string
	// TenantID is uuid.Nil when the message has no tenant.
	TenantID uuid.UUID
	// DedupeKey and PartitionKey are empty when the producer set none.
	DedupeKey    string
	PartitionKey string
	Headers      Headers
	Payload      json.RawMessage
	// Attempt is this delivery's attempt number, 1 for the first. A value above 1 means an
	// earlier attempt failed or its outcome was not recorded, so the consumer may already
	// have seen the message.
	Attempt   int
	CreatedAt time.Time
}

// deliveryOf converts a claimed or read row into what a transport or hook receives.
func deliveryOf(r Record) Delivery {
	return Delivery{
		ID: r.ID, Namespace: r.Namespace, Topic: r.Topic, TenantID: r.TenantID,
		DedupeKey: r.DedupeKey, PartitionKey: r.PartitionKey, Headers: r.Headers,
		Payload: r.Payload, Attempt: r.Attempts, CreatedAt: r.CreatedAt,
	}
}

// Transport delivers messages to the outside world: a broker, a webhook, another module. The
// library never interprets payloads; the transport decides what a delivery means.
//
// Publish receives a batch in claim order and reports one outcome per message, at the same
// index: nil means delivered, an error means the attempt failed and is retried under the
// [Publisher]'s [RetryPolicy]. Wrap an error with [Permanent] to dead-letter the message at
// once, or with [RetryAfter] to choose when it is tried again. Returning a nil or empty
// slice means every message was delivered. A slice of any other length than the batch is a
// bug in the transport: the whole batch then counts as failed and is retried.
//
// ctx is cancelled only when the publisher's shutdown deadline passes
// ([PublisherOptions.ShutdownTimeout]); a transport should return promptly then, failing what
// it did not finish. The publisher renews the batch's leases while Publish runs. A panic in
// Publish is recovered and fails the whole batch.
//
// A Publisher calls Publish from one goroutine per claim loop, so with
// [PublisherOptions.Concurrency] above 1 calls may overlap. Delivery is at least once: the
// same message may be published again after a crash or a lost acknowledgement, so consumers
// must be idempotent on [Delivery.ID] or [Delivery.DedupeKey].
type Transport interface {
	Publish(ctx context.Context, batch []Delivery) []error
}

// TransportFunc adapts a function to [Transport].
type TransportFunc func(ctx context.Context, batch []Delivery) []error

// Publish calls f(ctx, batch).
func (f TransportFunc) Publish(ctx context.Context, batch []Delivery) []error { return f(ctx, batch) }

// PerMessage returns a [Transport] that calls fn for each message of a batch in turn, in
// claim order. Once ctx is done, the messages not yet published fail with ctx's error and are
// retried later. fn's errors follow the rules of [Transport]: nil, an error, [Permanent] or
// [RetryAfter]. It keeps key order ([TransportKeyOrder]): once fn fails a message, the later
// messages of its namespace and partition key in the batch are not passed to fn and fail
// with an error that names the one that failed (an outage when that one's was).
func PerMessage(fn func(ctx context.Context, d Delivery) error) Transport {
	return perMessage(fn)
}

type perMessage func(ctx context.Context, d Delivery) error

// KeepsKeyOrder reports true: messages go one at a time, and a key stops at its first failure.
func (perMessage) KeepsKeyOrder() bool { return true }

func (fn perMessage) Publish(ctx context.Context, batch []Delivery) []error {
	var errs []error
	var failed map[partKey]int // a key's first failed message, unless key order is waived
	track := !keyOrderWaived(ctx)
	for i := range batch {
		d := &batch[i]
		k := partKey{d.Namespace, d.PartitionKey}
		var err error
		if j, ok := failed[k]; ok {
			err = behind(d, &batch[j], errs[j])
		} else if cerr := ctx.Err(); cerr != nil {
			err = cerr
		} else {
			err = fn(ctx, *d)
		}
		if err == nil {
			continue
		}
		if errs == nil {
			errs = make([]error, len(batch))
		}
		errs[i] = err
		if _, ok := failed[k]; track && k.pk != "" && !ok {
			if failed == nil {
				failed = map[partKey]int{}
			}
			failed[k] = i
		}
	}
	return errs
}

// TransportKeyOrder is an optional ability of a [Transport]: KeepsKeyOrder reports whether
// Publish keeps the order of one partition key's messages inside a batch. A transport that
// keeps it delivers the messages of a batch that share a Namespace and a PartitionKey in their
// order in the batch, so that a consumer never receives one before those ahead of it, and once
// one of them fails it delivers none of the key's later messages in that batch, reporting an
// error for each (the [Publisher] releases them without spending an attempt). Messages of
// different keys may go in parallel.
//
// An ordered Publisher ([PublisherOptions.Ordered]) hands a transport that keeps key order a
// key's waiting messages together, in sequence, up to the batch size; any other transport
// receives at most one message per key in a batch. A transport that wraps another (telemetry,
// middleware) should report what the wrapped one reports. [PublishInKeyOrder] keeps the
// promise for a transport that publishes a slice of messages at a time; through it, a batch
// of an unordered Publisher, which needs no key order, goes in one call.
type TransportKeyOrder interface {
	KeepsKeyOrder() bool
}

// TransportDestination is an optional ability of a [Transport], for telemetry: Destination
// tells where Publish sends d, in the words of OpenTelemetry's messaging conventions
// (messaging.destination.name, server.address, server.port). Telemetry adapters call it for
// each delivery as its publish starts, so it must be quick and must not block: it maps d as
// Publish does and reports the server the transport knows now, without any network call.
// Every built-in transport implements it.
type TransportDestination interface {
	Destination(d Delivery) Destination
}

// Destination is where a transport sends one message, as [TransportDestination] reports it.
// A field the transport cannot tell is left zero.
type Destination struct {
	// Name is the broker's name of the destination, not the outbox topic: the NATS subject,
	// the Kafka topic, the AMQP exchange, the Redis stream, the webhook URL's host.
	Name string
	// RoutingKey is the AMQP routing key of the message; empty for other brokers.
	RoutingKey string
	// ServerAddress is the host name (or IP address) of the broker or endpoint, and
	// ServerPort its port.
	ServerAddress string
	ServerPort    int
}
