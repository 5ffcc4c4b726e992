package outboxpglog

import (
	"database/sql"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"

	"github.com/outboxgo/outbox/outboxtest/pgserver"
)

// A private PostgreSQL with wal_level = logical (outboxtest/pgserver), shared by the
// package's tests: started on first use, stopped by TestMain.

type pgServer struct{ *pgserver.Server }

var (
	serversMu sync.Mutex
	servers   = map[string]*pgServer{} // by settings
)

func TestMain(m *testing.M) {
	code := m.Run()
	serversMu.Lock()
	for _, s := range servers {
		s.Stop()
	}
	serversMu.Unlock()
	os.Exit(code)
}

// server returns the package's private server with wal_level=logical, starting it on
// first use; a machine without PostgreSQL's binaries fails the test, saying what is missing.
func server(t testing.TB) *pgServer { return serverWith(t, "wal_level=logical") }

// serverWith returns the package's private server with the given settings (name=value
// pairs for postgres -c), starting it on first use. A test that needs a setting that would
// disturb others gets a server of its own this way.
func serverWith(t testing.TB, settings ...string) *pgServer {
	t.Helper()
	key := strings.Join(settings, " ")
	serversMu.Lock()
	defer serversMu.Unlock()
	if s, ok := servers[key]; ok {
		return s
	}
	s, err := pgserver.Start(append(slices.Clone(pgserver.Fast), settings...)...)
	if err != nil {
		t.Fatalf("private PostgreSQL with %s: %v", key, err)
	}
	servers[key] = &pgServer{s}
	return servers[key]
}

// restart stops the server, cleanly or as a crash would, and starts it again.
func (s *pgServer) restart(t testing.TB, crash bool) {
	t.Helper()
	if err := s.Restart(crash); err != nil {
		t.Fatalf("restart: %v", err)
	}
}

func (s *pgServer) dsn(db string) string { return s.DSN(db) }

// database creates a database for one test and returns its DSN; the test's cleanup drops
// it and the replication slots in it.
func (s *pgServer) database(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t_%d", time.Now().UnixNano())
	adm, err := sql.Open("pgx", s.dsn("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	if _, err := adm.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		adm, err := sql.Open("pgx", s.dsn("postgres"))
		if err != nil {
			return
		}
		defer adm.Close()
		// A reader's walsender outlives its client's close by a moment, and keeps its
		// slot active until it exits.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			var active int
			if err := adm.QueryRow(`SELECT count(*) FROM pg_replication_slots WHERE database = $1 AND active`, name).Scan(&active); err != nil || active == 0 {
				break
			}
		}
		_, _ = adm.Exec(`SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1 AND NOT active`, name)
		if _, err := adm.Exec("DROP DATABASE " + name + " WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	return s.dsn(name)
}
