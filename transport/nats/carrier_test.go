package outboxnats_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox/transport/nats"
)

// HeaderCarrier finds a header whatever the case of the name asked for, as a propagator
// asks for "traceparent" and another for "Traceparent", and Set leaves one header per name.
func TestHeaderCarrier(t *testing.T) {
	t.Parallel()
	h := nats.Header{"traceparent": {"00-a-b-01"}, "Tracestate": {"k=v"}}
	c := outboxnats.HeaderCarrier(h)
	require.Equal(t, "00-a-b-01", c.Get("traceparent"))
	require.Equal(t, "00-a-b-01", c.Get("Traceparent"))
	require.Equal(t, "k=v", c.Get("tracestate"))
	require.Empty(t, c.Get("baggage"))
	require.Empty(t, h.Get("Traceparent"), "nats.Header itself matches names exactly")

	c.Set("TRACEPARENT", "00-c-d-01")
	require.Equal(t, "00-c-d-01", c.Get("traceparent"))
	require.ElementsMatch(t, []string{"TRACEPARENT", "Tracestate"}, c.Keys())
	require.Empty(t, outboxnats.HeaderCarrier(nil).Get("traceparent"))
}
