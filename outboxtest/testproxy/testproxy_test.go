package testproxy_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox/outboxtest/testproxy"
)

// echo starts a loopback server that writes back every line it reads.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

// roundTrip writes a line on c and reads it back within d.
func roundTrip(c net.Conn, r *bufio.Reader, d time.Duration) error {
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := r.ReadString('\n')
	return err
}

func TestBlackholeHoldsBytesUntilRestore(t *testing.T) {
	p := testproxy.New(t, echo(t))
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()
	r := bufio.NewReader(c)
	require.NoError(t, roundTrip(c, r, time.Second))

	p.Blackhole()
	require.ErrorIs(t, roundTrip(c, r, 200*time.Millisecond), os.ErrDeadlineExceeded, "a byte went through the blackhole")
	held, err := net.Dial("tcp", p.Addr()) // accepted, never answered
	require.NoError(t, err)
	defer held.Close()
	hr := bufio.NewReader(held)
	require.ErrorIs(t, roundTrip(held, hr, 200*time.Millisecond), os.ErrDeadlineExceeded)

	p.Restore()
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	line, err := r.ReadString('\n') // the line held back arrives
	require.NoError(t, err)
	require.Equal(t, "ping\n", line)
	_ = held.SetReadDeadline(time.Now().Add(time.Second))
	_, err = hr.ReadString('\n')
	require.True(t, errors.Is(err, io.EOF) || isReset(err), "a connection held by the blackhole is closed at restore: %v", err)
}

func TestCutClosesAndRefuses(t *testing.T) {
	p := testproxy.New(t, echo(t))
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()
	r := bufio.NewReader(c)
	require.NoError(t, roundTrip(c, r, time.Second))

	p.Cut()
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	_, err = r.ReadString('\n')
	require.Error(t, err, "the connection survived the cut")
	again, err := net.Dial("tcp", p.Addr())
	if err == nil {
		defer again.Close()
		require.Error(t, roundTrip(again, bufio.NewReader(again), time.Second), "a new connection got through the cut")
	}

	p.Restore()
	c2, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c2.Close()
	require.NoError(t, roundTrip(c2, bufio.NewReader(c2), time.Second))
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}
