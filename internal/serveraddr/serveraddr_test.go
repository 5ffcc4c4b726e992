package serveraddr

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFromURL(t *testing.T) {
	t.Parallel()
	ports := map[string]int{"https": 443, "http": 80}
	for _, c := range []struct {
		raw  string
		host string
		port int
	}{
		{"nats://127.0.0.1:4222", "127.0.0.1", 4222},
		{"https://hooks.example.com/shop/{topic}", "hooks.example.com", 443},
		{"http://[::1]:8080/x", "::1", 8080},
		{"amqp://guest:secret@rabbit:5672/vhost", "rabbit", 5672},
		{"nats://nohost", "nohost", 0},
		{"", "", 0},
		{"://bad", "", 0},
	} {
		host, port := FromURL(c.raw, ports)
		require.Equal(t, c.host, host, c.raw)
		require.Equal(t, c.port, port, c.raw)
	}
}

func TestFromHostPort(t *testing.T) {
	t.Parallel()
	h, p := FromHostPort("broker-1:9093", 9092)
	require.Equal(t, "broker-1", h)
	require.Equal(t, 9093, p)
	h, p = FromHostPort("broker-1", 9092)
	require.Equal(t, "broker-1", h)
	require.Equal(t, 9092, p)
	h, p = FromHostPort("/tmp/redis.sock", 0)
	require.Equal(t, "/tmp/redis.sock", h)
	require.Zero(t, p)
}
