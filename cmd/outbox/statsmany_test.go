package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// closedPort returns a TCP port on 127.0.0.1 that nothing listens on: one the kernel just
// gave out and took back.
func closedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return port
}

// manyDoc decodes the stats document over several databases.
type manyDoc struct {
	Databases []struct {
		DSN string `json:"dsn"`
		statsJSON
		Error string `json:"error"`
	} `json:"databases"`
	Total statsJSON `json:"total"`
}

// TestStatsMany reads two PostgreSQL schemas, two MariaDB databases and two SQLite files,
// given by --dsn and by --dsn-file, beside a server that does not answer: a row per
// database, the unreachable one reported in its own row without its password, the total
// of the others, and exit 1.
func TestStatsMany(t *testing.T) {
	t.Parallel()
	var (
		mu       sync.Mutex
		fixtures = map[string][]*fixture{}
		wg       sync.WaitGroup
	)
	for _, backend := range backends {
		for range 2 {
			wg.Go(func() {
				f := setup(t, backend)
				f.seed(t)
				mu.Lock()
				fixtures[backend] = append(fixtures[backend], f)
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	const pw = "Sup3r-S3cret"
	down := fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/test?sslmode=disable&connect_timeout=5", pw, closedPort(t))

	// PostgreSQL by --dsn; the rest by a file, with a comment, blank lines and CRLFs.
	file := filepath.Join(t.TempDir(), "dsns.txt")
	lines := []string{"# tenants", "", fixtures["mysql"][0].dsn, fixtures["mysql"][1].dsn + "\r", "   ",
		"# the SQLite ones", fixtures["sqlite"][0].dsn, fixtures["sqlite"][1].dsn, down}
	require.NoError(t, os.WriteFile(file, []byte(strings.Join(lines, "\n")), 0o600))
	want := []string{fixtures["postgres"][0].dsn, fixtures["postgres"][1].dsn,
		fixtures["mysql"][0].dsn, fixtures["mysql"][1].dsn, fixtures["sqlite"][0].dsn, fixtures["sqlite"][1].dsn,
		redactDSN(down)}
	args := []string{"--dsn", fixtures["postgres"][0].dsn, "stats", "--dsn", fixtures["postgres"][1].dsn, "--dsn-file", file}

	r := runCLI(t, nil, append(args, "--json")...)
	require.Equal(t, exitFail, r.code, "one database does not answer: %s", r.stderr)
	require.Equal(t, "outbox: 1 of 7 databases could not be read (see their rows)\n", r.stderr)
	require.NotContains(t, r.stdout+r.stderr, pw)

	var keys map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &keys), r.stdout)
	require.ElementsMatch(t, []string{"databases", "total"}, slices.Collect(maps.Keys(keys)))
	var rows []map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(keys["databases"], &rows))
	require.Len(t, rows, len(want))
	for i, row := range rows[:6] {
		require.ElementsMatch(t, []string{"dsn", "pending", "scheduled", "processing", "delivered", "dead", "oldest_pending_age_seconds", "oldest_undelivered_age_seconds", "delivered_estimated", "delivered_since", "topics"},
			slices.Collect(maps.Keys(row)), "row %d", i)
	}
	require.ElementsMatch(t, []string{"dsn", "error"}, slices.Collect(maps.Keys(rows[6])))

	var doc manyDoc
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc))
	for i, db := range doc.Databases {
		require.Equal(t, want[i], db.DSN, "rows in the order given")
		if i < 6 {
			require.Empty(t, db.Error)
			require.Equal(t, [5]int64{2, 1, 1, 1, 2}, [5]int64{db.Pending, db.Scheduled, db.Processing, db.Delivered, db.Dead}, db.DSN)
			require.Len(t, db.Topics, 2)
		}
	}
	require.Contains(t, doc.Databases[6].Error, "cannot connect to "+redactDSN(down))
	require.Equal(t, [5]int64{12, 6, 6, 6, 12}, [5]int64{doc.Total.Pending, doc.Total.Scheduled, doc.Total.Processing, doc.Total.Delivered, doc.Total.Dead})
	maxAge := 0.0
	for _, db := range doc.Databases {
		maxAge = max(maxAge, db.OldestPendingAgeSeconds)
	}
	require.Equal(t, maxAge, doc.Total.OldestPendingAgeSeconds, "the total's oldest age is the oldest of all")
	require.Len(t, doc.Total.Topics, 2, "topics merged by namespace and topic")
	require.Equal(t, topicStatsJSON{Namespace: ns, Topic: "order.paid", countsJSON: countsJSON{Pending: 6, Scheduled: 6, Dead: 6,
		OldestPendingAgeSeconds: doc.Total.Topics[0].OldestPendingAgeSeconds, OldestUndeliveredAgeSeconds: doc.Total.Topics[0].OldestUndeliveredAgeSeconds}}, doc.Total.Topics[0])
	require.Equal(t, topicStatsJSON{Namespace: ns, Topic: "order.placed", countsJSON: countsJSON{Pending: 6, Processing: 6, Delivered: 6, Dead: 6,
		OldestPendingAgeSeconds: doc.Total.Topics[1].OldestPendingAgeSeconds, OldestUndeliveredAgeSeconds: doc.Total.Topics[1].OldestUndeliveredAgeSeconds}}, doc.Total.Topics[1])

	// The table: a row per database, the error in the last column, then the total.
	r = runCLI(t, nil, args...)
	require.Equal(t, exitFail, r.code)
	require.NotContains(t, r.stdout+r.stderr, pw)
	require.Regexp(t, `(?m)^DATABASE +PENDING +SCHEDULED +PROCESSING +DELIVERED +DEAD +OLDEST PENDING +OLDEST UNDELIVERED +ERROR$`, r.stdout)
	for _, dsn := range want[:6] {
		require.Contains(t, r.stdout, dsn+" ")
	}
	require.Regexp(t, `(?m)^`+regexp.QuoteMeta(redactDSN(down))+` +- +- +- +- +- +- +- +cannot connect to `, r.stdout)
	require.Regexp(t, `(?m)^total +12 +6 +6 +6 +12 `, r.stdout)

	// Every database answers: no ERROR column.
	r = runCLI(t, nil, "stats", "--dsn", fixtures["sqlite"][0].dsn, "--dsn", fixtures["sqlite"][1].dsn)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Regexp(t, `(?m)^DATABASE +PENDING +SCHEDULED +PROCESSING +DELIVERED +DEAD +OLDEST PENDING +OLDEST UNDELIVERED$`, r.stdout)

	// Scope flags apply to every database.
	r = runCLI(t, nil, append(args, "--json", "--topic", "order.paid")...)
	require.Equal(t, exitFail, r.code)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc))
	require.Equal(t, [5]int64{6, 6, 0, 0, 6}, [5]int64{doc.Total.Pending, doc.Total.Scheduled, doc.Total.Processing, doc.Total.Delivered, doc.Total.Dead})

	// Every database answers: exit 0.
	r = runCLI(t, nil, "stats", "--dsn", fixtures["postgres"][0].dsn, "--dsn", fixtures["mysql"][0].dsn, "--dsn", fixtures["sqlite"][0].dsn, "--json")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Empty(t, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc))
	require.Len(t, doc.Databases, 3)
	require.Equal(t, int64(6), doc.Total.Pending)
}

// TestStatsManyTimeout: a server that accepts connections and never answers costs its row
// --timeout, not the command.
func TestStatsManyTimeout(t *testing.T) {
	t.Parallel()
	f := setup(t, "sqlite")
	f.seed(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		held []net.Conn
		wg   sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held = append(held, c) // read by this goroutine only, until it returns
		}
	})
	silent := "postgres://postgres@" + l.Addr().String() + "/test?sslmode=disable"
	r := runCLI(t, nil, "stats", "--dsn", silent, "--dsn", f.dsn, "--timeout", "1s", "--json")
	require.NoError(t, l.Close())
	wg.Wait()
	for _, c := range held {
		_ = c.Close()
	}
	require.Equal(t, exitFail, r.code, r.stderr)
	var doc manyDoc
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc), r.stdout)
	require.Len(t, doc.Databases, 2)
	require.Contains(t, doc.Databases[0].Error, "no answer within --timeout 1s")
	require.Empty(t, doc.Databases[1].Error)
	require.Equal(t, int64(2), doc.Total.Pending)
}

// TestStatsManyBadInput: several databases for a command other than stats, a DSN the
// command cannot use in the file, and a file that is missing or holds no DSN are bad input
// (exit 2), and nothing is read.
func TestStatsManyBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a, b := "sqlite:"+filepath.Join(dir, "a.db"), "sqlite:"+filepath.Join(dir, "b.db")
	write := func(name string, lines ...string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(strings.Join(lines, "\n")), 0o600))
		return p
	}
	list := write("list.txt", a, b)
	for _, args := range [][]string{
		{"--dsn", a, "--dsn", b, "dead", "list"},
		{"--dsn", a, "migrate", "up", "--dsn", b},
		{"--dsn-file", list, "purge", "--dead-older-than", "1d"},
		{"--dsn-file", list, "migrate", "status"},
	} {
		r := runCLI(t, nil, args...)
		require.Equal(t, exitUsage, r.code, "%v: %s", args, r.stderr)
		require.Equal(t, "outbox: only stats and ui take several databases (--dsn more than once, --dsn-file); give this command one --dsn\n", r.stderr)
	}
	_, err := os.Stat(filepath.Join(dir, "a.db"))
	require.ErrorIs(t, err, os.ErrNotExist, "migrate up created nothing")

	const pw = "Sup3r-S3cret"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--dsn-file", write("bad.txt", "# ok", a, "app:"+pw+"@db.internal/app")}, "bad.txt:3: cannot tell the database from the DSN"},
		{[]string{"--dsn-file", write("badpg.txt", a, "postgres://u:"+pw+"@127.0.0.1:bad/x")}, "badpg.txt:2: invalid PostgreSQL DSN postgres://u:xxxxx@"},
		{[]string{"--dsn", a, "--dsn", "mysql://root:" + pw + "@h:3306/a/b"}, "--dsn 2: invalid MySQL URL"},
		{[]string{"--dsn-file", filepath.Join(dir, "missing.txt")}, "cannot read --dsn-file"},
		{[]string{"--dsn-file", write("empty.txt", "# nothing", "")}, "holds no DSN"},
		{[]string{"--dsn", a, "--dsn", b, "--timeout", "0s"}, "--timeout must be positive"},
	} {
		for _, js := range []bool{false, true} {
			args := append([]string{"stats"}, tc.args...)
			if js {
				args = append(args, "--json")
			}
			r := runCLI(t, nil, args...)
			require.Equal(t, exitUsage, r.code, "%v: %s", args, r.stderr)
			require.Contains(t, r.stderr, tc.want)
			require.Equal(t, 1, strings.Count(r.stderr, "\n"))
			require.NotContains(t, r.stdout+r.stderr, pw)
			if js {
				require.Contains(t, r.stdout, `"error"`)
			}
		}
	}
}
