package e2e_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
	"github.com/outboxgo/outbox/outboxtest/pgserver"
	"github.com/outboxgo/outbox/outboxtest/testdb"
)

// logicalPostgres starts a private PostgreSQL with wal_level = logical (the shared server's
// is replica), stopped when the test ends, and returns the DSN of its postgres database.
func logicalPostgres(t *testing.T) string {
	t.Helper()
	srv, err := pgserver.Start(append([]string{"wal_level=logical"}, pgserver.Fast...)...)
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	return srv.DSN("postgres")
}

// TestRelayLogDelivery: with delivery = "log" the relay reads PostgreSQL's log through a
// replication slot beside polling: rows a Go service enqueued leased to the log reader, and
// rows written by plain SQL (pending, polling's), all reach the broker; /readyz reports the
// listener reading its slot, and /metrics the relay's log gauges.
func TestRelayLogDelivery(t *testing.T) {
	t.Parallel()
	dsn := logicalPostgres(t)
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	ctx := context.Background()
	require.NoError(t, migrations.Up(ctx, db, "postgres", migrations.Options{}))
	d := database{backend: "postgres", db: db, dsn: dsn}
	ns := newNamespace()
	br := redisBroker(t, ns, strings.TrimPrefix(testdb.Service(t, "redis", "OUTBOX_REDIS_ADDR", "127.0.0.1:6379"), "redis://"))
	p := startRelay(t, nil, "--broker", br.url, "--namespace", ns, "--dsn", dsn, "--delivery", "log",
		"--listen", "127.0.0.1:0", "--poll-interval", "50ms")
	// Rows committed before the slot exists are polling's, so wait for the reading line.
	testdb.Poll(t, 30*time.Second, "the log listener to read its slot", func() bool {
		_, body := p.get("/readyz")
		return strings.Contains(body, ": reading slot outbox_outbox_events")
	})

	// An insert lease longer than the test's waits: only the log can deliver these rows.
	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{LogLease: time.Minute})
	require.NoError(t, err)
	var fromLog []row
	for i := range 10 {
		payload := fmt.Sprintf(`{"via":"log","i":%d}`, i)
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		res, err := store.Enqueue(ctx, tx, outbox.Message{Namespace: ns, Topic: topics[i%2], Payload: json.RawMessage(payload)})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		fromLog = append(fromLog, row{id: res.ID.String(), payload: payload})
	}
	bySQL := writeRows(t, d, ns, 6)
	testdb.Poll(t, 30*time.Second, "every row at the broker (the leased ones from the log: polling cannot take them yet)", func() bool {
		return br.got.has(fromLog) && br.got.has(bySQL)
	})
	br.got.requireExact(t, append(fromLog, bySQL...))
	testdb.Poll(t, 10*time.Second, "every row delivered", func() bool { return counts(t, d)["delivered"] == 16 })
	// A row the log delivered was leased at its insert and settled once (attempts 1); one
	// that polling took over after its lease ran out would count 2.
	var byLog int
	ids := make([]any, len(fromLog))
	for i, r := range fromLog {
		ids[i] = r.id
	}
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM outbox_events WHERE attempts = 1 AND id::text = ANY (ARRAY[$1,$2,$3,$4,$5,$6,$7,$8,$9,$10])`, ids...).Scan(&byLog))
	require.Equal(t, len(fromLog), byLog, "every leased row delivered from the log")

	code, body := p.get("/readyz")
	require.Equal(t, 200, code, body)
	_, metrics := p.get("/metrics")
	for _, name := range []string{"outbox_log_reading{", "outbox_log_slot_lag_bytes{", "outbox_log_slot_retained_wal_bytes{", "outbox_log_slot_resets_total{"} {
		require.Contains(t, metrics, name)
	}
	require.Regexp(t, `outbox_log_reading\{[^}]*outbox_log_slot="outbox_outbox_events"\} 1`, metrics)
	p.signal(syscall.SIGTERM)
	require.Equal(t, 0, p.exit(30*time.Second))
}
