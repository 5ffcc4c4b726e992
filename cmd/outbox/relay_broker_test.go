package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseBroker(t *testing.T) {
	t.Parallel()
	b, err := parseBroker("kafka://k1:9092,k2:9092?timeout=3s&topic=events.{topic}", map[string]string{"timeout": "5s"})
	require.NoError(t, err)
	require.Equal(t, []string{"k1:9092", "k2:9092"}, b.seeds)
	require.Equal(t, "5s", b.opts["timeout"], "broker_options win over the URL's query")
	require.Equal(t, "events.{topic}", b.opts["topic"])
	require.Equal(t, "kafka://k1:9092,k2:9092", b.shown)

	b, err = parseBroker("https://hooks.example.com/in?tenant=a", map[string]string{"secret": "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})
	require.NoError(t, err)
	require.Equal(t, "https://hooks.example.com/in?tenant=a", b.u.String(), "a webhook's query is the receiver's")

	b, err = parseBroker("amqp://guest:s3cret@rabbit:5672/", nil)
	require.NoError(t, err)
	require.NotContains(t, b.shown, "s3cret")

	for raw, want := range map[string]string{
		"nats://n:4222?ack_timeout=soon":            "ack_timeout",
		"redis://r:6379?max_len=-1":                 "max_len",
		"redis://r:6379?subject=x":                  `"subject"`,
		"nats://n:4222?cloudevents_mode=structured": "needs cloudevents_source",
		"mqtt://m:1883":                             "unknown scheme",
		"nats://":                                   "not a URL",
	} {
		_, err := parseBroker(raw, nil)
		require.ErrorContains(t, err, want, raw)
		var ue *usageError
		require.ErrorAs(t, err, &ue, raw)
	}
}
