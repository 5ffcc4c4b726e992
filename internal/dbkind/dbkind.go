// Package dbkind tells which kind of database a pool talks to, for the checks that catch a
// dialect or a migration directory used on the wrong database.
package dbkind

import (
	"context"
	"database/sql"
	"strings"
)

// Detect names the kind of database behind db ("postgres", "mysql" or "sqlite", as the
// built-in dialects are named) and describes it for people, such as "PostgreSQL 15.4". It
// returns an empty kind for a server it does not recognise, and an error only when db
// cannot be reached.
func Detect(ctx context.Context, db *sql.DB) (kind, desc string, err error) {
	if err := db.PingContext(ctx); err != nil {
		return "", "", err
	}
	var v string
	if err := db.QueryRowContext(ctx, `SELECT version()`).Scan(&v); err == nil {
		switch {
		case strings.HasPrefix(v, "PostgreSQL"):
			desc, _, _ = strings.Cut(v, " on ") // "PostgreSQL 15.4 (Debian ...) on x86_64-..."
			return "postgres", desc, nil
		case strings.Contains(strings.ToLower(v), "mariadb"):
			return "mysql", "MariaDB " + strings.SplitN(v, "-", 2)[0], nil
		case v != "" && v[0] >= '0' && v[0] <= '9':
			return "mysql", "MySQL " + v, nil
		}
		return "", v, nil
	}
	if err := db.QueryRowContext(ctx, `SELECT sqlite_version()`).Scan(&v); err == nil {
		return "sqlite", "SQLite " + v, nil
	}
	return "", "an unrecognised database", nil
}
