// Package testdb gives tests a fresh, isolated, empty database per call on each backend:
// a schema on PostgreSQL, a database on MariaDB/MySQL, a file on SQLite. Each is dropped
// when the test ends.
//
// Server addresses come from OUTBOX_POSTGRES_DSN and OUTBOX_MYSQL_DSN, with local
// defaults. Every backend and broker is required: when a server is unreachable its tests
// fail, saying which server and how to start it. A contributor without one server may skip
// its tests on purpose by naming it in OUTBOX_TEST_SKIP ("postgres", "mysql", "nats",
// "rabbitmq", "redis", "browser" for the web view's chromium test, "promtool" for the alert
// rules' tests, "node" for the CloudEvents check with the JavaScript SDK, a comma list, or
// "all"); a skip that nobody asked for can never
// pass unnoticed. OUTBOX_TEST_REQUIRE (CI sets it to "all") overrides OUTBOX_TEST_SKIP.
//
// Support for this repository's own tests and modules ([github.com/outboxgo/outbox/outboxtest]),
// with no compatibility promise.
package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	_ "modernc.org/sqlite"             // registers "sqlite"
)

// Default DSNs of the local servers.
const (
	DefaultPostgresDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	DefaultMySQLDSN    = "root@tcp(127.0.0.1:3306)/test"
)

// SQLiteDSN returns the DSN the library documents for a SQLite file: WAL, a busy timeout,
// and immediate transactions, with synchronous=FULL and a longer busy timeout than the
// documented 10 s. SQLite does not queue writers (a blocked one sleeps and retries, and
// others may take the lock in between), and the tests run several pools against one file,
// under -race, beside every other package's tests on two cores: a writer was seen starved
// past 10 s there (SQLITE_BUSY in conformance Concurrency/NoDoubleClaim; the library's
// per-pool gate now queues one pool's writers, but not several pools'). 30 s keeps such a
// wait from failing tests that check something else; deadlocks still end in the tests' own
// deadlines.
func SQLiteDSN(path string) string {
	return "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(30000)&_pragma=synchronous(FULL)&_txlock=immediate"
}

// listed reports whether the comma list in the environment variable env names backend.
func listed(env, backend string) bool {
	for _, b := range strings.Split(os.Getenv(env), ",") {
		b = strings.TrimSpace(b)
		if b == "all" || b == backend {
			return true
		}
	}
	return false
}

// Required reports whether a test of backend must fail, rather than skip, when its server
// is unavailable: always, unless OUTBOX_TEST_SKIP names it and OUTBOX_TEST_REQUIRE does not.
func Required(backend string) bool {
	return listed("OUTBOX_TEST_REQUIRE", backend) || !listed("OUTBOX_TEST_SKIP", backend)
}

// startHints say how to start each local service.
var startHints = map[string]string{
	"postgres": "pg_ctlcluster $(ls /etc/postgresql) main start",
	"mysql":    "start-stop-daemon --start --background --exec /usr/sbin/mariadbd",
	"nats":     "nats-server -a 127.0.0.1 -p 4222 -js",
	"rabbitmq": "rabbitmq-server -detached",
	"redis":    "redis-server --daemonize yes --bind 127.0.0.1 --port 6379",
}

// Unavailable fails t, or skips it when OUTBOX_TEST_SKIP allows, because the server of
// backend cannot be reached.
func Unavailable(t testing.TB, backend string, err error) {
	t.Helper()
	if Required(backend) {
		t.Fatalf("%s is unavailable: %v\nstart it (%s), or set OUTBOX_TEST_SKIP=%s to skip its tests on purpose",
			backend, err, startHints[backend], backend)
	}
	t.Skipf("SKIPPING %s TESTS: server unavailable (%v); OUTBOX_TEST_SKIP=%s allows it", strings.ToUpper(backend), err, os.Getenv("OUTBOX_TEST_SKIP"))
}

// Service returns the address of a broker the tests need ("nats", "rabbitmq", "redis"): the
// environment variable env when set, or def. It fails or skips t, as [Unavailable] says,
// when nothing accepts a TCP connection there.
func Service(t testing.TB, backend, env, def string) string {
	t.Helper()
	addr := os.Getenv(env)
	if addr == "" {
		addr = def
	}
	hostport := addr
	if u, err := url.Parse(addr); err == nil && u.Host != "" {
		hostport = u.Host
	}
	c, err := net.DialTimeout("tcp", hostport, 3*time.Second)
	if err != nil {
		Unavailable(t, backend, err)
		return addr
	}
	_ = c.Close()
	return addr
}

func randomName() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "outbox_t_" + hex.EncodeToString(b)
}

// SQLite opens a new SQLite database file in the test's temporary directory.
func SQLite(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", SQLiteDSN(filepath.Join(t.TempDir(), "outbox.db")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

type admin struct {
	once sync.Once
	db   *sql.DB
	err  error
}

var pgAdmin, myAdmin admin

func (a *admin) get(open func() (*sql.DB, error)) (*sql.DB, error) {
	a.once.Do(func() {
		db, err := open()
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err = db.PingContext(ctx)
		}
		a.db, a.err = db, err
	})
	return a.db, a.err
}

// PostgresDSN returns the configured PostgreSQL DSN.
func PostgresDSN() string {
	if v := os.Getenv("OUTBOX_POSTGRES_DSN"); v != "" {
		return v
	}
	return DefaultPostgresDSN
}

// MySQLDSN returns the configured MySQL/MariaDB DSN.
func MySQLDSN() string {
	if v := os.Getenv("OUTBOX_MYSQL_DSN"); v != "" {
		return v
	}
	return DefaultMySQLDSN
}

// Postgres returns a pool whose search_path is a new schema, dropped after the test.
// params are extra DSN parameters as key=value pairs, such as
// "default_query_exec_mode=simple_protocol".
func Postgres(t testing.TB, params ...string) *sql.DB {
	t.Helper()
	adm, err := pgAdmin.get(func() (*sql.DB, error) { return sql.Open("pgx", PostgresDSN()) })
	if err != nil {
		Unavailable(t, "postgres", err)
	}
	schema := randomName()
	if _, err := adm.Exec(`CREATE SCHEMA ` + schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	u, err := url.Parse(PostgresDSN())
	if err != nil {
		t.Fatalf("OUTBOX_POSTGRES_DSN must be a URL: %v", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	for _, kv := range params {
		k, v, _ := strings.Cut(kv, "=")
		q.Set(k, v)
	}
	u.RawQuery = q.Encode()
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	opened.Store(db, opening{"pgx", u.String()})
	t.Cleanup(func() {
		opened.Delete(db)
		_ = db.Close()
		if _, err := adm.Exec(`DROP SCHEMA ` + schema + ` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return db
}

// MySQL returns a pool on a new database, dropped after the test.
func MySQL(t testing.TB) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(MySQLDSN())
	if err != nil {
		t.Fatalf("OUTBOX_MYSQL_DSN: %v", err)
	}
	adm, err := myAdmin.get(func() (*sql.DB, error) { return sql.Open("mysql", cfg.FormatDSN()) })
	if err != nil {
		Unavailable(t, "mysql", err)
	}
	name := randomName()
	if _, err := adm.Exec(`CREATE DATABASE ` + name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	c := cfg.Clone()
	c.DBName = name
	db, err := sql.Open("mysql", c.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	opened.Store(db, opening{"mysql", c.FormatDSN()})
	t.Cleanup(func() {
		opened.Delete(db)
		_ = db.Close()
		if _, err := adm.Exec(`DROP DATABASE ` + name); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	return db
}

// Open returns a fresh database for the named backend ("postgres", "mysql", "sqlite").
func Open(t testing.TB, backend string) *sql.DB {
	switch backend {
	case "postgres":
		return Postgres(t)
	case "mysql":
		return MySQL(t)
	case "sqlite":
		return SQLite(t)
	}
	panic(fmt.Sprintf("testdb: unknown backend %q", backend))
}

// DSN returns a DSN that opens the same database (SQLite file, PostgreSQL schema, MySQL
// database) that this package gave db, for the driver it registered for backend, so a test
// can open separate pools, as separate processes would.
func DSN(t testing.TB, backend string, db *sql.DB) string {
	t.Helper()
	switch backend {
	case "sqlite":
		var seq int
		var name, file string
		if err := db.QueryRow(`PRAGMA database_list`).Scan(&seq, &name, &file); err != nil {
			t.Fatalf("testdb: sqlite file: %v", err)
		}
		return SQLiteDSN(file)
	case "postgres":
		var schema string
		if err := db.QueryRow(`SELECT current_schema()`).Scan(&schema); err != nil {
			t.Fatalf("testdb: current schema: %v", err)
		}
		u, err := url.Parse(PostgresDSN())
		if err != nil {
			t.Fatalf("OUTBOX_POSTGRES_DSN must be a URL: %v", err)
		}
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		return u.String()
	case "mysql":
		cfg, err := mysql.ParseDSN(MySQLDSN())
		if err != nil {
			t.Fatalf("OUTBOX_MYSQL_DSN: %v", err)
		}
		if err := db.QueryRow(`SELECT DATABASE()`).Scan(&cfg.DBName); err != nil {
			t.Fatalf("testdb: current database: %v", err)
		}
		return cfg.FormatDSN()
	}
	t.Fatalf("testdb: unknown backend %q", backend)
	return ""
}

// Rebind turns "?" placeholders into PostgreSQL's "$n" when backend is "postgres".
func Rebind(backend, query string) string {
	if backend != "postgres" {
		return query
	}
	var b strings.Builder
	n := 0
	for _, c := range query {
		if c == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

// opening is how a pool returned by Postgres or MySQL was opened.
type opening struct{ driver, dsn string }

// opened maps each pool returned by Postgres and MySQL to its opening, for Reopen.
var opened sync.Map // *sql.DB → opening

// Reopen returns another pool on the database of db, which Postgres or MySQL returned, as a
// second process would open it; it is closed after the test (before db's database is
// dropped, since cleanups run last in, first out).
func Reopen(t testing.TB, db *sql.DB) *sql.DB {
	t.Helper()
	o, ok := opened.Load(db)
	if !ok {
		t.Fatal("testdb: Reopen needs a pool from testdb.Postgres or testdb.MySQL")
	}
	again, err := sql.Open(o.(opening).driver, o.(opening).dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = again.Close() })
	return again
}
