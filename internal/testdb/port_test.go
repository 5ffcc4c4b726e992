package testdb

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFreePort(t *testing.T) {
	seen := map[int]bool{}
	for range 50 {
		port, err := FreePort()
		require.NoError(t, err)
		require.Less(t, port, ephemeralStart(), "a port from the ephemeral range can be taken before the server binds it")
		require.False(t, seen[port], "port %d handed out twice", port)
		seen[port] = true
	}
}
