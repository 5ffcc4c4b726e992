package outbox

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
)

// IsUnreachable reports whether err is a network error saying that a server could not be
// reached or went away: a refused, reset, aborted or closed connection, a broken pipe, an
// end of stream before the answer, a dial that failed (DNS included), or a read or write
// deadline that passed on the socket. A cancelled context is never an outage (it is the
// caller giving up), even when it interrupted a dial.
//
// A [Transport] marks such errors with [Unavailable], so that every transport draws the line
// between an outage and a message's own failure in the same place:
//
//	if outbox.IsUnreachable(err) {
//		err = outbox.Unavailable(err)
//	}
func IsUnreachable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) ||
		errors.Is(err, syscall.ETIMEDOUT) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true // whatever the cause: a timeout, no route, a name that does not resolve
	}
	var dns *net.DNSError
	return errors.As(err, &dns)
}
