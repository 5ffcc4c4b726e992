package outboxbinlog

import (
	"os"
	"slices"
	"sync"
	"testing"

	"github.com/outboxgo/outbox/outboxtest/mariadbserver"
)

// A private MariaDB with the binlog on, ROW format (outboxtest/mariadbserver), shared by
// the package's tests: started on first use, stopped by TestMain.

type myServer struct{ *mariadbserver.Server }

var (
	serverMu sync.Mutex
	private  *myServer
)

func TestMain(m *testing.M) {
	code := m.Run()
	serverMu.Lock()
	if private != nil {
		private.Stop()
	}
	serverMu.Unlock()
	os.Exit(code)
}

// privateServer returns the package's private server, starting it on first use; a machine
// without MariaDB's binaries fails the test, saying what is missing.
func privateServer(t testing.TB) *myServer {
	t.Helper()
	serverMu.Lock()
	defer serverMu.Unlock()
	if private != nil {
		return private
	}
	s, err := mariadbserver.Start(append(slices.Clone(mariadbserver.Binlog), mariadbserver.Fast...)...)
	if err != nil {
		t.Fatalf("private MariaDB with the binlog on: %v", err)
	}
	private = &myServer{s}
	return private
}

// restart stops the server, cleanly or as a crash would, and starts it again on the same
// port.
func (s *myServer) restart(t testing.TB, crash bool) {
	t.Helper()
	if err := s.Restart(crash); err != nil {
		t.Fatalf("restart: %v", err)
	}
}

func (s *myServer) database(t testing.TB) string { return s.Database(t) }
