package outboxbinlog

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// A private MariaDB with the binlog on (ROW format), a direct child of the test process in
// a temporary directory on a free loopback port, shared by the package's tests: started on
// first use, stopped by TestMain. Pdeathsig kills it with the test process.

type myServer struct {
	dir    string
	port   int
	cmd    *exec.Cmd
	exited chan struct{}
}

var (
	serverMu sync.Mutex
	private  *myServer
)

func TestMain(m *testing.M) {
	code := m.Run()
	serverMu.Lock()
	if private != nil {
		private.halt(syscall.SIGTERM)
		_ = os.RemoveAll(private.dir)
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
	s, err := startServer()
	if err != nil {
		t.Fatalf("private MariaDB with the binlog on (install mariadb-server): %v", err)
	}
	private = s
	return s
}

func startServer() (*myServer, error) {
	dir, err := os.MkdirTemp("", "outboxbinlog-")
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*myServer, error) {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	install := exec.Command("mariadb-install-db", "--no-defaults", "--datadir="+filepath.Join(dir, "data"),
		"--user=root", "--auth-root-authentication-method=normal", "--skip-test-db")
	if out, err := install.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("mariadb-install-db: %v: %s", err, out))
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	s := &myServer{dir: dir, port: l.Addr().(*net.TCPAddr).Port}
	_ = l.Close()
	if err := s.start(); err != nil {
		s.halt(syscall.SIGKILL)
		return fail(err)
	}
	return s, nil
}

// start starts the server and waits until it answers.
func (s *myServer) start() error {
	cmd := exec.Command("mariadbd", "--no-defaults", "--datadir="+filepath.Join(s.dir, "data"),
		"--port="+strconv.Itoa(s.port), "--bind-address=127.0.0.1", "--socket="+filepath.Join(s.dir, "mysqld.sock"),
		"--user=root", "--skip-name-resolve", "--innodb-buffer-pool-size=32M", "--max-connections=200",
		"--pid-file="+filepath.Join(s.dir, "mysqld.pid"), "--tmpdir="+s.dir,
		"--log-bin="+filepath.Join(s.dir, "binlog"), "--binlog-format=ROW", "--binlog-row-image=FULL",
		"--server-id=1", "--max-allowed-packet=64M",
		// Durability is not what these tests are about; speed is.
		"--innodb-flush-log-at-trx-commit=2", "--sync-binlog=0")
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
	db, err := sql.Open("mysql", s.dsn(""))
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

// restart stops the server, cleanly or as a crash would (SIGKILL, recovered from the redo
// log and the binlog at the start), and starts it again on the same port.
func (s *myServer) restart(t testing.TB, crash bool) {
	t.Helper()
	sig := syscall.SIGTERM
	if crash {
		sig = syscall.SIGKILL
	}
	s.halt(sig)
	if err := s.start(); err != nil {
		t.Fatalf("restart: %v", err)
	}
}

// halt signals the server and waits until it is gone.
func (s *myServer) halt(sig syscall.Signal) {
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

func (s *myServer) dsn(db string) string {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName = "root", "tcp", fmt.Sprintf("127.0.0.1:%d", s.port), db
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = 5*time.Second, 30*time.Second, 30*time.Second
	cfg.InterpolateParams = true
	return cfg.FormatDSN()
}

// database creates a database for one test and returns its DSN; the test's cleanup drops it.
func (s *myServer) database(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t_%d", time.Now().UnixNano()%1e12)
	adm, err := sql.Open("mysql", s.dsn(""))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	if _, err := adm.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		adm, err := sql.Open("mysql", s.dsn(""))
		if err != nil {
			return
		}
		defer adm.Close()
		if _, err := adm.Exec("DROP DATABASE " + name); err != nil && !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	return s.dsn(name)
}
