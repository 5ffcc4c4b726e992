package outboxamqp_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/transport/amqp"
)

// freezer is a loopback TCP proxy that can stop forwarding without closing anything, as a
// broker that hangs or a network that blackholes packets: the client's writes then block
// once the socket buffers are full.
type freezer struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	frozen bool
	cond   *sync.Cond
	conns  []net.Conn
	closed bool
	wg     sync.WaitGroup
}

func newFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &freezer{ln: ln, target: target}
	f.cond = sync.NewCond(&f.mu)
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(f.close)
	return f
}

func (f *freezer) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", f.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		f.mu.Lock()
		f.conns = append(f.conns, c, up)
		f.mu.Unlock()
		f.wg.Add(2)
		go f.pipe(up, c)
		go f.pipe(c, up)
	}
}

func (f *freezer) pipe(dst, src net.Conn) {
	defer f.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		f.mu.Lock()
		for f.frozen && !f.closed {
			f.cond.Wait()
		}
		closed := f.closed
		f.mu.Unlock()
		if closed || err != nil {
			_ = dst.Close()
			_ = src.Close()
			return
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			_ = src.Close()
			return
		}
	}
}

func (f *freezer) freeze() {
	f.mu.Lock()
	f.frozen = true
	f.mu.Unlock()
}

func (f *freezer) close() {
	_ = f.ln.Close()
	f.mu.Lock()
	f.closed = true
	for _, c := range f.conns {
		_ = c.Close()
	}
	f.cond.Broadcast()
	f.mu.Unlock()
	f.wg.Wait()
}

// frozenSetup returns a broker fixture, a freezer in front of it, and a transport that
// publishes through the freezer, after one message went through.
func frozenSetup(t *testing.T) (*broker, *freezer, *outboxamqp.Transport) {
	t.Helper()
	b := setup(t, "#", nil)
	u, err := url.Parse(b.url)
	require.NoError(t, err)
	f := newFreezer(t, u.Host)
	u.Host = f.ln.Addr().String()
	tr := newTransport(t, outboxamqp.Options{URL: u.String()})
	require.Empty(t, nonNil(tr.Publish(context.Background(), []outbox.Delivery{delivery(b.exchange, "t", `{"n":0}`)})))
	b.waitFor(t, 1, 10*time.Second)
	return b, f, tr
}

// TestPublishFrozenBroker: a broker that stops answering mid-publish, without closing the
// connection, cannot hold Publish past its context, even with writes blocked on a full
// socket; the next Publish dials again instead of reusing the hung connection.
func TestPublishFrozenBroker(t *testing.T) {
	t.Parallel()
	b, f, tr := frozenSetup(t)

	f.freeze()
	big := `"` + strings.Repeat("x", 1<<20) + `"`
	batch := make([]outbox.Delivery, 40) // 40 MiB: more than the socket buffers hold
	for i := range batch {
		batch[i] = delivery(b.exchange, "t", big)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan []error, 1)
	go func() { done <- tr.Publish(ctx, batch) }()
	var errs []error
	select {
	case errs = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Publish outlived its context by seconds")
	}
	for i, err := range errs {
		require.Error(t, err, "message %d", i)
		require.False(t, outbox.IsPermanent(err))
		require.True(t, errors.Is(err, outboxamqp.ErrConnectionLost) || errors.Is(err, context.DeadlineExceeded), "%v", err)
	}

	// The hung connection is gone: a new Publish dials through the (still frozen) proxy
	// and fails within its own context, not on the old connection.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	start := time.Now()
	err := tr.Publish(ctx2, []outbox.Delivery{delivery(b.exchange, "t", `{}`)})[0]
	require.Less(t, time.Since(start), 5*time.Second)
	require.ErrorIs(t, err, outboxamqp.ErrNotConnected)
}

// TestPublishFrozenExchangeCheck: a broker that stops answering while the transport checks
// that an exchange exists cannot hold Publish past its context either.
func TestPublishFrozenExchangeCheck(t *testing.T) {
	t.Parallel()
	_, f, tr := frozenSetup(t)

	f.freeze()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan []error, 1)
	go func() { done <- tr.Publish(ctx, []outbox.Delivery{delivery("outbox_t_never_checked", "t", `{}`)}) }()
	select {
	case errs := <-done:
		require.ErrorIs(t, errs[0], outboxamqp.ErrConnectionLost)
		require.False(t, outbox.IsPermanent(errs[0]))
	case <-time.After(5 * time.Second):
		t.Fatal("Publish outlived its context by seconds")
	}
}
