// Package serverport starts private database servers on free loopback ports.
package serverport

import (
	"net"
	"strings"
)

// Start calls start with a port that nothing listens on, until it succeeds or fails for a
// reason other than the port: a port that was free a moment ago can be given to an
// outgoing connection or another listener before the server binds it, and the server then
// fails with "Address already in use". It tries three ports at most.
func Start(start func(port int) error) error {
	for try := 1; ; try++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		err = start(port)
		if err == nil || try == 3 || !strings.Contains(err.Error(), "Address already in use") {
			return err
		}
	}
}
