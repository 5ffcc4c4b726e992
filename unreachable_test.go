package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
)

func TestIsUnreachable(t *testing.T) {
	t.Parallel()
	outage := []error{
		syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.EPIPE, io.EOF, io.ErrUnexpectedEOF, net.ErrClosed,
		os.ErrDeadlineExceeded, &net.DNSError{Err: "no such host", Name: "broker", IsNotFound: true},
		&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("i/o timeout")},
		&net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)},
	}
	for _, err := range outage {
		require.True(t, outbox.IsUnreachable(fmt.Errorf("publish: %w", err)), "%v", err)
	}
	other := []error{
		nil, context.Canceled, context.DeadlineExceeded, errors.New("connection refused"),
		&net.OpError{Op: "dial", Net: "tcp", Err: context.Canceled},
		&net.OpError{Op: "write", Net: "tcp", Err: errors.New("message too long")},
	}
	for _, err := range other {
		require.False(t, outbox.IsUnreachable(err), "%v", err)
	}
}

// A real refused dial and a real read deadline are recognised as they come from the
// standard library.
func TestIsReal(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	_, err = net.DialTimeout("tcp", addr, time.Second)
	require.True(t, outbox.IsUnreachable(err), "%v", err)

	cl, sv := net.Pipe()
	defer cl.Close()
	defer sv.Close()
	require.NoError(t, cl.SetReadDeadline(time.Now().Add(10*time.Millisecond)))
	_, err = cl.Read(make([]byte, 1))
	require.True(t, outbox.IsUnreachable(err), "%v", err)
}
