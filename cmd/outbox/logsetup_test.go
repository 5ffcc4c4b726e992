package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/logrepl/mysqlbinlog"
	"github.com/outboxgo/outbox/logrepl/pglog"
	"github.com/outboxgo/outbox/outboxtest/mariadbserver"
	"github.com/outboxgo/outbox/outboxtest/pgserver"
	"github.com/outboxgo/outbox/outboxtest/testdb"
)

// The shared servers have no log to read (PostgreSQL's wal_level is replica, MariaDB's
// binlog is off), so the log commands' tests share private ones: started on first use,
// stopped by TestMain.
var (
	privateMu sync.Mutex
	logicalPG *pgserver.Server
	binlogMy  *mariadbserver.Server
)

func stopPrivateServers() {
	privateMu.Lock()
	defer privateMu.Unlock()
	if logicalPG != nil {
		logicalPG.Stop()
	}
	if binlogMy != nil {
		binlogMy.Stop()
	}
}

// logicalPostgres creates a database for one test on the private PostgreSQL with
// wal_level = logical and returns its DSN; the test's cleanup drops it and its slots.
func logicalPostgres(t *testing.T) string {
	t.Helper()
	privateMu.Lock()
	if logicalPG == nil {
		s, err := pgserver.Start(append(slices.Clone(pgserver.Fast), "wal_level=logical")...)
		if err != nil {
			privateMu.Unlock()
			t.Fatalf("private PostgreSQL with wal_level=logical: %v", err)
		}
		logicalPG = s
	}
	s := logicalPG
	privateMu.Unlock()
	name := fmt.Sprintf("t_%d", time.Now().UnixNano())
	adm := openDB(t, "pgx", s.DSN("postgres"))
	_, err := adm.Exec("CREATE DATABASE " + name)
	require.NoError(t, err)
	t.Cleanup(func() {
		// A stopped reader's walsender keeps its slot active for a moment.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			var active int
			if err := adm.QueryRow(`SELECT count(*) FROM pg_replication_slots WHERE database = $1 AND active`, name).Scan(&active); err != nil || active == 0 {
				break
			}
		}
		_, _ = adm.Exec(`SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1 AND NOT active`, name)
		_, err := adm.Exec("DROP DATABASE " + name + " WITH (FORCE)")
		require.NoError(t, err)
	})
	return s.DSN(name)
}

// binlogMariaDB creates a database for one test on the private MariaDB with the binlog on
// and returns its DSN (go-sql-driver's form); the test's cleanup drops it.
func binlogMariaDB(t *testing.T) string {
	t.Helper()
	privateMu.Lock()
	if binlogMy == nil {
		s, err := mariadbserver.Start(append(slices.Clone(mariadbserver.Binlog), mariadbserver.Fast...)...)
		if err != nil {
			privateMu.Unlock()
			t.Fatalf("private MariaDB with the binlog on: %v", err)
		}
		binlogMy = s
	}
	s := binlogMy
	privateMu.Unlock()
	return s.Database(t)
}

func openDB(t *testing.T, driver, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// logDoc runs stats --json and returns its log readers, failing on a log_error.
func logDoc(t *testing.T, dsn string, args ...string) []logReaderJSON {
	t.Helper()
	r := runCLI(t, nil, append([]string{"--dsn", dsn, "stats", "--json"}, args...)...)
	require.Equal(t, exitOK, r.code, r.stderr)
	var doc statsJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc), r.stdout)
	require.Empty(t, doc.LogError)
	return doc.Log
}

// runReader runs a log reader until the test ends, or until the stop it returns is called.
func runReader(t *testing.T, run func(context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			require.NoError(t, <-done)
		})
	}
	t.Cleanup(stop)
	return stop
}

var discard = slog.New(slog.DiscardHandler)

func noTransport() outbox.Transport {
	return outbox.PerMessage(func(context.Context, outbox.Delivery) error { return nil })
}

// TestLogPostgres: log setup creates the publication and the slot, and again finds them;
// stats shows the slot; log drop refuses the slot while a reader streams it, changing
// nothing, and drops both once the reader stopped.
func TestLogPostgres(t *testing.T) {
	t.Parallel()
	dsn := logicalPostgres(t)
	db := openDB(t, "pgx", dsn)
	f := &fixture{dsn: dsn}
	f.ok(t, "migrate", "up")
	require.Empty(t, logDoc(t, dsn), "no slot yet: stats shows no log reader")

	out := f.ok(t, "log", "setup")
	require.Equal(t, "created publication outbox_outbox_events of the inserts into outbox_events\n"+
		"created replication slot outbox_outbox_events (pgoutput)\n"+
		"the slot holds WAL back from now on until a reader confirms past it: start the relay with delivery log, or run outbox log drop\n", out)
	var again logSetupJSON
	f.okJSON(t, &again, "log", "setup")
	require.Equal(t, "outbox_outbox_events", again.Slot)
	require.False(t, *again.SlotChanged, "setup again finds the slot")
	require.False(t, *again.PublicationChanged, "and the publication")

	logs := logDoc(t, dsn)
	require.Len(t, logs, 1)
	require.Equal(t, "outbox_outbox_events", logs[0].Name)
	require.Equal(t, "slot", logs[0].Kind)
	require.True(t, logs[0].Exists)
	require.False(t, logs[0].Active)
	require.Equal(t, "reserved", logs[0].WALStatus)
	require.NotNil(t, logs[0].RetainedWALBytes)
	_, err := db.Exec(`CREATE TABLE filler (x text); INSERT INTO filler SELECT repeat('x', 100) FROM generate_series(1, 100)`)
	require.NoError(t, err)
	logs = logDoc(t, dsn)
	require.Positive(t, logs[0].LagBytes, "nobody reads the slot: it falls behind the WAL written since")
	require.GreaterOrEqual(t, *logs[0].RetainedWALBytes, logs[0].LagBytes)
	require.Regexp(t, `(?m)^outbox_outbox_events +slot +no +[\d.]+ K?i?B +[\d.]+ K?i?B +reserved +-$`, f.ok(t, "stats"))
	require.Equal(t, []logReaderJSON{{Name: "other", Kind: "slot"}}, logDoc(t, dsn, "--slot", "other"), "a named slot the server lacks")

	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{})
	require.NoError(t, err)
	lp, err := outboxpglog.New(store, noTransport(), outboxpglog.Options{Scope: outbox.Scope{Namespace: "ns"}, ConnString: dsn, Logger: discard})
	require.NoError(t, err)
	stop := runReader(t, lp.Run)
	testdb.Poll(t, 30*time.Second, "stats to show the slot active", func() bool { return logDoc(t, dsn)[0].Active })
	// Over several databases, each one's log readers under its DSN.
	many := runCLI(t, nil, "stats", "--dsn", dsn, "--dsn", dsn)
	require.Equal(t, exitOK, many.code, many.stderr)
	require.Regexp(t, `(?m)^DATABASE +LOG READER +KIND +ACTIVE +LAG +RETAINED WAL +STATUS +POSITION\n`+
		`postgres://\S+ +outbox_outbox_events +slot +yes .* reserved +-\npostgres://\S+ +outbox_outbox_events +slot +yes `, many.stdout)
	many = runCLI(t, nil, "stats", "--dsn", dsn, "--dsn", dsn, "--json")
	require.Equal(t, exitOK, many.code, many.stderr)
	type dbLog struct {
		Log []logReaderJSON `json:"log"`
	}
	var manyDoc struct {
		Databases []dbLog `json:"databases"`
		Total     dbLog   `json:"total"`
	}
	require.NoError(t, json.Unmarshal([]byte(many.stdout), &manyDoc))
	require.Len(t, manyDoc.Databases, 2)
	require.Equal(t, "outbox_outbox_events", manyDoc.Databases[1].Log[0].Name)
	require.True(t, manyDoc.Databases[1].Log[0].Active)
	require.Empty(t, manyDoc.Total.Log, "the total has no log readers")
	r := runCLI(t, nil, "--dsn", dsn, "log", "drop")
	require.Equal(t, exitFail, r.code, r.stderr)
	require.Regexp(t, `^outbox: log drop: outboxpglog: replication slot is active: server process \d+ streams slot outbox_outbox_events; stop its reader first \(nothing was dropped\)\n$`, r.stderr)
	var pubs int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM pg_publication WHERE pubname = 'outbox_outbox_events'`).Scan(&pubs))
	require.Equal(t, 1, pubs, "the refused drop left the publication")
	require.True(t, logDoc(t, dsn)[0].Exists, "and the slot")

	stop()
	testdb.Poll(t, 30*time.Second, "log drop once the stopped reader's walsender let the slot go", func() bool {
		r = runCLI(t, nil, "--dsn", dsn, "log", "drop")
		return r.code == exitOK
	})
	require.Equal(t, "dropped publication outbox_outbox_events of the inserts into outbox_events\ndropped replication slot outbox_outbox_events (pgoutput)\n", r.stdout)
	require.Empty(t, logDoc(t, dsn), "no slot left")
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM pg_publication WHERE pubname = 'outbox_outbox_events'`).Scan(&pubs))
	require.Zero(t, pubs)
	require.Equal(t, "no publication outbox_outbox_events of the inserts into outbox_events\nno replication slot outbox_outbox_events (pgoutput)\n",
		f.ok(t, "log", "drop"), "dropping again is no error")
}

// TestLogPostgresSetupErrors: log setup names what the server or the role lacks, and
// creates nothing: wal_level (the shared server's is replica), the REPLICATION attribute,
// the privileges the publication needs.
func TestLogPostgresSetupErrors(t *testing.T) {
	t.Parallel()
	shared := setup(t, "postgres")
	shared.fails(t, exitFail, "log setup: outboxpglog: wal_level is replica; set wal_level = logical in postgresql.conf and restart the server", "log", "setup")

	dsn := logicalPostgres(t)
	db := openDB(t, "pgx", dsn)
	(&fixture{dsn: dsn}).ok(t, "migrate", "up")
	nothing := func() {
		t.Helper()
		var n int
		require.NoError(t, db.QueryRow(`SELECT (SELECT count(*) FROM pg_publication) + (SELECT count(*) FROM pg_replication_slots WHERE database = current_database())`).Scan(&n))
		require.Zero(t, n, "nothing was created")
	}
	role := func(name, attrs string) string {
		t.Helper()
		_, err := db.Exec(`CREATE ROLE ` + name + ` LOGIN ` + attrs + `; GRANT SELECT ON outbox_events, outbox_events_goose_version TO ` + name)
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = db.Exec(`DROP OWNED BY ` + name + `; DROP ROLE ` + name)
		})
		return strings.Replace(dsn, "postgres://postgres@", "postgres://"+name+"@", 1)
	}
	suffix := fmt.Sprint(time.Now().UnixNano())
	norepl := &fixture{dsn: role("norepl_"+suffix, "")}
	norepl.fails(t, exitFail, "log setup: outboxpglog: the role cannot open a replication connection; give it the REPLICATION attribute (ALTER ROLE ... REPLICATION)", "log", "setup")
	nothing()
	notOwner := &fixture{dsn: role("repl_"+suffix, "REPLICATION")}
	notOwner.fails(t, exitFail, "log setup: outboxpglog: cannot create publication outbox_outbox_events; the role needs CREATE on the database and must own the table", "log", "setup")
	nothing()
	notOwner.fails(t, exitUsage, "Slot \"Bad-Name\"", "log", "setup", "--slot", "Bad-Name")
}

// TestLogMariaDB: log setup creates the position table, and again finds it; stats shows a
// reader's stored position, its lag and, once the server purged its binlog, that it is
// purged; log drop refuses while a reader holds its lock, and drops the table after.
func TestLogMariaDB(t *testing.T) {
	t.Parallel()
	dsn := binlogMariaDB(t)
	db := openDB(t, "mysql", dsn)
	f := &fixture{dsn: dsn}
	f.ok(t, "migrate", "up")
	require.Empty(t, logDoc(t, dsn))
	require.Equal(t, "created position table outbox_events_binlog_position\n", f.ok(t, "log", "setup"))
	require.Equal(t, "position table outbox_events_binlog_position exists already\n", f.ok(t, "log", "setup"))
	f.fails(t, exitUsage, "--slot names a PostgreSQL slot", "log", "setup", "--slot", "x")

	store, err := outbox.New(db, outbox.MySQL(), outbox.Options{})
	require.NoError(t, err)
	lp, err := outboxbinlog.New(store, noTransport(), outboxbinlog.Options{Scope: outbox.Scope{Namespace: "ns"}, ConnString: dsn, Logger: discard})
	require.NoError(t, err)
	stop := runReader(t, lp.Run)
	testdb.Poll(t, 30*time.Second, "stats to show the reader", func() bool {
		logs := logDoc(t, dsn)
		return len(logs) == 1 && logs[0].Active
	})
	f.fails(t, exitFail, "log drop: outboxbinlog: a binlog reader is running: reader outbox_outbox_events holds its lock; stop it first (nothing was dropped)", "log", "drop")
	stop()

	_, err = store.EnqueueStandalone(context.Background(), outbox.Message{Namespace: "ns", Topic: "t", Payload: []byte(`{}`)})
	require.NoError(t, err)
	logs := logDoc(t, dsn)
	require.Len(t, logs, 1)
	l := logs[0]
	require.Equal(t, "outbox_outbox_events", l.Name)
	require.Equal(t, "binlog", l.Kind)
	require.True(t, l.Exists)
	require.False(t, l.Active)
	require.False(t, *l.Purged)
	require.NotEmpty(t, l.GTID, "MariaDB keeps GTIDs")
	require.Positive(t, l.LagBytes, "the row written since the reader stopped")
	require.Regexp(t, `(?m)^outbox_outbox_events +binlog +no +[\d.]+ K?i?B +- +available +`+strings.ReplaceAll(l.File, ".", `\.`)+`:\d+ \(server at \S+:\d+\)$`, f.ok(t, "stats"))

	_, err = db.Exec(`FLUSH BINARY LOGS`)
	require.NoError(t, err)
	var end string
	require.NoError(t, db.QueryRow(`SHOW MASTER STATUS`).Scan(&end, new(int64), new(sql.NullString), new(sql.NullString)))
	// The server keeps a binlog that crash recovery may still need until its transactions
	// are checkpointed, and purges nothing meanwhile.
	testdb.Poll(t, 30*time.Second, "the server to purge the stored position's binlog", func() bool {
		_, err := db.Exec(`PURGE BINARY LOGS TO '` + end + `'`)
		require.NoError(t, err)
		var first string
		require.NoError(t, db.QueryRow(`SHOW BINARY LOGS`).Scan(&first, new(int64)))
		return first == end
	})
	l = logDoc(t, dsn)[0]
	require.True(t, *l.Purged, "the stored position's binlog %s is gone", l.File)
	require.Zero(t, l.LagBytes)
	require.Equal(t, end, l.ServerFile)
	out := f.ok(t, "stats")
	require.Regexp(t, `(?m)^outbox_outbox_events +binlog +no +- +- +purged +`, out)
	require.Contains(t, out, "purged positions (outbox_outbox_events): the binlog there is gone; the reader starts again at the server's current position")

	require.Equal(t, "dropped position table outbox_events_binlog_position\n", f.ok(t, "log", "drop"))
	require.Empty(t, logDoc(t, dsn))
	require.Equal(t, "no position table outbox_events_binlog_position\n", f.ok(t, "log", "drop"))
}

// TestLogMariaDBSetupErrors: log setup names the privilege the user lacks, and creates
// nothing.
func TestLogMariaDBSetupErrors(t *testing.T) {
	t.Parallel()
	dsn := binlogMariaDB(t)
	db := openDB(t, "mysql", dsn)
	(&fixture{dsn: dsn}).ok(t, "migrate", "up")
	cfg, err := mysql.ParseDSN(dsn)
	require.NoError(t, err)
	user := fmt.Sprintf("u%d", time.Now().UnixNano()%1e9)
	_, err = db.Exec(`CREATE USER '` + user + `'@'%'`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`DROP USER '` + user + `'@'%'`) })
	_, err = db.Exec(`GRANT ALL ON ` + cfg.DBName + `.* TO '` + user + `'@'%'`)
	require.NoError(t, err)
	cfg.User = user
	f := &fixture{dsn: cfg.FormatDSN()}
	f.fails(t, exitFail, "log setup: outboxbinlog: the Store's user cannot read the binlog status; grant it REPLICATION CLIENT (MariaDB 10.5+: BINLOG MONITOR)", "log", "setup")
	var n int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'outbox_events_binlog_position'`).Scan(&n))
	require.Zero(t, n, "nothing was created")
}

// TestLogSQLite: SQLite has no log; log setup says so as bad input.
func TestLogSQLite(t *testing.T) {
	t.Parallel()
	setup(t, "sqlite").fails(t, exitUsage, "SQLite has none to set up", "log", "setup")
}
