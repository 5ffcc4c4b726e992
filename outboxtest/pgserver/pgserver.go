// Package pgserver starts private PostgreSQL servers for tests and benchmarks that need
// settings the shared server cannot take without a restart (wal_level=logical, say): a
// direct child of the calling process in a temporary directory, on a free loopback port.
// Pdeathsig kills it with the process that started it.
//
// Support for this repository's own tests and modules ([github.com/outboxgo/outbox/outboxtest]),
// with no compatibility promise.
package pgserver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"

	"github.com/outboxgo/outbox/outboxtest/internal/serverport"
)

// Server is a private PostgreSQL server.
type Server struct {
	dir    string
	port   int
	cred   *syscall.Credential // PostgreSQL refuses to run as root
	bin    string
	args   []string
	cmd    *exec.Cmd
	exited chan struct{}
}

// Fast are settings for a server whose durability does not matter to the caller: fsync off.
// synchronous_commit stays on, because logical decoding reads only flushed WAL and a lazy
// commit would reach a log reader up to wal_writer_delay late.
var Fast = []string{"fsync=off"}

// Start initialises a cluster in a temporary directory and starts it with the given
// settings (name=value pairs for postgres -c) after a few defaults (loopback only, 20
// replication slots and WAL senders, 100 connections, shared_buffers 32MB). It fails, saying
// what is missing, on a machine without PostgreSQL's server binaries.
func Start(settings ...string) (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "outbox-pgserver-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, bin: bin}
	fail := func(err error) (*Server, error) {
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
	err = serverport.Start(func(port int) error {
		s.port = port
		s.args = []string{"-D", data, "-p", strconv.Itoa(s.port), "-k", dir,
			"-c", "listen_addresses=127.0.0.1", "-c", "max_replication_slots=20",
			"-c", "max_wal_senders=20", "-c", "max_connections=100", "-c", "shared_buffers=32MB",
			"-c", "logging_collector=off"}
		for _, kv := range settings {
			s.args = append(s.args, "-c", kv)
		}
		err := s.start()
		if err != nil {
			s.halt(syscall.SIGKILL)
		}
		return err
	})
	if err != nil {
		return fail(err)
	}
	return s, nil
}

// binDir returns the newest installed PostgreSQL's bin directory.
func binDir() (string, error) {
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
	return "", errors.New("no initdb in /usr/lib/postgresql/*/bin: install the PostgreSQL server package")
}

// start starts the server and waits until it answers.
func (s *Server) start() error {
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
	// Over the server's own socket: on TCP another server may hold the port.
	db, err := sql.Open("pgx", fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable connect_timeout=5", s.dir, s.port))
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

// Restart stops the server, cleanly (a fast shutdown) or as a crash would (an immediate
// shutdown, recovered from the WAL at the start), and starts it again on the same port.
func (s *Server) Restart(crash bool) error {
	sig := syscall.SIGINT
	if crash {
		sig = syscall.SIGQUIT
	}
	s.halt(sig)
	return s.start()
}

// halt signals the server and waits until it and its backends are gone.
func (s *Server) halt(sig syscall.Signal) {
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

// Stop shuts the server down (fast mode) and removes its directory.
func (s *Server) Stop() {
	s.halt(syscall.SIGINT)
	_ = os.RemoveAll(s.dir)
}

// DSN is the URL of database db on the server, as the postgres superuser.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable&connect_timeout=5", s.port, db)
}

// Port is the server's loopback port.
func (s *Server) Port() int { return s.port }

// Dir is the server's directory: its data directory is Dir()/data, its log Dir()/server.log.
func (s *Server) Dir() string { return s.dir }
