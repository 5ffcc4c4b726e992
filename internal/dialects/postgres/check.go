package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// Check implements [dialect.Checker]: the table's columns, and its due index among the
// table's own indexes, valid (a failed CREATE INDEX CONCURRENTLY leaves an invalid one,
// which claims would not read).
func (d *Dialect) Check(ctx context.Context, db *sql.DB, t dialect.Table) error {
	err := sqlkit.CheckTables(ctx, db, d.Name(), t, func(ctx context.Context, db *sql.DB, table string) ([]string, error) {
		return sqlkit.QueryStrings(ctx, db, `SELECT attname FROM pg_attribute WHERE attrelid = to_regclass($1)`+
			` AND attnum > 0 AND NOT attisdropped`, pgQualify(t.Schema(), table))
	}, map[string][]string{t.Name(): sqlkit.RecordColumns})
	if err != nil {
		return err
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid`+
		` WHERE x.indrelid = to_regclass($1) AND c.relname = $2 AND x.indisvalid`, pgTable(t), t.Index("due")).Scan(&n); err != nil {
		return err
	}
	return sqlkit.CheckDueIndex(d.Name(), t, n > 0)
}

// CheckOrdered implements [dialect.OrderedClaimer]: the order index and the unkeyed index, found
// among the table's own indexes (so in its schema, whichever the search_path resolves the
// table to), and valid. A CREATE INDEX CONCURRENTLY that failed leaves an invalid index,
// which PostgreSQL maintains but never reads, and which the migration's CREATE INDEX IF NOT
// EXISTS would skip.
func (d *Dialect) CheckOrdered(ctx context.Context, db *sql.DB, t dialect.Table) error {
	want := []string{t.Index("order"), t.Index("unkeyed")}
	rows, err := db.QueryContext(ctx, `SELECT c.relname, x.indisvalid FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid`+
		` WHERE x.indrelid = to_regclass($1) AND c.relname IN ($2, $3)`, pgTable(t), want[0], want[1])
	if err != nil {
		return err
	}
	defer rows.Close()
	have := map[string]bool{}
	var invalid []string
	for rows.Next() {
		var name string
		var valid bool
		if err := rows.Scan(&name, &valid); err != nil {
			return err
		}
		have["index "+name] = true
		if !valid {
			invalid = append(invalid, name)
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(invalid) > 0 {
		slices.Sort(invalid)
		rebuild := make([]string, len(invalid))
		for i, n := range invalid {
			rebuild[i] = "REINDEX INDEX CONCURRENTLY " + pgQualify(t.Schema(), n)
		}
		return &dialect.CheckError{
			Problem: fmt.Sprintf("index %s of table %q is invalid (a CREATE INDEX CONCURRENTLY failed), so ordered claims would read the whole table",
				strings.Join(invalid, " and "), t.Name()),
			Fix: "rebuild it: " + strings.Join(rebuild, "; "),
		}
	}
	exists := true
	if len(have) < len(want) {
		if err := db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgTable(t)).Scan(&exists); err != nil {
			return err
		}
	}
	return sqlkit.CheckOrderedTable(d.Name(), t, exists, []string{"index " + want[0], "index " + want[1]}, have)
}
