package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/outboxtest/testdb"
)

func TestMain(m *testing.M) {
	code := m.Run()
	stopPrivateServers()
	// The command and the tests' publishers must leave no goroutine behind. database/sql's
	// openers and go-sql-driver/mysql's per-connection watchers belong to the pools testdb
	// keeps open for creating and dropping test databases.
	if code == 0 {
		if err := goleak.Find(
			goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
			goleak.IgnoreTopFunction("github.com/go-sql-driver/mysql.(*mysqlConn).startWatcher.func1")); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

var backends = []string{"postgres", "mysql", "sqlite"}

// result is one in-process run of the command.
type result struct {
	code           int
	stdout, stderr string
}

// cli runs the command in-process with the given environment (nothing from the process's).
func runCLI(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := run(ctx, args, func(k string) string { return env[k] }, &out, &errb)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// ok runs the command, requires success and returns stdout.
func (f *fixture) ok(t *testing.T, args ...string) string {
	t.Helper()
	r := runCLI(t, nil, append([]string{"--dsn", f.dsn}, args...)...)
	require.Equal(t, 0, r.code, "outbox %s: stderr %q", strings.Join(args, " "), r.stderr)
	require.Empty(t, r.stderr)
	return r.stdout
}

// okJSON runs the command with --json, requires success and exactly one JSON document on
// stdout, and decodes it into v.
func (f *fixture) okJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out := f.ok(t, append(args, "--json")...)
	dec := json.NewDecoder(strings.NewReader(out))
	require.NoError(t, dec.Decode(v), "stdout %q", out)
	var extra json.RawMessage
	require.Error(t, dec.Decode(&extra), "more than one JSON document on stdout: %q", out)
}

// fails runs the command, requires the exit code and a one-line error on stderr that
// contains want, and returns the error line.
func (f *fixture) fails(t *testing.T, code int, want string, args ...string) string {
	t.Helper()
	r := runCLI(t, nil, append([]string{"--dsn", f.dsn}, args...)...)
	require.Equal(t, code, r.code, "outbox %s: stdout %q stderr %q", strings.Join(args, " "), r.stdout, r.stderr)
	require.True(t, strings.HasPrefix(r.stderr, "outbox: ") && strings.Count(r.stderr, "\n") == 1 && strings.HasSuffix(r.stderr, "\n"),
		"want one error line, got %q", r.stderr)
	require.Contains(t, r.stderr, want)
	return r.stderr
}

// fixture is a fresh database on one backend, migrated by the command, and a Store on it.
type fixture struct {
	backend string
	db      *sql.DB
	dsn     string
	store   *outbox.Store
}

func dialectOf(backend string) outbox.Dialect {
	return map[string]func() outbox.Dialect{"postgres": outbox.Postgres, "mysql": outbox.MySQL, "sqlite": outbox.SQLite}[backend]()
}

// forEachBackend runs test, in parallel, on a fresh migrated database of every backend.
func forEachBackend(t *testing.T, test func(t *testing.T, f *fixture)) {
	t.Parallel()
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			test(t, setup(t, backend))
		})
	}
}

func setup(t *testing.T, backend string) *fixture {
	t.Helper()
	db := testdb.Open(t, backend)
	f := &fixture{backend: backend, db: db, dsn: commandDSN(t, backend, db)}
	var up struct {
		Applied []migrationJSON `json:"applied"`
		Version int64           `json:"version"`
	}
	f.okJSON(t, &up, "migrate", "up")
	require.NotEmpty(t, up.Applied)
	require.Equal(t, up.Applied[len(up.Applied)-1].Version, up.Version)
	s, err := outbox.New(db, dialectOf(backend), outbox.Options{})
	require.NoError(t, err)
	f.store = s
	return f
}

// commandDSN returns a DSN for the command that opens the database testdb gave db (SQLite
// file, PostgreSQL schema, MariaDB database), in the form a user would type: a postgres://
// URL, a mysql:// URL, a sqlite: path.
func commandDSN(t *testing.T, backend string, db *sql.DB) string {
	t.Helper()
	switch backend {
	case "sqlite":
		return "sqlite:" + strings.TrimPrefix(strings.SplitN(testdb.DSN(t, backend, db), "?", 2)[0], "file:")
	case "postgres":
		return testdb.DSN(t, backend, db)
	case "mysql":
		var name string
		require.NoError(t, db.QueryRow(`SELECT DATABASE()`).Scan(&name))
		cfg, err := mysql.ParseDSN(testdb.MySQLDSN())
		require.NoError(t, err)
		cfg.DBName = name
		if cfg.Net != "tcp" {
			return cfg.FormatDSN() // a socket has no URL form; the dialect is inferred from it
		}
		u := url.URL{Scheme: "mysql", Host: cfg.Addr, Path: "/" + name}
		if cfg.Passwd != "" {
			u.User = url.UserPassword(cfg.User, cfg.Passwd)
		} else {
			u.User = url.User(cfg.User)
		}
		return u.String()
	}
	t.Fatalf("unknown backend %s", backend)
	return ""
}

// seeded are the ids of rows in every state.
type seeded struct {
	delivered, processing, dead1, dead2, pending1, pending2, scheduled uuid.UUID
	payload                                                            map[uuid.UUID]string
}

const ns = "shop"

// seed writes rows in every state: in shop/order.placed one delivered, one processing
// (leased for an hour), one dead and one pending; in shop/order.paid one dead, one pending
// and one scheduled an hour ahead.
func (f *fixture) seed(t *testing.T) seeded {
	t.Helper()
	ctx := context.Background()
	msg := func(topic string, n int) outbox.Message {
		return outbox.Message{Namespace: ns, Topic: topic, Payload: []byte(fmt.Sprintf(`{"order":%d}`, n))}
	}
	s := seeded{payload: map[uuid.UUID]string{}}
	res, err := f.store.EnqueueStandalone(ctx, msg("order.placed", 1), msg("order.placed", 2), msg("order.placed", 3), msg("order.paid", 4))
	require.NoError(t, err)
	s.delivered, s.processing, s.dead1, s.dead2 = res[0].ID, res[1].ID, res[2].ID, res[3].ID
	for i, r := range res {
		s.payload[r.ID] = fmt.Sprintf(`{"order":%d}`, i+1)
	}
	recs, err := f.store.Claim(ctx, outbox.ClaimOptions{Scope: outbox.Scope{Namespace: ns}, Limit: 10, Lease: time.Hour, MaxAttempts: 5, WorkerID: "seed"})
	require.NoError(t, err)
	require.Len(t, recs, 4)
	lease := map[uuid.UUID]outbox.Lease{}
	for _, r := range recs {
		lease[r.ID] = r.Lease()
	}
	require.NoError(t, f.store.Ack(ctx, lease[s.delivered]))
	require.NoError(t, f.store.Complete(ctx, outbox.Outcome{Lease: lease[s.dead1], Status: outbox.StatusDead, Error: "broker said no\nsecond line"}))
	require.NoError(t, f.store.Complete(ctx, outbox.Outcome{Lease: lease[s.dead2], Status: outbox.StatusDead, Error: "schema refused"}))
	later := msg("order.paid", 7)
	later.Delay = time.Hour
	res, err = f.store.EnqueueStandalone(ctx, msg("order.placed", 5), msg("order.paid", 6), later)
	require.NoError(t, err)
	s.pending1, s.pending2, s.scheduled = res[0].ID, res[1].ID, res[2].ID
	for i, r := range res {
		s.payload[r.ID] = fmt.Sprintf(`{"order":%d}`, i+5)
	}
	return s
}

// fingerprint describes every row of the table, to prove that a command changed nothing.
func (f *fixture) fingerprint(t *testing.T) string {
	t.Helper()
	var n int
	require.NoError(t, f.db.QueryRow(`SELECT COUNT(*) FROM `+outbox.DefaultTable).Scan(&n))
	var b strings.Builder
	fmt.Fprintf(&b, "rows=%d\n", n)
	rows, err := f.db.Query(`SELECT id FROM ` + outbox.DefaultTable)
	require.NoError(t, err)
	var ids []uuid.UUID
	for rows.Next() {
		var raw any
		require.NoError(t, rows.Scan(&raw))
		var id uuid.UUID
		switch v := raw.(type) {
		case string:
			id = uuid.MustParse(v)
		case [16]byte:
			id = v
		case []byte:
			if len(v) == 16 {
				id = uuid.UUID(v)
			} else {
				id = uuid.MustParse(string(v))
			}
		}
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return strings.Compare(a.String(), b.String()) })
	for _, id := range ids {
		r, err := f.store.Get(context.Background(), id)
		require.NoError(t, err)
		fmt.Fprintf(&b, "%s %s a=%d r=%d u=%s e=%q\n", r.ID, r.Status, r.Attempts, r.Replays, r.UpdatedAt.Format(time.RFC3339Nano), r.LastError)
	}
	return b.String()
}
