// Package serveraddr splits the addresses the transports are configured with into the host
// and port that telemetry reports as server.address and server.port
// ([outbox.Destination]).
package serveraddr

import (
	"net"
	"net/url"
	"strconv"
)

// FromURL returns the host and port of a URL such as "nats://host:4222" or
// "https://hooks.example.com/x"; the port is defaultPort[scheme] when the URL has none, and
// 0 when that is unknown too. It returns "", 0 for a URL it cannot parse.
func FromURL(raw string, defaultPort map[string]int) (host string, port int) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "", 0
	}
	port, err = strconv.Atoi(u.Port())
	if err != nil {
		port = defaultPort[u.Scheme]
	}
	return u.Hostname(), port
}

// FromHostPort returns the host and port of "host:port", or addr itself and defaultPort when
// it has no port.
func FromHostPort(addr string, defaultPort int) (host string, port int) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return addr, defaultPort
	}
	if port, err = strconv.Atoi(p); err != nil {
		port = defaultPort
	}
	return h, port
}
