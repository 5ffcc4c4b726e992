package e2e_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox/outboxtest/testdb"
	"github.com/outboxgo/outbox/outboxtest/testproxy"
)

func newNamespace() string { return "rl_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12] }

// gate holds the webhook receiver's requests until it is opened, and tells when the first
// one arrived: a batch is then in flight.
type gate struct {
	arrived chan struct{}
	once    sync.Once
	open    chan struct{}
}

func newGate() *gate { return &gate{arrived: make(chan struct{}), open: make(chan struct{})} }

func (g *gate) hold() {
	g.once.Do(func() { close(g.arrived) })
	<-g.open
}

func (g *gate) waitInFlight(t *testing.T) {
	t.Helper()
	select {
	case <-g.arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("no batch reached the receiver")
	}
}

// TestRelayKilledMidBatch: a relay killed with SIGKILL while a batch is in the transport
// loses nothing: a new relay delivers every row once the dead one's lease runs out.
func TestRelayKilledMidBatch(t *testing.T) {
	t.Parallel()
	ns := newNamespace()
	d := newDatabase(t, "postgres")
	g := newGate()
	br := webhookBroker(t, g.hold)
	rows := writeRows(t, d, ns, 40)
	args := []string{"--broker", br.url, "--namespace", ns, "--dsn", d.dsn, "--listen", "127.0.0.1:0",
		"--batch-size", "10", "--lease", "2s", "--poll-interval", "50ms"}
	p := startRelay(t, br.env, args...)
	g.waitInFlight(t)
	require.NoError(t, p.cmd.Process.Kill())
	require.Equal(t, -1, p.exit(10*time.Second), "killed by a signal")
	c := counts(t, d)
	require.Zero(t, c["delivered"], "nothing was settled before the kill")
	require.NotZero(t, c["processing"], "the batch in flight was leased")
	close(g.open)

	startRelay(t, br.env, args...)
	testdb.Poll(t, 30*time.Second, "every row at the receiver", func() bool { return br.got.has(rows) })
	br.got.requireExact(t, rows)
	testdb.Poll(t, 10*time.Second, "every row delivered", func() bool { return counts(t, d)["delivered"] == len(rows) })
	require.Equal(t, map[string]int{"delivered": len(rows)}, counts(t, d))
}

// TestRelayDrainsOnSIGTERM: on SIGTERM the relay stops claiming, settles the batch in
// flight when it completes within --drain-timeout, and exits 0 within the deadline; when
// the receiver answers too late, it still exits within the deadline (and 5s), and the rows
// it could not settle are delivered by the next relay. Nothing is lost either way.
func TestRelayDrainsOnSIGTERM(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		answer  time.Duration // how long after SIGTERM the receiver answers
		settled bool          // whether the batch in flight is settled before the exit
	}{
		{"batch answered within the deadline", 500 * time.Millisecond, true},
		{"batch answered after the deadline", 8 * time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const drain = 2 * time.Second
			ns := newNamespace()
			d := newDatabase(t, "sqlite")
			g := newGate()
			br := webhookBroker(t, g.hold)
			rows := writeRows(t, d, ns, 40)
			args := []string{"--broker", br.url, "--namespace", ns, "--dsn", d.dsn, "--listen", "127.0.0.1:0",
				"--batch-size", "10", "--lease", "3s", "--poll-interval", "50ms", "--drain-timeout", drain.String(),
				"--broker-opt", "timeout=30s"}
			p := startRelay(t, br.env, args...)
			g.waitInFlight(t)
			p.signal(syscall.SIGTERM)
			start := time.Now()
			time.AfterFunc(tc.answer, func() { close(g.open) })
			code := p.exit(drain + 10*time.Second)
			took := time.Since(start)
			require.Less(t, took, drain+5*time.Second, "exit within the drain deadline and its grace")
			c := counts(t, d)
			if tc.settled {
				require.Equal(t, 0, code, p.stderr.String())
				require.GreaterOrEqual(t, c["delivered"], 1, "the batch in flight was settled: %v", c)
				require.Zero(t, c["processing"], "nothing left leased: %v", c)
			} else {
				require.Zero(t, c["delivered"], "the late batch was not settled: %v", c)
			}
			require.Zero(t, c["dead"])

			startRelay(t, br.env, args...)
			testdb.Poll(t, 30*time.Second, "every row at the receiver", func() bool { return br.got.has(rows) })
			br.got.requireExact(t, rows)
			testdb.Poll(t, 10*time.Second, "every row delivered", func() bool { return counts(t, d)["delivered"] == len(rows) })
		})
	}
}

// TestRelayBrokerOutage: a broker that stops answering (a blackhole in front of Redis) makes
// /readyz say so; no row is dead-lettered meanwhile, and everything is delivered once it
// answers again.
func TestRelayBrokerOutage(t *testing.T) {
	t.Parallel()
	ns := newNamespace()
	addr := strings.TrimPrefix(testdb.Service(t, "redis", "OUTBOX_REDIS_ADDR", "127.0.0.1:6379"), "redis://")
	br := redisBroker(t, ns, addr)
	proxy := testproxy.New(t, addr)
	d := newDatabase(t, "mysql")
	p := startRelay(t, nil, "--broker", "redis://"+proxy.Addr()+"?timeout=1s", "--namespace", ns, "--dsn", d.dsn,
		"--listen", "127.0.0.1:0", "--poll-interval", "50ms", "--max-attempts", "2", "--retry-base", "100ms", "--retry-max", "200ms", "--circuit-probe-max", "1s")
	before := writeRows(t, d, ns, 5)
	testdb.Poll(t, 30*time.Second, "the first rows at the broker", func() bool { return br.got.has(before) })
	testdb.Poll(t, 10*time.Second, "ready", func() bool { code, _ := p.get("/readyz"); return code == http.StatusOK })

	proxy.Blackhole()
	during := writeRows(t, d, ns, 10)
	var body string
	testdb.Poll(t, 30*time.Second, "/readyz to report the outage and the open circuit", func() bool {
		var code int
		code, body = p.get("/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "circuit: open")
	})
	require.Contains(t, body, "not ready\n")
	require.Contains(t, body, "broker redis://"+proxy.Addr()+": unreachable")
	require.Zero(t, counts(t, d)["dead"], "an outage spends no attempt")

	proxy.Restore()
	testdb.Poll(t, 60*time.Second, "the rows written during the outage at the broker", func() bool { return br.got.has(during) })
	br.got.requireExact(t, append(before, during...))
	testdb.Poll(t, 10*time.Second, "every row delivered", func() bool { return counts(t, d)["delivered"] == 15 })
	require.Equal(t, map[string]int{"delivered": 15}, counts(t, d))
	testdb.Poll(t, 30*time.Second, "ready again", func() bool { code, _ := p.get("/readyz"); return code == http.StatusOK })
}

// acceptCounter is a TCP listener that counts the connections made to it: a database or
// broker address that a relay refused at configuration must never be dialled.
type acceptCounter struct {
	ln net.Listener
	n  atomic.Int64
}

func newAcceptCounter(t *testing.T) *acceptCounter {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	a := &acceptCounter{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			a.n.Add(1)
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	return a
}

// TestRelayBadConfiguration: bad settings end the process with exit code 2 and a message
// that names the flag, variable or key, before anything is started: the database and the
// broker are never dialled, and the listen address (held by the test, so that a bind
// would fail with exit code 1) is never bound.
func TestRelayBadConfiguration(t *testing.T) {
	t.Parallel()
	dbSrv, brSrv := newAcceptCounter(t), newAcceptCounter(t)
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = held.Close() })
	pg := "postgres://postgres@" + dbSrv.ln.Addr().String() + "/x"
	my := "mysql://root@" + dbSrv.ln.Addr().String() + "/x"
	broker := "nats://" + brSrv.ln.Addr().String()
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		return p
	}
	lite := "sqlite:" + file("lite.db", "")
	base := []string{"--listen", held.Addr().String()}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"no broker", nil, []string{"--namespace", "a", "--dsn", pg}, "no broker given: pass --broker"},
		{"unknown scheme", nil, []string{"--broker", "ftp://x", "--namespace", "a", "--dsn", pg}, `unknown scheme "ftp"`},
		{"no namespace", nil, []string{"--broker", broker, "--dsn", pg}, "no namespace given"},
		{"no database", nil, []string{"--broker", broker, "--namespace", "a"}, "no database given"},
		{"bad flag value", nil, []string{"--broker", broker, "--namespace", "a", "--dsn", pg, "--lease", "5 parsecs"}, `--lease: "5 parsecs" is not a duration`},
		{"bad variable", []string{"OUTBOX_BATCH_SIZE=lots"}, []string{"--broker", broker, "--namespace", "a", "--dsn", pg}, "OUTBOX_BATCH_SIZE:"},
		{"library refuses", nil, []string{"--broker", broker, "--namespace", "a", "--dsn", pg, "--lease", "1s", "--poll-interval", "1s"}, "--poll-interval"},
		{"log delivery on SQLite", nil, []string{"--broker", broker, "--namespace", "a", "--dsn", lite, "--delivery", "log"}, "SQLite databases are delivered by polling"},
		{"bad replication DSN", nil, []string{"--broker", broker, "--namespace", "a", "--dsn", my, "--delivery", "log", "--replication-dsn", "mysql://root@x/?tls=maybe"}, "replication_dsn"},
		{"unknown broker option", nil, []string{"--broker", broker + "?subjekt=x", "--namespace", "a", "--dsn", pg}, `broker option "subjekt"`},
		{"webhook without secret", nil, []string{"--broker", "https://hooks.example.com/x", "--namespace", "a", "--dsn", pg}, "signing secret"},
		{"unknown file key", nil, []string{"--config", file("typo.toml", "broker = \""+broker+"\"\nnamespace = \"a\"\nbach_size = 10\n")}, `unknown key "bach_size"`},
		{"file that does not parse", nil, []string{"--config", file("bad.toml", "broker = \n")}, "bad.toml"},
		{"bad database in file", nil, []string{"--config", file("db.toml", "broker = \""+broker+"\"\nnamespace = \"a\"\n[[database]]\ndsn = '"+lite+"'\ndelivery = \"log\"\n")}, "database 1 of"},
		{"ui beyond loopback without a token", nil, []string{"--broker", broker, "--namespace", "a", "--dsn", pg, "--ui", "--listen", ":0"}, "--ui-token"},
	} {
		p := runRelay(t, tc.env, append(append([]string{}, base...), tc.args...)...)
		code := p.exit(30 * time.Second)
		require.Equal(t, 2, code, "%s: %s", tc.name, p.stderr)
		require.Contains(t, p.stderr.String(), tc.want, tc.name)
		require.Equal(t, 1, strings.Count(strings.TrimSpace(p.stderr.String()), "\n")+1, "%s: one line: %s", tc.name, p.stderr)
	}
	require.Zero(t, dbSrv.n.Load(), "a database was dialled")
	require.Zero(t, brSrv.n.Load(), "the broker was dialled")
}

// TestRelayPrecedence: a flag wins over a variable, a variable over the config file, the
// file over the defaults; the publisher's start line says what it runs with.
func TestRelayPrecedence(t *testing.T) {
	t.Parallel()
	d := newDatabase(t, "sqlite")
	cfg := filepath.Join(t.TempDir(), "relay.toml")
	require.NoError(t, os.WriteFile(cfg, []byte("broker = \"redis://127.0.0.1:6379\"\nnamespace = \"file\"\nbatch_size = 7\nlease = \"40s\"\nlisten = \"127.0.0.1:0\"\n"), 0o600))
	for _, tc := range []struct {
		env                  []string
		args                 []string
		ns, batch, lease     string
		concurrency, wantLog string
	}{
		{nil, nil, "file", "7", "40s", "", ""},
		{[]string{"OUTBOX_NAMESPACE=env", "OUTBOX_BATCH_SIZE=8"}, nil, "env", "8", "40s", "", ""},
		{[]string{"OUTBOX_NAMESPACE=env", "OUTBOX_BATCH_SIZE=8"}, []string{"--namespace", "flag", "--batch-size", "9"}, "flag", "9", "40s", "", ""},
		{nil, []string{"--lease", "45s"}, "file", "7", "45s", "", ""},
	} {
		env := append([]string{"OUTBOX_CONFIG=" + cfg, "OUTBOX_DSN=" + d.dsn}, tc.env...)
		p := startRelay(t, env, tc.args...)
		var started map[string]any
		testdb.Poll(t, 10*time.Second, "the publisher's start line", func() bool {
			started = logLine(p.stderr.String(), "outbox publisher started")
			return started != nil
		})
		require.Equal(t, tc.ns, started["namespace"])
		require.Equal(t, tc.batch, fmt.Sprint(started["batch_size"]))
		require.Equal(t, tc.lease, time.Duration(started["lease"].(float64)).String())
		p.signal(syscall.SIGINT)
		require.Equal(t, 0, p.exit(30*time.Second))
	}
}

// logLine returns the first JSON log line with that message.
func logLine(logs, msg string) map[string]any {
	sc := bufio.NewScanner(strings.NewReader(logs))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == msg {
			return m
		}
	}
	return nil
}

// TestRelayServesTheWebView: with --ui the web view of every database is under /ui/ on the
// relay's listen address.
func TestRelayServesTheWebView(t *testing.T) {
	t.Parallel()
	d := newDatabase(t, "sqlite")
	p := startRelay(t, nil, "--broker", "redis://127.0.0.1:6379", "--namespace", newNamespace(), "--dsn", d.dsn,
		"--listen", "127.0.0.1:0", "--ui", "--ui-read-only")
	code, body := p.get("/ui/")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, filepath.Base(strings.TrimSuffix(strings.SplitN(strings.TrimPrefix(d.dsn, "file:"), "?", 2)[0], ".db")))
	code, _ = p.get("/nothing")
	require.Equal(t, http.StatusNotFound, code)
}
