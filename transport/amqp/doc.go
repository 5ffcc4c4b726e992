// Package outboxamqp is an [outbox.Transport] for RabbitMQ and other AMQP 0-9-1 brokers, built on
// github.com/rabbitmq/amqp091-go.
//
// # Delivery
//
// Each batch is published on one channel in confirm mode, every message with the mandatory
// flag, and then every publisher confirmation is awaited, so that [Transport.Publish]
// reports one outcome per message: nil once the broker has confirmed the message and has not
// returned it. A message is published to the exchange and routing key that
// [Options.Route] chooses; by default the exchange is the message's namespace and the
// routing key its topic, so that a topic exchange named after the namespace receives every
// event of that namespace and its bindings choose the queues.
//
// A message carries, in the broker's own fields:
//
//   - message-id: the delivery id ([outbox.Delivery.ID]), stable across redeliveries, so
//     consumers deduplicate on it;
//   - content-type: the message's "content-type" header, or "application/json";
//   - type: the topic; timestamp: when the message was enqueued;
//   - delivery-mode: persistent, unless [Options.Transient];
//   - headers: every header of the message as a string, plus outbox-namespace,
//     outbox-topic, outbox-attempt (an integer), and outbox-partition-key,
//     outbox-tenant-id and outbox-dedupe-key when set. The outbox-* keys are the
//     transport's and win over a message header of the same name.
//
// # Failures
//
// RabbitMQ has no publisher-side deduplication: a message whose confirmation was lost (the
// connection dropped after the broker took it) is published again on its next attempt, and
// consumers see it twice. They must be idempotent on the message id.
//
// An unroutable message (no binding of its exchange matches its routing key) is returned by
// the broker and reported as an error matching [ErrUnroutable]; a message for an exchange
// that does not exist is reported with [ErrNoExchange] before it is published, so that it
// does not close the channel that the rest of the batch uses. Both are retried by default,
// not dead-lettered: a missing binding or exchange is most often a deploy-order problem (the
// producer runs before the consumer that declares its queue and binding), which fixes
// itself within minutes, and the publisher's attempt limit still dead-letters a message whose
// route never appears. Set [Options.PermanentUnroutable] when routes are declared before any
// producer runs and an unroutable message can only be a bug.
//
// A lost connection or channel ([ErrConnectionLost], which includes a confirmation that
// does not come within [Options.ConfirmTimeout], since the connection is then closed), a
// dial failure or the pause after one ([ErrNotConnected]) are outages: they are marked with
// [outbox.Unavailable] and cost the message no attempt (see [Classify]). A channel the
// broker closes over a publish (ACCESS_REFUSED, NOT_FOUND, PRECONDITION_FAILED such as a
// message above max_message_size) is not an outage: it is retried at the cost of an attempt,
// so that the message at fault is dead-lettered in the end. A header name or content type
// longer than AMQP's 255 bytes is refused for good before it is sent. A negative
// acknowledgement from the broker ([ErrNacked]) is retried under the publisher's retry
// policy. An error returned by [Options.Route] is reported as it is: wrap it with
// [outbox.Permanent] to dead-letter the message.
//
// # CloudEvents
//
// With [Options.CloudEvents], every message is a CloudEvent under the AMQP protocol binding
// (binary mode by default: cloudEvents:* headers and the content-type property; structured
// mode: the event as JSON in the body). A message header whose name starts with
// "cloudEvents:" or "cloudEvents_" is then refused for good, so that it cannot replace an
// attribute.
//
// # Connection
//
// The transport dials lazily, on the first Publish, and keeps one connection with one
// publishing channel. When the broker goes away (restart, network failure, a channel closed
// by an error), the batch in flight fails and the next Publish dials again. A failed dial
// makes the following Publish calls fail at once, without dialling, until a backoff passes
// (from [Options.ReconnectMin], doubling up to [Options.ReconnectMax]), so an outage costs
// the database retries, not a storm of connection attempts. Publish never blocks past its
// context: when the context ends, the connection is closed under the calls still writing or
// awaiting confirmations. Call [Transport.Close] when done.
package outboxamqp
