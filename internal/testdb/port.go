package testdb

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// portsGiven are the ports FreePort has handed out in this process.
var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// FreePort returns a TCP port of 127.0.0.1 for a private server to listen on: nothing
// listens on it now, and it lies below the kernel's ephemeral range, where neither
// outgoing connections nor listeners on port 0 are given ports, so it stays free through
// the seconds a server takes to start. A port from the ephemeral range can be taken in
// that time, and the server then fails to bind. No port is handed out twice in a process.
func FreePort() (int, error) {
	top := ephemeralStart()
	bottom := max(top-12000, 1024)
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 200 {
		port := bottom + rand.IntN(top-bottom)
		if portsGiven[port] {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		_ = l.Close()
		portsGiven[port] = true
		return port, nil
	}
	return 0, fmt.Errorf("no free port in [%d, %d)", bottom, top)
}

// ephemeralStart returns the first port of the kernel's ephemeral range (Linux's default
// when it cannot be read).
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 2024 {
				return n
			}
		}
	}
	return 32768
}
