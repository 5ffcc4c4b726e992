package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// tableExists reports whether a table of that name exists where goose looks for its
// version table: PostgreSQL's current schema or the schema of a name "schema.table",
// MySQL's current database, SQLite's main database.
func tableExists(ctx context.Context, db *sql.DB, dialect, name string) (bool, error) {
	var q string
	args := []any{name}
	switch dialect {
	case "postgres":
		schema, table, _ := strings.Cut(name, ".")
		if table == "" {
			schema, table = "", name
		}
		q = `SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = coalesce(nullif($2, ''), current_schema()) AND tablename = $1`
		args = []any{table, schema}
	case "mysql":
		q = `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?`
	case "sqlite":
		q = `SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?`
	default:
		return false, fmt.Errorf("no catalog query for dialect %q: %w", dialect, errors.ErrUnsupported)
	}
	var n int
	if err := db.QueryRowContext(ctx, q, args...).Scan(&n); err != nil {
		return false, fmt.Errorf("look for table %s: %w", name, err)
	}
	return n > 0, nil
}
