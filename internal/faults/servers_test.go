package faults

import (
	"context"
	"database/sql"
	"fmt"
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

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"

	"github.com/outboxgo/outbox/internal/testdb"
)

// server is a private database server, a direct child of the test process, in a temporary
// directory and on a free loopback port. Pdeathsig kills it with the test process, so a
// test binary that panics or is killed does not leave it behind.
type server struct {
	backend string // "postgres" or "mysql"
	dir     string
	port    int
	cred    *syscall.Credential // the user the server runs as (PostgreSQL refuses root)
	args    []string            // more command-line arguments

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// Private servers are shared by the tests of one run, started on first use and stopped by
// TestMain.
var (
	privMu      sync.Mutex
	privServers = map[string]*server{}
)

// private returns the run's private server for backend, starting it on first use.
func private(t testing.TB, backend string) *server {
	t.Helper()
	privMu.Lock()
	defer privMu.Unlock()
	if s, ok := privServers[backend]; ok {
		if err := s.ensureRunning(); err != nil {
			t.Fatalf("private %s: %v", backend, err)
		}
		return s
	}
	s, err := newServer(backend)
	if err != nil {
		t.Fatalf("private %s: %v", backend, err)
	}
	privServers[backend] = s
	return s
}

// stopPrivate stops every private server and removes its directory.
func stopPrivate() {
	privMu.Lock()
	defer privMu.Unlock()
	for name, s := range privServers {
		_ = s.stop(false)
		_ = os.RemoveAll(s.dir)
		delete(privServers, name)
	}
}

// pgBin returns the newest installed PostgreSQL's bin directory.
func pgBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	if len(dirs) == 0 {
		return "", fmt.Errorf("no /usr/lib/postgresql/*/bin")
	}
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi < vj
	})
	return dirs[len(dirs)-1], nil
}

// newServer initialises a data directory and starts a server on it with the given extra
// command-line arguments.
func newServer(backend string, args ...string) (*server, error) {
	return newServerAs(backend, "", args...)
}

// newServerAs is newServer with MariaDB run as the system user osUser when the test runs
// as root (Galera's rsync state transfer runs its daemon as the server's user, and as
// root that daemon would drop to nobody).
func newServerAs(backend, osUser string, args ...string) (*server, error) {
	dir, err := os.MkdirTemp("", "outbox-faults-"+backend+"-")
	if err != nil {
		return nil, err
	}
	port, err := testdb.FreePort()
	if err != nil {
		return nil, err
	}
	s := &server{backend: backend, dir: dir, port: port, args: args}
	fail := func(err error) (*server, error) {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	switch backend {
	case "postgres":
		u, err := user.Lookup("postgres")
		if err != nil {
			return fail(err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if os.Geteuid() == 0 {
			s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
			if err := os.Chown(dir, uid, gid); err != nil {
				return fail(err)
			}
		}
		bin, err := pgBin()
		if err != nil {
			return fail(err)
		}
		cmd := exec.Command(filepath.Join(bin, "initdb"), "-D", filepath.Join(dir, "data"),
			"-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fail(fmt.Errorf("initdb: %v: %s", err, out))
		}
	case "mysql":
		cmd := exec.Command("mariadb-install-db", "--no-defaults", "--datadir="+filepath.Join(dir, "data"),
			"--user=root", "--auth-root-authentication-method=normal", "--skip-test-db")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fail(fmt.Errorf("mariadb-install-db: %v: %s", err, out))
		}
		if osUser != "" && os.Geteuid() == 0 {
			u, err := user.Lookup(osUser)
			if err != nil {
				return fail(err)
			}
			uid, _ := strconv.Atoi(u.Uid)
			gid, _ := strconv.Atoi(u.Gid)
			s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
			err = filepath.Walk(dir, func(path string, _ os.FileInfo, err error) error {
				if err != nil {
					return err
				}
				return os.Lchown(path, uid, gid)
			})
			if err != nil {
				return fail(err)
			}
		}
	default:
		return fail(fmt.Errorf("unknown backend %q", backend))
	}
	if err := s.start(); err != nil {
		_ = s.stop(true)
		return fail(err)
	}
	return s, nil
}

// command returns the server's command line.
func (s *server) command() (*exec.Cmd, error) {
	data := filepath.Join(s.dir, "data")
	switch s.backend {
	case "postgres":
		bin, err := pgBin()
		if err != nil {
			return nil, err
		}
		return exec.Command(filepath.Join(bin, "postgres"), append([]string{"-D", data, "-p", strconv.Itoa(s.port),
			"-k", s.dir, "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200",
			"-c", "shared_buffers=32MB", "-c", "logging_collector=off"}, s.args...)...), nil
	default:
		return exec.Command("mariadbd", append([]string{"--no-defaults", "--datadir=" + data, "--port=" + strconv.Itoa(s.port),
			"--bind-address=127.0.0.1", "--socket=" + filepath.Join(s.dir, "mysqld.sock"), "--user=root",
			"--skip-log-bin", "--skip-name-resolve", "--innodb-buffer-pool-size=64M", "--max-connections=300",
			"--pid-file=" + filepath.Join(s.dir, "mysqld.pid"),
			// A tmpdir of its own: at start MariaDB deletes the #sql temporary files it
			// finds in its tmpdir, and /tmp is the shared server's.
			"--tmpdir=" + s.dir}, s.args...)...), nil
	}
}

// start starts the server and waits until it accepts queries.
func (s *server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return fmt.Errorf("%s already running", s.backend)
	}
	cmd, err := s.command()
	if err != nil {
		return err
	}
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
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.cmd, s.exited = cmd, exited

	db, err := sql.Open(s.driver(), s.dsn("", ""))
	if err != nil {
		return err
	}
	defer db.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err = db.PingContext(ctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("%s exited during start: %s", s.backend, s.logTail())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after 60s: %v: %s", s.backend, err, s.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop stops the server: a clean shutdown, or when crash is set a crash (PostgreSQL's
// immediate mode, which skips the checkpoint and recovers from the WAL at the next start;
// SIGKILL for MariaDB, which recovers from the InnoDB redo log).
func (s *server) stop(crash bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	sig := syscall.SIGINT // PostgreSQL: fast shutdown
	switch {
	case s.backend == "postgres" && crash:
		sig = syscall.SIGQUIT // immediate shutdown
	case s.backend == "mysql" && crash:
		sig = syscall.SIGKILL
	case s.backend == "mysql":
		sig = syscall.SIGTERM
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(60 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
	}
	if s.backend == "postgres" {
		// The postmaster is gone; wait for its backends so the next start finds the
		// shared memory free.
		deadline := time.Now().Add(30 * time.Second)
		for syscall.Kill(-s.cmd.Process.Pid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
	s.cmd, s.exited = nil, nil
	return nil
}

// ensureRunning starts the server if a test stopped it and did not start it again.
func (s *server) ensureRunning() error {
	s.mu.Lock()
	running := s.cmd != nil
	s.mu.Unlock()
	if running {
		return nil
	}
	return s.start()
}

func (s *server) driver() string {
	if s.backend == "postgres" {
		return "pgx"
	}
	return "mysql"
}

// dsn returns a DSN for database db ("" for the server's default) with the application
// name app on PostgreSQL (MariaDB has none; its connections are told apart by database).
func (s *server) dsn(db, app string) string {
	if s.backend == "postgres" {
		if db == "" {
			db = "postgres"
		}
		d := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable&connect_timeout=5", s.port, db)
		if app != "" {
			d += "&application_name=" + app
		}
		return d
	}
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName = "root", "tcp", fmt.Sprintf("127.0.0.1:%d", s.port), db
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = 5*time.Second, 30*time.Second, 30*time.Second
	return cfg.FormatDSN()
}

// createDatabase creates a database for one test and returns its name; it is dropped when
// the test ends.
func (s *server) createDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("faults_%d", time.Now().UnixNano()%1e12)
	adm, err := sql.Open(s.driver(), s.dsn("", "faults_admin"))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	if _, err := adm.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		if err := s.ensureRunning(); err != nil {
			t.Errorf("restart %s: %v", s.backend, err)
			return
		}
		adm, err := sql.Open(s.driver(), s.dsn("", "faults_admin"))
		if err != nil {
			return
		}
		defer adm.Close()
		drop := "DROP DATABASE " + name
		if s.backend == "postgres" {
			drop += " WITH (FORCE)"
		}
		if _, err := adm.Exec(drop); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	return name
}

// logTail returns the end of the server's log.
func (s *server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}
