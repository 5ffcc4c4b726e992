// Package mariadbserver starts private MariaDB servers for tests and benchmarks that need
// settings the shared server does not have (the binlog on, in ROW format): a direct child
// of the calling process in a temporary directory, on a free loopback port. Pdeathsig kills
// it with the process that started it.
//
// Support for this repository's own tests and modules ([github.com/outboxgo/outbox/outboxtest]),
// with no compatibility promise.
package mariadbserver

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql" // registers "mysql"

	"github.com/outboxgo/outbox/outboxtest/internal/serverport"
)

// Server is a private MariaDB server.
type Server struct {
	dir    string
	port   int
	args   []string
	cmd    *exec.Cmd
	exited chan struct{}
}

// Binlog are the settings of a server whose binlog a replica (or a log reader) follows:
// ROW format with full row images, server id 1.
var Binlog = []string{"--binlog-format=ROW", "--binlog-row-image=FULL", "--server-id=1"}

// Fast are settings for a server whose durability does not matter to the caller.
var Fast = []string{"--innodb-flush-log-at-trx-commit=2", "--sync-binlog=0"}

// Start initialises a data directory in a temporary directory and starts mariadbd on it
// with the given options (--name=value) after a few defaults (loopback only, root without a
// password, the binlog written to Dir()/binlog, a 32MB buffer pool, 200 connections). It
// fails, saying what is missing, on a machine without MariaDB's server binaries.
func Start(options ...string) (*Server, error) {
	for _, bin := range []string{"mariadb-install-db", "mariadbd"} {
		if _, err := exec.LookPath(bin); err != nil {
			return nil, fmt.Errorf("no %s on PATH: install the mariadb-server package", bin)
		}
	}
	dir, err := os.MkdirTemp("", "outbox-mariadbserver-")
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Server, error) {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	data := filepath.Join(dir, "data")
	install := exec.Command("mariadb-install-db", "--no-defaults", "--datadir="+data,
		"--user=root", "--auth-root-authentication-method=normal", "--skip-test-db")
	if out, err := install.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("mariadb-install-db: %v: %s", err, out))
	}
	s := &Server{dir: dir}
	err = serverport.Start(func(port int) error {
		s.port = port
		s.args = append([]string{"--no-defaults", "--datadir=" + data,
			"--port=" + strconv.Itoa(s.port), "--bind-address=127.0.0.1", "--socket=" + filepath.Join(dir, "mysqld.sock"),
			"--user=root", "--skip-name-resolve", "--innodb-buffer-pool-size=32M", "--max-connections=200",
			"--pid-file=" + filepath.Join(dir, "mysqld.pid"), "--tmpdir=" + dir,
			"--log-bin=" + filepath.Join(dir, "binlog"), "--max-allowed-packet=64M"}, options...)
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

// start starts the server and waits until it answers.
func (s *Server) start() error {
	cmd := exec.Command("mariadbd", s.args...)
	logf, err := os.OpenFile(filepath.Join(s.dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(s.exited) }()
	// Over the server's own socket: on TCP another server may hold the port.
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.Timeout = "root", "unix", filepath.Join(s.dir, "mysqld.sock"), 5*time.Second
	db, err := sql.Open("mysql", cfg.FormatDSN())
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
			return fmt.Errorf("mariadbd exited during start: %s", log)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("mariadbd not ready after 60s: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Restart stops the server, cleanly (SIGTERM) or as a crash would (SIGKILL, recovered from
// the redo log and the binlog at the start), and starts it again on the same port.
func (s *Server) Restart(crash bool) error {
	sig := syscall.SIGTERM
	if crash {
		sig = syscall.SIGKILL
	}
	s.halt(sig)
	return s.start()
}

// halt signals the server and waits until it is gone.
func (s *Server) halt(sig syscall.Signal) {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(60 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
	}
	s.cmd = nil
}

// Stop shuts the server down and removes its directory.
func (s *Server) Stop() {
	s.halt(syscall.SIGTERM)
	_ = os.RemoveAll(s.dir)
}

// DSN is the go-sql-driver/mysql DSN of database db on the server ("" for none), as root.
func (s *Server) DSN(db string) string {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName = "root", "tcp", fmt.Sprintf("127.0.0.1:%d", s.port), db
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = 5*time.Second, 30*time.Second, 30*time.Second
	cfg.InterpolateParams = true
	return cfg.FormatDSN()
}

// Database creates a database for one test and returns its DSN; the test's cleanup drops it.
func (s *Server) Database(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t_%d", time.Now().UnixNano()%1e12)
	adm, err := sql.Open("mysql", s.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	if _, err := adm.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		adm, err := sql.Open("mysql", s.DSN(""))
		if err != nil {
			return
		}
		defer adm.Close()
		if _, err := adm.Exec("DROP DATABASE " + name); err != nil && !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	return s.DSN(name)
}

// Port is the server's loopback port.
func (s *Server) Port() int { return s.port }

// Dir is the server's directory: its data directory is Dir()/data, its binlog files
// Dir()/binlog.*, its log Dir()/server.log.
func (s *Server) Dir() string { return s.dir }
