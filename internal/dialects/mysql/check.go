package mysql

import (
	"context"
	"database/sql"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// Check implements [dialect.Checker]. MySQL keeps dedupe keys in a second table, <table>_dedupe,
// and their lock stripes in a third, <table>_dedupe_lock. The outbox table must also have
// its due index, which claims name.
func (d Dialect) Check(ctx context.Context, db *sql.DB, t dialect.Table) error {
	err := sqlkit.CheckTables(ctx, db, d.Name(), t, func(ctx context.Context, db *sql.DB, table string) ([]string, error) {
		return sqlkit.QueryStrings(ctx, db, `SELECT column_name FROM information_schema.columns`+
			` WHERE table_schema = DATABASE() AND table_name = ?`, table)
	}, map[string][]string{
		t.Name():                  sqlkit.RecordColumns,
		t.Name() + "_dedupe":      {"namespace", "topic", "dedupe_key", "id"},
		t.Name() + "_dedupe_lock": {"stripe"},
	})
	if err != nil {
		return err
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.statistics`+
		` WHERE table_schema = DATABASE() AND table_name = ? AND index_name = ?`, t.Name(), t.Index("due")).Scan(&n); err != nil {
		return err
	}
	return sqlkit.CheckDueIndex(d.Name(), t, n > 0)
}

// CheckOrdered implements [dialect.OrderedClaimer]: the virtual column order_key and the order
// index on it, in the connection's database.
func (d Dialect) CheckOrdered(ctx context.Context, db *sql.DB, t dialect.Table) error {
	var tables, columns, indexes int
	err := db.QueryRowContext(ctx, `SELECT`+
		` (SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?),`+
		` (SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = ? AND column_name = 'order_key'),`+
		` (SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = ? AND index_name = ?)`,
		t.Name(), t.Name(), t.Name(), t.Index("order")).Scan(&tables, &columns, &indexes)
	if err != nil {
		return err
	}
	col, idx := "column order_key", "index "+t.Index("order")
	return sqlkit.CheckOrderedTable(d.Name(), t, tables > 0, []string{col, idx}, map[string]bool{col: columns > 0, idx: indexes > 0})
}
