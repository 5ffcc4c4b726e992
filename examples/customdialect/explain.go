package customdialect

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxgo/outbox/dialect"
)

// CheckFirstUse runs on the caller's transaction at a store's first enqueue, so that a
// pool of another database fails there, saying so, rather than with a syntax error. The
// pgx driver opens only PostgreSQL, so it passes without a query. Behind another driver it
// asks the server's version: SELECT version() answers on PostgreSQL and MySQL, and fails
// on SQLite, which leaves its transaction usable, so SQLite is asked sqlite_version(). A
// server that answers neither is not judged (its error is returned): Check will say what
// it is.
func (*Dialect) CheckFirstUse(ctx context.Context, drv driver.Driver, tx dialect.DBTX) error {
	if _, ok := drv.(*stdlib.Driver); ok {
		return nil
	}
	var version string
	if err := tx.QueryRowContext(ctx, `SELECT version()`).Scan(&version); err != nil {
		if tx.QueryRowContext(ctx, `SELECT sqlite_version()`).Scan(&version) != nil {
			return err
		}
		version = "SQLite " + version
	}
	if strings.HasPrefix(version, "PostgreSQL") {
		return nil
	}
	return &dialect.CheckError{
		Problem: fmt.Sprintf("the database is %s, not PostgreSQL", version),
		Fix:     "open a PostgreSQL database with the pgx driver for this dialect",
	}
}

// ExplainError turns PostgreSQL's undefined_table (SQLSTATE 42P01) into the setup problem
// it is: the table was never created here.
func (*Dialect) ExplainError(err error, p dialect.ExplainParams) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "42P01" {
		return &dialect.CheckError{
			Problem: fmt.Sprintf("table %q does not exist", p.Table.Name()),
			Fix:     fmt.Sprintf("run customdialect.Up(ctx, db, %q)", p.Table.Name()),
			Err:     err,
		}
	}
	return nil
}

// CheckServer refuses CockroachDB, which speaks PostgreSQL's protocol but has no
// LISTEN/NOTIFY, when the store sends wake-ups: every enqueue's pg_notify would fail there.
func (*Dialect) CheckServer(ctx context.Context, db *sql.DB, _ dialect.Table, p dialect.ServerParams) error {
	var version string
	if err := db.QueryRowContext(ctx, `SELECT version()`).Scan(&version); err != nil {
		return err
	}
	if p.Notify && strings.HasPrefix(version, "CockroachDB") {
		return &dialect.CheckError{
			Problem: "the server is " + version + ", which has no LISTEN/NOTIFY: every enqueue's signal would fail",
			Fix:     "set outbox.Options{DisableNotify: true}, and publishers poll",
		}
	}
	return nil
}
