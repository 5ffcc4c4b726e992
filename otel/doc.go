// Package outboxotel is OpenTelemetry tracing and metrics for the outbox, built on the
// hooks of package github.com/outboxgo/outbox ([outbox.EnqueueHook],
// [outbox.PublisherObserver]) and of its inbox ([inbox.Observer]), which import no
// telemetry. It follows the messaging semantic conventions of OpenTelemetry 1.43.0
// (go.opentelemetry.io/otel/semconv/v1.43.0; spans carry its schema URL).
//
// One trace runs from the code that enqueued an event to its consumer:
//
//   - Enqueue starts a "create <topic>" span (kind PRODUCER), a child of the caller's span,
//     and stores its context in the message's headers with the configured propagator (W3C
//     traceparent and tracestate by default). A header the caller set is kept: when the
//     message already carries one of the propagator's fields, nothing is injected, and the
//     create span links to the caller's context instead.
//   - A [outbox.Publisher] sends each batch in a "send <destination>" span (kind CLIENT)
//     that links to every message's stored creation context; the destination is the
//     broker's and server.address/server.port its server, as the transport reports them
//     ([outbox.TransportDestination]), and the outbox topic is outbox.topic; with
//     messaging.batch.message_count, or, with [Options.SpanPerMessage], one span per
//     message with messaging.message.id. Failures set error.type and add an event per
//     message: "outbox.retry_scheduled", "outbox.unavailable" or "outbox.dead_lettered".
//   - The transports copy the message's headers onto the broker message unchanged, so a
//     consumer extracts the creation context from them; the inbox's "process" span (kind
//     CONSUMER) links to it.
//
// Every span and metric carries the same messaging.system, [Options.System] ("outbox" unless
// set), so that the create and send spans of one message tell one story.
//
// Metrics (instrumentation scope [ScopeName]):
//
//	messaging.client.sent.messages      counter    messages the broker accepted (failed sends are in outbox.attempts)
//	messaging.client.operation.duration histogram  s, create (enqueue) and send (publish), the conventions' buckets
//	outbox.attempts                     counter    attempts recorded, by outbox.outcome: delivered, retried, unavailable, dead
//	outbox.delivery.lag                 histogram  s, from enqueue (the row's created_at) to its recorded delivery
//	outbox.messages                     gauge      rows per namespace, topic and outbox.status (pending, scheduled, processing, dead)
//	outbox.oldest_undelivered.age       gauge      s, how long the oldest undelivered row of a topic has waited since first due
//	outbox.oldest_pending.age           gauge      s, how long the oldest due row of a topic has waited
//	outbox.circuit.open                 gauge      1 while a publisher's circuit breaker is open, else 0 (also once closed)
//
// Alert on the oldest undelivered age (outbox.oldest_undelivered.age): it grows whenever an
// event waits, a broker outage included; the oldest pending age stays low through an
// outage, so do not alert on it alone.
//
// The gauges come from [outbox.Store.Stats], read by one poller per store
// ([Telemetry.WatchStore], every 15 s by default), never by the claim loops; a collection
// reads the last snapshot.
//
// The module path is github.com/outboxgo/outbox/otel; the package is named outboxotel so
// that it does not shadow go.opentelemetry.io/otel.
package outboxotel
