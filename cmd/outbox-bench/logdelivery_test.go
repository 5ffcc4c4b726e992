package main

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/outboxgo/outbox/outboxtest/mariadbserver"
	"github.com/outboxgo/outbox/outboxtest/pgserver"
)

// The MariaDB counters of the log-delivery costs count what they claim: rows an UPDATE
// changed (not its unchanged rows, not INSERTs), every binlog file across a rotation, the
// redo log, and the server's CPU.
func TestMariaDBLogCounters(t *testing.T) {
	srv, err := mariadbserver.Start(append(slices.Clone(mariadbserver.Binlog), mariadbserver.Fast...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b := &myBackend{dsn: srv.DSN("")}
	defer b.teardown()
	if err := b.setup(ctx); err != nil {
		t.Fatal(err)
	}
	l := &myLog{b: b, pidFile: filepath.Join(srv.Dir(), "mysqld.pid")}
	exec := func(q string) {
		t.Helper()
		if _, err := b.db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`CREATE TABLE lc (id INT PRIMARY KEY, v INT NOT NULL)`)
	c0, err := l.counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	exec(`INSERT INTO lc SELECT seq, 0 FROM seq_1_to_30`)
	exec(`FLUSH BINARY LOGS`) // a rotation inside the window
	exec(`UPDATE lc SET v = 1 WHERE id <= 20`)
	exec(`UPDATE lc SET v = v`) // changes no row
	exec(`DO BENCHMARK(3000000, MD5('outbox'))`)
	c1, err := l.counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := c1.Updates - c0.Updates; got != 20 {
		t.Errorf("updates in the window: %d, want 20", got)
	}
	if c1.WAL <= c0.WAL {
		t.Errorf("redo log did not grow: %v to %v", c0.WAL, c1.WAL)
	}
	files, err := filepath.Glob(filepath.Join(srv.Dir(), "binlog.[0-9]*"))
	if err != nil || len(files) < 2 {
		t.Fatalf("binlog files %v (%v), want at least two after a rotation", files, err)
	}
	var onDisk float64
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		onDisk += float64(st.Size())
	}
	if c1.Binlog != onDisk {
		t.Errorf("binlog bytes %v, the files hold %v", c1.Binlog, onDisk)
	}
	if c1.CPU <= c0.CPU {
		t.Errorf("server CPU did not grow: %v to %v", c0.CPU, c1.CPU)
	}
}

// The PostgreSQL counters count the outbox table's updates once its backends have
// exited, and the CPU of a backend that exited inside the window.
func TestPostgresLogCounters(t *testing.T) {
	srv, err := pgserver.Start(pgserver.Fast...)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b := &pgBackend{dsn: srv.DSN("postgres")}
	defer b.teardown()
	if err := b.setup(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.loadPending(ctx, mainTable, 30, time.Now(), 0); err != nil {
		t.Fatal(err)
	}
	l := &pgLog{b: b, pidFile: filepath.Join(srv.Dir(), "data", "postmaster.pid")}
	c0, err := l.counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A pool of its own, closed before the counters are read, as a window's are.
	db, err := sql.Open("pgx", b.benchDSN)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`UPDATE ` + mainTable + ` SET attempts = 1 WHERE id IN (SELECT id FROM ` + mainTable + ` ORDER BY id LIMIT 20)`,
		`SELECT count(*) FROM generate_series(1, 5000000)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	_ = db.Close()
	if err := l.quiesce(ctx); err != nil {
		t.Fatal(err)
	}
	c1, err := l.counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := c1.Updates - c0.Updates; got != 20 {
		t.Errorf("updates in the window: %d, want 20", got)
	}
	if c1.WAL <= c0.WAL {
		t.Errorf("WAL did not grow: %v to %v", c0.WAL, c1.WAL)
	}
	if c1.CPU-c0.CPU < 0.05 {
		t.Errorf("server CPU grew by %.3fs over a backend's count of five million rows", c1.CPU-c0.CPU)
	}
}
