package outbox_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
)

// TestErrorFingerprint: the variable parts of an error are masked, so one cause has one
// fingerprint; what tells causes apart (the words, a status code, a host) stays.
func TestErrorFingerprint(t *testing.T) {
	t.Parallel()
	same := [][]string{
		{"kafka: produce to orders.created: MESSAGE_TOO_LARGE", "kafka: produce to billing.invoice.paid: MESSAGE_TOO_LARGE"},
		{"nats: publish to tenant-7/invoices: no responders", "nats: publish to tenant-12/invoices: no responders"},
		{"timeout after 5s", "timeout after 30s", "timeout   after\n1.5s"},
		{"row 8f14e45f-ceea-467f-a0e8-2f5c1e2c8a1b: bad payload", "row 0190b4a7-1c2d-7e3f-8a9b-0c1d2e3f4a5b: bad payload"},
		{`field "total" missing`, `field "amount" missing`},
		{"object 5d41402abc4b2a76b9719d911017c592 not found", "object 0000000000000000deadbeef not found"},
		{"POST https://hooks.example.com/t/1/events?x=2: status 503", "POST https://hooks.example.com/t/abc: status 503"},
		{"dial tcp 10.0.0.7:5432: connect: connection refused", "dial tcp 10.0.0.9:6543: connect: connection refused"},
	}
	for _, group := range same {
		for _, s := range group[1:] {
			require.Equal(t, outbox.ErrorFingerprint(group[0]), outbox.ErrorFingerprint(s), "%q and %q", group[0], s)
		}
	}
	require.Equal(t, "kafka: produce to <name>: MESSAGE_TOO_LARGE", outbox.ErrorFingerprint("kafka: produce to orders.created: MESSAGE_TOO_LARGE"))
	require.Equal(t, "POST https://hooks.example.com/…: status 503", outbox.ErrorFingerprint("POST https://hooks.example.com/t/1: status 503"))
	require.Equal(t, "", outbox.ErrorFingerprint(""))
	differ := [][2]string{
		{"status 503", "status 400"},
		{"POST https://a.example.com/x: status 503", "POST https://b.example.com/x: status 503"},
		{"kafka: produce to orders: MESSAGE_TOO_LARGE", "kafka: produce to orders: UNKNOWN_TOPIC_OR_PARTITION"},
	}
	for _, d := range differ {
		require.NotEqual(t, outbox.ErrorFingerprint(d[0]), outbox.ErrorFingerprint(d[1]), "%q and %q are two causes", d[0], d[1])
	}
}
