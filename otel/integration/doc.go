// Package integration tests the OpenTelemetry adapter against the real transports: a trace
// across processes through NATS, and a consumer of every broker continuing the trace. It
// is a module of its own so that the adapter's module requires no transport; it has no API.
package integration
