// Package testproxy is a loopback TCP proxy for outage tests: clients dial the proxy, which
// forwards to a real server. Cut drops every connection and refuses new ones, as a server
// that went away; Blackhole keeps every connection open but forwards no byte and accepts new
// connections without ever answering, as a stalled server or a network partition without
// resets; Restore lets everything through again. Tests use it to take a broker or a
// database away from one client without stopping the server that other tests share.
//
// Support for this repository's own tests and modules ([github.com/outboxgo/outbox/outboxtest]),
// with no compatibility promise.
package testproxy

import (
	"errors"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy forwards connections from Addr to a target address.
type Proxy struct {
	target string
	ln     net.Listener

	mu     sync.Mutex
	flow   *sync.Cond // signalled when forwarding may resume or the proxy closes
	cut    bool
	hole   bool
	closed bool
	conns  map[net.Conn]struct{}
	held   map[net.Conn]struct{} // accepted during a blackhole, never forwarded
	wg     sync.WaitGroup
}

// New starts a proxy to target on a free loopback port and stops it when t ends.
func New(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testproxy: listen: %v", err)
	}
	p := &Proxy{target: target, ln: ln, conns: map[net.Conn]struct{}{}, held: map[net.Conn]struct{}{}}
	p.flow = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every open connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut, p.hole = true, false
	p.closeAll()
}

// Blackhole stops forwarding until Restore: open connections stay open with their bytes held
// back, and new connections are accepted and held without a byte in either direction.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	p.cut, p.hole = false, true
	p.mu.Unlock()
}

// Restore lets connections through again: bytes held back by a blackhole flow on, as after
// a partition heals, and the connections accepted during it, which never reached the
// server, are closed.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut, p.hole = false, false
	for c := range p.held {
		_ = c.Close()
		delete(p.held, c)
	}
	p.flow.Broadcast()
	p.mu.Unlock()
}

// Flap cuts the connections every period, each cut lasting half of it, until stop is
// closed, and leaves the proxy restored. It returns at once; the flapping ends with stop.
func (p *Proxy) Flap(period time.Duration, stop <-chan struct{}) (done <-chan struct{}) {
	d := make(chan struct{})
	go func() {
		defer close(d)
		defer p.Restore()
		for {
			p.Cut()
			select {
			case <-stop:
				return
			case <-time.After(period / 2):
			}
			p.Restore()
			select {
			case <-stop:
				return
			case <-time.After(period / 2):
			}
		}
	}()
	return d
}

// closeAll closes every connection; p.mu is held.
func (p *Proxy) closeAll() {
	for c := range p.conns {
		_ = c.Close()
	}
	for c := range p.held {
		_ = c.Close()
		delete(p.held, c)
	}
	p.flow.Broadcast()
}

func (p *Proxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed = true
	p.closeAll()
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.mu.Lock()
		switch {
		case p.cut || p.closed:
			p.mu.Unlock()
			_ = c.Close()
			continue
		case p.hole:
			p.held[c] = struct{}{}
			p.mu.Unlock()
			continue
		}
		p.mu.Unlock()
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.cut || p.closed {
			p.mu.Unlock()
			_ = c.Close()
			_ = up.Close()
			continue
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

// pipe copies from src to dst, holding each chunk back while the proxy is a blackhole,
// until either side closes, then closes both.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.hole && !p.closed {
				p.flow.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}
