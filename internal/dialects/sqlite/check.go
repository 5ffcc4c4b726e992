package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// sqliteDSN is the connection string the SQLite checks recommend.
const sqliteDSN = "file:app.db?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate"

// Check implements [dialect.Checker]. Besides the table and its due index, it reads the connection's journal mode and
// busy timeout: without WAL, readers block the writer, and without a busy timeout a writer
// that finds the database locked fails at once with SQLITE_BUSY instead of waiting its
// turn. An in-memory database (journal mode "memory") needs neither.
func (d Dialect) Check(ctx context.Context, db *sql.DB, t dialect.Table) error {
	err := sqlkit.CheckTables(ctx, db, d.Name(), t, func(ctx context.Context, db *sql.DB, table string) ([]string, error) {
		return sqlkit.QueryStrings(ctx, db, `SELECT name FROM pragma_table_info(?)`, table)
	}, map[string][]string{t.Name(): sqlkit.RecordColumns})
	if err != nil {
		return err
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND name = ?`,
		t.Name(), t.Index("due")).Scan(&n); err != nil {
		return err
	}
	if err := sqlkit.CheckDueIndex(d.Name(), t, n > 0); err != nil {
		return err
	}
	// One connection answers both, so the pair describes one connection of the pool.
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	var mode string
	var timeout int
	if err := conn.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		return err
	}
	if err := conn.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&timeout); err != nil {
		return err
	}
	return sqliteSettings(mode, timeout)
}

// sqliteSettings judges a connection's journal mode and busy timeout: nil, or the error
// that says what to change.
func sqliteSettings(mode string, timeout int) error {
	mode = strings.ToLower(mode)
	if mode == "memory" || (mode == "wal" && timeout > 0) {
		return nil
	}
	return &dialect.CheckError{
		Problem: fmt.Sprintf("SQLite runs with journal_mode=%s and busy_timeout=%dms: concurrent writers will fail with "+
			"SQLITE_BUSY (database is locked)", mode, timeout),
		Fix: "open it with journal_mode WAL, a busy timeout and immediate transactions, as in the DSN " + sqliteDSN,
	}
}

// CheckOrdered implements [dialect.OrderedClaimer]: the order index and the unkeyed index.
func (d Dialect) CheckOrdered(ctx context.Context, db *sql.DB, t dialect.Table) error {
	want := []string{t.Index("order"), t.Index("unkeyed")}
	names, err := sqlkit.QueryStrings(ctx, db, `SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND name IN (?, ?)`,
		t.Name(), want[0], want[1])
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, n := range names {
		have["index "+n] = true
	}
	exists := true
	if len(have) < len(want) {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?`, t.Name()).Scan(&n); err != nil {
			return err
		}
		exists = n > 0
	}
	return sqlkit.CheckOrderedTable(d.Name(), t, exists, []string{"index " + want[0], "index " + want[1]}, have)
}
