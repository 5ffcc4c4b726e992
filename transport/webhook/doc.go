// Package outboxwebhook is an [outbox.Transport] that delivers each message as an HTTP POST,
// signed the Standard Webhooks way (https://www.standardwebhooks.com), using net/http only.
//
// # Requests
//
// Every message of a batch is one POST to the URL that [Options.URL] or [Options.URLFunc]
// gives it; at most [Options.Concurrency] requests are in flight per [Transport], across
// overlapping Publish calls. The body is the payload, byte for byte. The request carries:
//
//   - webhook-id: the outbox message id, the same on every retry, for the receiver to
//     deduplicate on;
//   - webhook-timestamp: the time of this attempt, in Unix seconds;
//   - webhook-signature: "v1," followed by the standard base64 of the HMAC-SHA256 of
//     "<webhook-id>.<webhook-timestamp>.<body>" under the endpoint's secret;
//   - Content-Type: the message's "content-type" header, or "application/json";
//   - every other header of the message under its own name, except the hop-by-hop and
//     framing headers (Host, Content-Length, Connection, Transfer-Encoding, ...) and the
//     webhook-* and Outbox-* names, which are the transport's: those are not sent;
//   - Outbox-Namespace, Outbox-Topic, Outbox-Attempt, and Outbox-Partition-Key,
//     Outbox-Tenant-Id and Outbox-Dedupe-Key when set.
//
// Only the id, the timestamp and the body are signed: a receiver must not trust the other
// headers more than the connection that brought them.
//
// # Outcomes
//
//   - 2xx: delivered.
//   - 502, 503 and 504, a connection that could not be made (refused, dial timeout, a
//     name that does not resolve) or that was closed or reset before the response: an
//     outage, marked with [outbox.Unavailable], which costs the message no attempt.
//   - 408, 429, 500 and the other 5xx, any other status that is not 4xx (a redirect,
//     which is never followed) and a request timeout ([Options.Timeout]) on a connection
//     that was made: retried under the publisher's retry policy. A timeout is not an
//     outage while the endpoint answers: a receiver that hangs on one message must not
//     hold it forever. When a request gets no response and none of its batch has, a HEAD
//     request checks the endpoint within Timeout; without an answer, the batch is an outage:
//     its requests without a response, and those not sent yet, which fail at once rather
//     than wait out Timeout each.
//   - A Retry-After header (seconds or an HTTP date) on a retried or unavailable status
//     sets the delay of the next attempt with [outbox.RetryAfter], capped by
//     [Options.MaxRetryAfter].
//   - any other 4xx (400, 401, 403, 404, 410, 413, 422, ...): dead-lettered at once with
//     [outbox.Permanent]: the receiver refused the message itself, and sending it again
//     will not change its mind. Replay it once the receiver is fixed.
//   - a URL that is not https (unless [Options.AllowHTTP]), that does not parse, or a
//     message header that cannot be an HTTP header: dead-lettered at once.
//
// Status errors are [*StatusError] values.
//
// # CloudEvents
//
// With [Options.CloudEvents], every request is a CloudEvent under the HTTP protocol
// binding (binary mode by default: ce-* headers and Content-Type; structured mode: the
// event as JSON in the body). A message header named Content-Type or starting with "ce-"
// is then refused for good, so that it cannot replace an attribute.
package outboxwebhook
