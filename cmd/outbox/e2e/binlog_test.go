package e2e_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
	"github.com/outboxgo/outbox/outboxtest/mariadbserver"
	"github.com/outboxgo/outbox/outboxtest/testdb"
)

// The shared MariaDB has the binlog off, so the binlog tests share a private one with it on
// (ROW format), started on first use and stopped by TestMain.
var (
	binlogMu     sync.Mutex
	binlogServer *mariadbserver.Server
)

// binlogMariaDB returns the private MariaDB, starting it on first use.
func binlogMariaDB(t *testing.T) *mariadbserver.Server {
	t.Helper()
	binlogMu.Lock()
	defer binlogMu.Unlock()
	if binlogServer == nil {
		s, err := mariadbserver.Start(append(slices.Clone(mariadbserver.Binlog), mariadbserver.Fast...)...)
		require.NoError(t, err, "private MariaDB with the binlog on")
		binlogServer = s
	}
	return binlogServer
}

// stopBinlogMariaDB stops the private MariaDB, if one was started.
func stopBinlogMariaDB() {
	binlogMu.Lock()
	defer binlogMu.Unlock()
	if binlogServer != nil {
		binlogServer.Stop()
		binlogServer = nil
	}
}

// TestRelayBinlogDelivery: with delivery = "log" on MariaDB the relay follows the binlog
// beside polling. Rows a Go service enqueued leased to the log reader for a minute reach the
// broker well within that minute, so only the reader can have delivered them (and its
// counts say so when the relay stops); rows written by plain SQL (pending) are polling's.
// /readyz reports the reader, and /metrics its outbox_log_* gauges.
func TestRelayBinlogDelivery(t *testing.T) {
	t.Parallel()
	dsn := binlogMariaDB(t).Database(t)
	db, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	ctx := context.Background()
	require.NoError(t, migrations.Up(ctx, db, "mysql", migrations.Options{}))
	d := database{backend: "mysql", db: db, dsn: dsn}
	ns := newNamespace()
	br := redisBroker(t, ns, strings.TrimPrefix(testdb.Service(t, "redis", "OUTBOX_REDIS_ADDR", "127.0.0.1:6379"), "redis://"))
	p := startRelay(t, nil, "--broker", br.url, "--namespace", ns, "--dialect", "mysql", "--dsn", dsn,
		"--delivery", "log", "--listen", "127.0.0.1:0", "--poll-interval", "50ms")
	testdb.Poll(t, 30*time.Second, "the log listener to read the binlog", func() bool {
		_, body := p.get("/readyz")
		return strings.Contains(body, ": reading the binlog as outbox_outbox_events")
	})

	const lease = time.Minute
	store, err := outbox.New(db, outbox.MySQL(), outbox.Options{LogLease: lease})
	require.NoError(t, err)
	start := time.Now()
	var fromLog []row
	for i := range 10 {
		payload := fmt.Sprintf(`{"via":"binlog","i":%d}`, i)
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		res, err := store.Enqueue(ctx, tx, outbox.Message{Namespace: ns, Topic: topics[i%2], Payload: json.RawMessage(payload)})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		fromLog = append(fromLog, row{id: res.ID.String(), payload: payload})
	}
	bySQL := writeRows(t, d, ns, 6)
	testdb.Poll(t, lease/2, "every row at the broker", func() bool { return br.got.has(fromLog) && br.got.has(bySQL) })
	testdb.Poll(t, 10*time.Second, "every row delivered", func() bool { return counts(t, d)["delivered"] == 16 })
	require.Less(t, time.Since(start), lease, "the leased rows' leases ran out: polling may have delivered them")
	br.got.requireExact(t, append(fromLog, bySQL...))

	code, body := p.get("/readyz")
	require.Equal(t, 200, code, body)
	_, metrics := p.get("/metrics")
	for _, name := range []string{"outbox_log_slot_lag_bytes{", "outbox_log_slot_resets_total{"} {
		require.Contains(t, metrics, name)
	}
	require.Regexp(t, `outbox_log_reading\{[^}]*outbox_log_slot="outbox_outbox_events"\} 1`, metrics)
	p.signal(syscall.SIGTERM)
	require.Equal(t, 0, p.exit(30*time.Second))
	stopped := logLine(p.stderr.String(), "outbox relay: stopped")
	require.NotNil(t, stopped, p.stderr.String())
	require.EqualValues(t, len(fromLog), stopped["log_delivered"], "rows the binlog reader delivered")
	require.EqualValues(t, len(bySQL), stopped["delivered"], "rows polling delivered")
}

// TestRelayBinlogOff: on a server whose binlog is off (the shared MariaDB) the binlog reader
// stops with the fix to make; the relay logs it at once, /readyz says it, polling goes on
// delivering, and the relay exits 1 when it stops.
func TestRelayBinlogOff(t *testing.T) {
	t.Parallel()
	d := newDatabase(t, "mysql")
	var logBin int
	require.NoError(t, d.db.QueryRow(`SELECT @@log_bin`).Scan(&logBin))
	if logBin != 0 {
		t.Skip("the shared MariaDB has its binlog on")
	}
	ns := newNamespace()
	br := redisBroker(t, ns, strings.TrimPrefix(testdb.Service(t, "redis", "OUTBOX_REDIS_ADDR", "127.0.0.1:6379"), "redis://"))
	p := startRelay(t, nil, "--broker", br.url, "--namespace", ns, "--dsn", d.dsn,
		"--delivery", "log", "--listen", "127.0.0.1:0", "--poll-interval", "50ms")
	var body string
	testdb.Poll(t, 30*time.Second, "the reader's failure on /readyz", func() bool {
		var code int
		code, body = p.get("/readyz")
		return code == 503 && strings.Contains(body, ": stopped (the binlog as outbox_outbox_events): outboxbinlog:")
	})
	t.Logf("/readyz: %s", body)
	// The relay's stderr reaches the test through a pipe, read as it comes: wait for the line.
	var stopped map[string]any
	testdb.Poll(t, 30*time.Second, "the reader's failure in the log", func() bool {
		stopped = logLine(p.stderr.String(), "outbox relay: log delivery stopped; polling delivers the rows")
		return stopped != nil
	})
	require.Equal(t, "ERROR", stopped["level"])
	require.Contains(t, stopped["err"], "binlog")

	rows := writeRows(t, d, ns, 3)
	testdb.Poll(t, 30*time.Second, "polling to deliver the rows", func() bool { return br.got.has(rows) })
	p.signal(syscall.SIGTERM)
	require.Equal(t, 1, p.exit(30*time.Second), p.stderr.String())
}
