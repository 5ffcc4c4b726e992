package outboxpglog

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
)

// A private PostgreSQL with wal_level = logical, a direct child of the test process in a
// temporary directory on a free loopback port, shared by the package's tests: started on
// first use, stopped by TestMain. Pdeathsig kills it with the test process.

type pgServer struct {
	dir    string
	port   int
	cred   *syscall.Credential // PostgreSQL refuses to run as root
	bin    string
	args   []string
	cmd    *exec.Cmd
	exited chan struct{}
}

var (
	serversMu sync.Mutex
	servers   = map[string]*pgServer{} // by settings
)

func TestMain(m *testing.M) {
	code := m.Run()
	serversMu.Lock()
	for _, s := range servers {
		s.stop()
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
	s, err := startServer(settings)
	if err != nil {
		t.Fatalf("private PostgreSQL with %s: %v", key, err)
	}
	servers[key] = s
	return s
}

// pgBin returns the newest installed PostgreSQL's bin directory.
func pgBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi < vj
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	return "", fmt.Errorf("no initdb in /usr/lib/postgresql/*/bin: install the PostgreSQL server package")
}

func startServer(settings []string) (*pgServer, error) {
	bin, err := pgBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "outboxpglog-")
	if err != nil {
		return nil, err
	}
	s := &pgServer{dir: dir}
	fail := func(err error) (*pgServer, error) {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return fail(fmt.Errorf("running as root needs a postgres user to run the server as: %w", err))
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return fail(err)
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb: %v: %s", err, out))
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	s.port = l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	args := []string{"-D", data, "-p", strconv.Itoa(s.port), "-k", dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "max_replication_slots=20",
		"-c", "max_wal_senders=20", "-c", "max_connections=100", "-c", "shared_buffers=32MB",
		// fsync off for speed; synchronous_commit stays on: the server decodes only WAL
		// that is flushed, so a lazy commit would reach the reader up to wal_writer_delay late.
		"-c", "fsync=off", "-c", "logging_collector=off"}
	for _, kv := range settings {
		args = append(args, "-c", kv)
	}
	s.bin, s.args = bin, args
	if err := s.start(); err != nil {
		s.stop()
		return fail(err)
	}
	return s, nil
}

// start starts the server and waits until it answers.
func (s *pgServer) start() error {
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), s.args...)
	logf, err := os.OpenFile(filepath.Join(s.dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(s.exited) }()
	db, err := sql.Open("pgx", s.dsn("postgres"))
	if err != nil {
		return err
	}
	defer db.Close()
	for deadline := time.Now().Add(60 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err = db.PingContext(ctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.exited:
			log, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
			return fmt.Errorf("postgres exited during start: %s", log)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres not ready after 60s: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// restart stops the server, cleanly (a fast shutdown) or as a crash would (an immediate
// shutdown, recovered from the WAL at the start), and starts it again on the same port.
func (s *pgServer) restart(t testing.TB, crash bool) {
	t.Helper()
	sig := syscall.SIGINT
	if crash {
		sig = syscall.SIGQUIT
	}
	s.halt(sig)
	if err := s.start(); err != nil {
		t.Fatalf("restart: %v", err)
	}
}

// halt signals the server and waits until it and its backends are gone.
func (s *pgServer) halt(sig syscall.Signal) {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
	}
	for deadline := time.Now().Add(30 * time.Second); syscall.Kill(-s.cmd.Process.Pid, 0) == nil && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	s.cmd = nil
}

// stop shuts the server down (fast mode) and removes its directory.
func (s *pgServer) stop() {
	s.halt(syscall.SIGINT)
	_ = os.RemoveAll(s.dir)
}

func (s *pgServer) dsn(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable&connect_timeout=5", s.port, db)
}

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
