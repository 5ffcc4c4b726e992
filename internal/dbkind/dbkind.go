// Package dbkind tells which kind of database a pool talks to, for the checks that catch a
// dialect or a migration directory used on the wrong database.
package dbkind

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"reflect"
	"strings"
)

// Querier is what *sql.DB, *sql.Tx and *sql.Conn have in common that the detection needs.
type Querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

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
		kind, desc = Describe(v)
		return kind, desc, nil
	}
	if err := db.QueryRowContext(ctx, `SELECT sqlite_version()`).Scan(&v); err == nil {
		return "sqlite", "SQLite " + v, nil
	}
	if err := ctx.Err(); err != nil {
		return "", "", err // the queries failed because the caller gave up, not for want of a kind
	}
	return "", "an unrecognised database", nil
}

// Describe names the kind of server whose SELECT version() answered v, and describes it
// for people; the kind is empty for a server it does not recognise.
func Describe(v string) (kind, desc string) {
	switch {
	case strings.HasPrefix(v, "PostgreSQL"):
		desc, _, _ = strings.Cut(v, " on ") // "PostgreSQL 15.4 (Debian ...) on x86_64-..."
		return "postgres", desc
	case strings.Contains(strings.ToLower(v), "mariadb"):
		return "mysql", "MariaDB " + strings.SplitN(v, "-", 2)[0]
	case v != "" && v[0] >= '0' && v[0] <= '9':
		return "mysql", "MySQL " + v
	}
	return "", v
}

// driverKinds maps the package of a database/sql driver to the kind of database it speaks to.
var driverKinds = map[string]string{
	"github.com/jackc/pgx/v5/stdlib":       "postgres",
	"github.com/jackc/pgx/v4/stdlib":       "postgres",
	"github.com/lib/pq":                    "postgres",
	"github.com/go-sql-driver/mysql":       "mysql",
	"modernc.org/sqlite":                   "sqlite",
	"github.com/mattn/go-sqlite3":          "sqlite",
	"github.com/ncruces/go-sqlite3/driver": "sqlite",
}

// FromDriver names the kind of database a driver speaks to, from the package that defines
// its type, without a query; "" for a driver it does not know (one wrapped by a tracing
// package, say).
func FromDriver(d driver.Driver) string {
	if d == nil {
		return ""
	}
	t := reflect.TypeOf(d)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return driverKinds[t.PkgPath()]
}

// Version asks q, on a database of the given kind, for its version and describes it, with
// a statement that is valid on that kind: a failed statement would abort a PostgreSQL
// transaction. An unknown kind is asked SELECT version(), valid on PostgreSQL and MySQL,
// and then, if that failed (on SQLite, whose transactions a failed statement leaves
// intact), SELECT sqlite_version(). found is false when the kind is unrecognised.
func Version(ctx context.Context, q Querier, kind string) (found, desc string, err error) {
	var v string
	if kind != "sqlite" {
		err = q.QueryRowContext(ctx, `SELECT version()`).Scan(&v)
		if err == nil {
			found, desc = Describe(v)
			return found, desc, nil
		}
		if kind != "" {
			return "", "", err
		}
	}
	if err := q.QueryRowContext(ctx, `SELECT sqlite_version()`).Scan(&v); err != nil {
		return "", "", err
	}
	return "sqlite", "SQLite " + v, nil
}
