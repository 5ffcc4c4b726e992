package testdb

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// PgBouncer pooling modes.
const (
	SessionPooling     = "session"
	TransactionPooling = "transaction"
)

// BouncerOptions configure a private PgBouncer ([PgBouncer]).
type BouncerOptions struct {
	// Mode is the pool_mode: [SessionPooling] or [TransactionPooling].
	Mode string
	// Users are the roles clients may log in as (trust); the server DSN's user is always one.
	Users []string
	// PoolSize is the server connections per database and user (default_pool_size);
	// default 20.
	PoolSize int
	// MaxClientConn is how many clients it accepts at once; default 100.
	MaxClientConn int
	// QueryWait is how long a client waits for a server connection (query_wait_timeout);
	// default 120 s.
	QueryWait time.Duration
}

// pgbouncerPath finds Debian's pgbouncer, which lives in /usr/sbin.
func pgbouncerPath() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer", "/usr/local/bin/pgbouncer"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("pgbouncer is not installed")
}

// PgBouncer starts a PgBouncer of its own in front of the PostgreSQL server of
// [PostgresDSN], listening on a free port of 127.0.0.1, stopped when the test ends, and
// returns that server DSN pointed at it (database and user kept, parameters dropped: the
// pooler refuses startup parameters it does not know, such as search_path). It fails t, or
// skips it when OUTBOX_TEST_SKIP names "pgbouncer", when pgbouncer is not installed.
func PgBouncer(t testing.TB, o BouncerOptions) string {
	t.Helper()
	bin, err := pgbouncerPath()
	if err != nil {
		Unavailable(t, "pgbouncer", err)
		return ""
	}
	if _, err := pgAdmin.get(func() (*sql.DB, error) { return sql.Open("pgx", PostgresDSN()) }); err != nil {
		Unavailable(t, "postgres", err)
	}
	server, err := url.Parse(PostgresDSN())
	if err != nil {
		t.Fatalf("OUTBOX_POSTGRES_DSN must be a URL: %v", err)
	}
	host, port := server.Hostname(), server.Port()
	if port == "" {
		port = "5432"
	}
	dbname := strings.TrimPrefix(server.Path, "/")
	users := append([]string{server.User.Username()}, o.Users...)
	o.PoolSize = cmpOr(o.PoolSize, 20)
	o.MaxClientConn = cmpOr(o.MaxClientConn, 100)
	o.QueryWait = cmpOr(o.QueryWait, 120*time.Second)

	dir := t.TempDir()
	// pgbouncer refuses to run as root; as root it is told to become postgres, who must
	// read its files.
	var asUser []string
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("postgres"); err == nil {
			asUser = []string{"-u", "postgres"}
			_ = os.Chmod(dir, 0o755)
		}
	}
	var auth strings.Builder
	for _, u := range users {
		fmt.Fprintf(&auth, "%q \"\"\n", u)
	}
	authFile := filepath.Join(dir, "users.txt")
	if err := os.WriteFile(authFile, []byte(auth.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	for attempt := 0; ; attempt++ {
		listen, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		ini := fmt.Sprintf(`[databases]
%s = host=%s port=%s dbname=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = %d
query_wait_timeout = %d
server_login_retry = 1
log_connections = 0
log_disconnections = 0
`, dbname, host, port, dbname, listen, authFile, o.Mode, o.PoolSize, o.MaxClientConn, int(o.QueryWait/time.Second))
		conf := filepath.Join(dir, "pgbouncer.ini")
		if err := os.WriteFile(conf, []byte(ini), 0o644); err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		cmd := exec.Command(bin, append(asUser, conf)...)
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatalf("start pgbouncer: %v", err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(listen))
		if waitListening(addr, exited) {
			t.Cleanup(func() {
				_ = cmd.Process.Signal(syscall.SIGTERM) // immediate shutdown: its clients are gone
				select {
				case <-exited:
				case <-time.After(10 * time.Second):
					_ = cmd.Process.Kill()
					<-exited
				}
			})
			u := *server
			u.Host = addr
			u.RawQuery = url.Values{"sslmode": {"disable"}}.Encode()
			return u.String()
		}
		_ = cmd.Process.Kill()
		<-exited
		if attempt == 2 {
			t.Fatalf("pgbouncer did not start listening on %s:\n%s", addr, out.String())
		}
	}
}

// waitListening waits until addr accepts a connection, or the process exits, or 10 s pass.
func waitListening(addr string, exited chan error) bool {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			exited <- err
			return false
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			_ = c.Close()
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Role is a login role of a test's own on the shared PostgreSQL server, owning a schema of
// its own that is its default search_path (so it holds through a pooler, which resets
// sessions and refuses search_path as a startup parameter), with the settings given (ALTER
// ROLE ... SET name = value): the DBA's defaults for one application. Both are dropped
// after the test.
type Role struct {
	Name   string
	Schema string
}

// NewRole creates a [Role] with settings, which are name=value pairs such as
// "statement_timeout=2s".
func NewRole(t testing.TB, settings ...string) Role {
	t.Helper()
	adm, err := pgAdmin.get(func() (*sql.DB, error) { return sql.Open("pgx", PostgresDSN()) })
	if err != nil {
		Unavailable(t, "postgres", err)
	}
	name := randomName()
	stmts := []string{
		`CREATE ROLE ` + name + ` LOGIN`,
		`CREATE SCHEMA ` + name + ` AUTHORIZATION ` + name,
		`ALTER ROLE ` + name + ` SET search_path = ` + name,
	}
	for _, kv := range settings {
		k, v, _ := strings.Cut(kv, "=")
		stmts = append(stmts, `ALTER ROLE `+name+` SET `+k+` = '`+strings.ReplaceAll(v, `'`, `''`)+`'`)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// Sessions of the role still open (a pooler's) would keep it from being dropped.
		_, _ = adm.ExecContext(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, name)
		if _, err := adm.ExecContext(ctx, `DROP SCHEMA IF EXISTS `+name+` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
		if _, err := adm.ExecContext(ctx, `DROP ROLE IF EXISTS `+name); err != nil {
			t.Errorf("drop role %s: %v", name, err)
		}
	})
	for _, st := range stmts {
		if _, err := adm.Exec(st); err != nil {
			t.Fatalf("%s: %v", st, err)
		}
	}
	return Role{Name: name, Schema: name}
}

// DSN returns dsn (a PostgreSQL URL) logging in as the role, with params added (key=value).
func (r Role) DSN(dsn string, params ...string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		panic(err)
	}
	u.User = url.User(r.Name)
	q := u.Query()
	for _, kv := range params {
		k, v, _ := strings.Cut(kv, "=")
		q.Set(k, v)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// Open opens a pool on dsn as the role (see [Role.DSN]), closed after the test.
func (r Role) Open(t testing.TB, dsn string, params ...string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", r.DSN(dsn, params...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// Behind returns a pool through a private PgBouncer in mode ([SessionPooling] or
// [TransactionPooling]) onto a fresh schema of the shared PostgreSQL server, with pgx
// parameters params (such as "default_query_exec_mode=exec"), and a pool straight to the
// server on the same schema (as the same role), as a listener past the pooler would use.
// [OpenedDSN] gives either's DSN, and [Reopen] opens another pool like either.
func Behind(t testing.TB, mode string, params ...string) (pooled, direct *sql.DB) {
	t.Helper()
	r := NewRole(t)
	bouncer := PgBouncer(t, BouncerOptions{Mode: mode, Users: []string{r.Name}})
	pooled = r.Open(t, bouncer, params...)
	direct = r.Open(t, PostgresDSN())
	opened.Store(pooled, opening{"pgx", r.DSN(bouncer, params...)})
	opened.Store(direct, opening{"pgx", r.DSN(PostgresDSN())})
	t.Cleanup(func() { opened.Delete(pooled); opened.Delete(direct) })
	return pooled, direct
}

// OpenedDSN returns the DSN that db, a pool this package opened, was opened with.
func OpenedDSN(t testing.TB, db *sql.DB) string {
	t.Helper()
	o, ok := opened.Load(db)
	if !ok {
		t.Fatal("testdb: OpenedDSN needs a pool from testdb.Postgres, testdb.MySQL or testdb.Behind")
	}
	return o.(opening).dsn
}
