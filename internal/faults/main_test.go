package faults

import (
	"fmt"
	"io"
	"log"
	"os"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// TestMain runs the suite only when OUTBOX_FAULTS=1: it restarts servers and kills
// connections, so it has its own make target (make test-faults) instead of running with
// every package's tests. It stops the private servers when the tests end.
func TestMain(m *testing.M) {
	if os.Getenv("OUTBOX_FAULTS") != "1" {
		fmt.Println("faults: set OUTBOX_FAULTS=1 (make test-faults) to run the fault-injection suite")
		os.Exit(0)
	}
	// The MySQL driver logs every connection the tests kill; the tests count them instead.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	code := m.Run()
	stopPrivate()
	os.Exit(code)
}
