package serverport_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox/outboxtest/internal/serverport"
)

var errTaken = errors.New(`could not bind IPv4 address "127.0.0.1": Address already in use`)

func TestStart(t *testing.T) {
	t.Run("a taken port is left for another", func(t *testing.T) {
		var ports []int
		require.NoError(t, serverport.Start(func(port int) error {
			ports = append(ports, port)
			if len(ports) == 1 {
				return errTaken
			}
			return nil
		}))
		require.Len(t, ports, 2)
	})
	t.Run("three ports at most", func(t *testing.T) {
		tries := 0
		require.ErrorIs(t, serverport.Start(func(int) error { tries++; return errTaken }), errTaken)
		require.Equal(t, 3, tries)
	})
	t.Run("other errors are not tried again", func(t *testing.T) {
		tries := 0
		boom := errors.New("initdb: no space left on device")
		require.ErrorIs(t, serverport.Start(func(int) error { tries++; return boom }), boom)
		require.Equal(t, 1, tries)
	})
}
