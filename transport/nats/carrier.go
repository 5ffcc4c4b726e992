package outboxnats

import (
	"strings"

	"github.com/nats-io/nats.go"
)

// HeaderCarrier lets an OpenTelemetry propagator read and write the headers of a NATS
// message: it has the methods of propagation.TextMapCarrier, without this module importing
// OpenTelemetry. A consumer continues the producer's trace with
//
//	ctx := propagator.Extract(ctx, outboxnats.HeaderCarrier(msg.Headers()))
//
// propagation.HeaderCarrier(msg.Headers()) compiles too, but finds nothing: it looks names
// up in the canonical form of HTTP ("Traceparent"), while a nats.Header keeps them as they
// were sent ("traceparent") and its Get matches them exactly. HeaderCarrier matches names
// regardless of case, as NATS header names are meant to be. Set needs a non-nil header.
type HeaderCarrier nats.Header

// Get returns the first value of the header named key, regardless of case.
func (c HeaderCarrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	for k, v := range c {
		if len(v) > 0 && strings.EqualFold(k, key) {
			return v[0]
		}
	}
	return ""
}

// Set sets the header named key to value, replacing any header whose name differs from
// key only in case.
func (c HeaderCarrier) Set(key, value string) {
	for k := range c {
		if k != key && strings.EqualFold(k, key) {
			delete(c, k)
		}
	}
	c[key] = []string{value}
}

// Keys returns the header names.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
