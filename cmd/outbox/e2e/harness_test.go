// Package e2e tests the built outbox command's relay as a process: it builds the binary
// once, runs it against real databases and brokers, and writes the rows with the plain SQL
// of docs/sql, as a service in another language would.
package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox/outboxtest/testdb"
)

// bin is the outbox command, built once by TestMain.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "outbox-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "outbox")
	build := exec.Command("go", "build", "-o", bin, "..")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the outbox command:", err)
		os.Exit(1)
	}
	code := m.Run()
	stopBinlogMariaDB()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// syncBuffer is the process's stderr, read while it is written.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// relayProc is a running outbox relay.
type relayProc struct {
	t      testing.TB
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{}
	addr   string // the listen address it reported
}

// startRelay starts outbox relay with args and the extra environment, and waits until it
// reports the address it serves on. It is killed when the test ends, if still running.
func startRelay(t testing.TB, env []string, args ...string) *relayProc {
	t.Helper()
	p := runRelay(t, env, args...)
	testdb.Poll(t, 30*time.Second, "the relay to serve", func() bool {
		select {
		case <-p.done:
			t.Fatalf("the relay exited: %v\n%s", p.cmd.ProcessState, p.stderr)
		default:
		}
		p.addr = servingAddr(p.stderr.String())
		return p.addr != ""
	})
	return p
}

// runRelay starts the process and returns at once.
func runRelay(t testing.TB, env []string, args ...string) *relayProc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"relay"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	p := &relayProc{t: t, cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	cmd.Stdout = p.stderr
	require.NoError(t, cmd.Start())
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("relay %v output:\n%s", args, p.stderr)
		}
	})
	return p
}

// servingAddr finds the listen address in the relay's "serving" log line.
func servingAddr(logs string) string {
	sc := bufio.NewScanner(strings.NewReader(logs))
	for sc.Scan() {
		var line struct {
			Msg    string `json:"msg"`
			Listen string `json:"listen"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "outbox relay: serving" {
			return line.Listen
		}
	}
	return ""
}

// exit waits up to within for the process to end and returns its exit code.
func (p *relayProc) exit(within time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(within):
		p.t.Fatalf("the relay did not exit within %s\n%s", within, p.stderr)
		return -1
	}
}

func (p *relayProc) signal(sig syscall.Signal) {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(sig))
}

// get returns the status and body of a GET of path on the relay's listen address.
func (p *relayProc) get(path string) (int, string) {
	p.t.Helper()
	c := http.Client{Timeout: 10 * time.Second}
	res, err := c.Get("http://" + p.addr + path)
	require.NoError(p.t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(p.t, err)
	return res.StatusCode, string(b)
}

// database is one test database with its DSN, as the relay is given it.
type database struct {
	backend string
	db      *sql.DB
	dsn     string
}

func newDatabase(t testing.TB, backend string) database {
	db := testdb.Migrated(t, backend)
	return database{backend: backend, db: db, dsn: testdb.DSN(t, backend, db)}
}

// row is one event written by plain SQL.
type row struct {
	id      string
	payload string
}

// sqlFile is a statement of docs/sql and the parameters its "-- params:" line names.
type sqlFile struct {
	query  string
	params []string
}

var sqlFiles sync.Map // name → sqlFile

func readSQL(t testing.TB, name string) sqlFile {
	t.Helper()
	if f, ok := sqlFiles.Load(name); ok {
		return f.(sqlFile)
	}
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "sql", name))
	require.NoError(t, err)
	var f sqlFile
	var q []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if ps, ok := strings.CutPrefix(line, "-- params:"); ok {
			f.params = strings.Fields(ps)
			continue
		}
		if strings.HasPrefix(line, "--") || strings.TrimSpace(line) == "" {
			continue
		}
		q = append(q, line)
	}
	f.query = strings.Join(q, "\n")
	require.NotEmpty(t, f.params, "%s has no -- params: line", name)
	sqlFiles.Store(name, f)
	return f
}

// args binds the named values in the order the file names them.
func (f sqlFile) args(t testing.TB, vals map[string]any) []any {
	t.Helper()
	out := make([]any, len(f.params))
	for i, p := range f.params {
		v, ok := vals[p]
		require.True(t, ok, "no value for parameter %s", p)
		out[i] = v
	}
	return out
}

// stripe is the dedupe lock stripe of MySQL's dedupe-mysql.sql.
func stripe(ns, topic, key string) uint32 {
	h := fnv.New32a()
	for _, s := range []string{ns, topic, key} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return h.Sum32() % 4096
}

// writeRows writes n events in namespace ns by plain SQL, one transaction each, with the
// statements of docs/sql: varied topics, tenants, dedupe keys, partition keys, headers
// and payloads (unicode, escapes). A duplicate of every fifth one is written again and
// must insert nothing.
func writeRows(t testing.TB, d database, ns string, n int) []row {
	t.Helper()
	ctx := context.Background()
	var rows []row
	for i := range n {
		id := uuid.Must(uuid.NewV7()).String()
		topic := []string{"order.created", "order.paid"}[i%2]
		payload := fmt.Sprintf(`{"db":%q,"i":%d,"name":"caf\u00e9 \"%d\" ü€𝄞","nested":{"a":[1,2.5,null,true]},"s":"\\n\t"}`, d.backend, i, i)
		vals := map[string]any{"id": id, "namespace": ns, "topic": topic, "tenant_id": nil, "dedupe_key": nil,
			"partition_key": nil, "headers": nil, "payload": payload}
		sum := sha256.Sum256([]byte(payload))
		vals["payload_hash"] = sum[:]
		if i%3 == 0 {
			tenant := uuid.NewString()
			vals["tenant_id"] = tenant
			vals["dedupe_key"] = fmt.Sprintf("%s/e-%d", tenant, i)
		}
		if i%2 == 0 {
			vals["partition_key"] = fmt.Sprintf("order-%d", i%7)
			vals["headers"] = fmt.Sprintf(`{"content-type":"application/json","x-writer":"plain-sql-%d"}`, i)
		}
		insert := func(tx *sql.Tx, vals map[string]any) int64 {
			if d.backend == "mysql" && vals["dedupe_key"] != nil {
				f := readSQL(t, "dedupe-mysql.sql")
				v := map[string]any{"stripe": stripe(ns, topic, vals["dedupe_key"].(string))}
				for k, x := range vals {
					v[k] = x
				}
				res, err := tx.ExecContext(ctx, f.query, f.args(t, v)...)
				require.NoError(t, err)
				if n, _ := res.RowsAffected(); n == 0 {
					return 0
				}
			}
			f := readSQL(t, "insert-"+d.backend+".sql")
			res, err := tx.ExecContext(ctx, f.query, f.args(t, vals)...)
			require.NoError(t, err)
			n, err := res.RowsAffected()
			require.NoError(t, err)
			if d.backend == "postgres" {
				f := readSQL(t, "notify-postgres.sql")
				_, err := tx.ExecContext(ctx, f.query, f.args(t, vals)...)
				require.NoError(t, err)
			}
			return n
		}
		tx, err := d.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.EqualValues(t, 1, insert(tx, vals), "row %d", i)
		require.NoError(t, tx.Commit())
		rows = append(rows, row{id: id, payload: payload})
		if i%5 == 0 && vals["dedupe_key"] != nil {
			dup := map[string]any{}
			for k, x := range vals {
				dup[k] = x
			}
			dup["id"] = uuid.Must(uuid.NewV7()).String()
			tx, err := d.db.BeginTx(ctx, nil)
			require.NoError(t, err)
			require.EqualValues(t, 0, insert(tx, dup), "duplicate of row %d", i)
			require.NoError(t, tx.Commit())
		}
	}
	return rows
}

// counts returns the table's rows by status.
func counts(t testing.TB, d database) map[string]int {
	t.Helper()
	out := map[string]int{}
	rs, err := d.db.Query(`SELECT status, COUNT(*) FROM outbox_events GROUP BY status`)
	require.NoError(t, err)
	defer rs.Close()
	for rs.Next() {
		var s string
		var n int
		require.NoError(t, rs.Scan(&s, &n))
		out[s] = n
	}
	require.NoError(t, rs.Err())
	return out
}

// received collects what a consumer read from the broker: payloads by message id.
type received struct {
	mu   sync.Mutex
	byID map[string][]string
}

func newReceived() *received { return &received{byID: map[string][]string{}} }

func (r *received) add(id string, payload []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byID[id] = append(r.byID[id], string(payload))
}

// has reports whether every row was received, each time with its payload byte for byte.
func (r *received) has(rows []row) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range rows {
		if len(r.byID[w.id]) == 0 {
			return false
		}
	}
	return true
}

// requireExact fails unless every row was received with the payload written, its SHA-256
// the one the row's payload_hash holds.
func (r *received) requireExact(t testing.TB, rows []row) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range rows {
		got := r.byID[w.id]
		require.NotEmpty(t, got, "message %s not received", w.id)
		for _, g := range got {
			require.Equal(t, sha256.Sum256([]byte(w.payload)), sha256.Sum256([]byte(g)), "payload of %s: got %s", w.id, g)
		}
	}
}
