package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// CheckFirstUse implements [dialect.Checker]: the pool must be PostgreSQL.
func (d *Dialect) CheckFirstUse(ctx context.Context, drv driver.Driver, tx dialect.DBTX) error {
	_, err := sqlkit.CheckKind(ctx, d.Name(), drv, tx)
	return err
}

// ExplainError implements [dialect.Checker]: undefined_table (SQLSTATE 42P01) is the
// missing outbox table; duplicate_prepared_statement (42P05) and
// invalid_sql_statement_name (26000) are a driver's prepared statements behind a
// transaction-pooling proxy.
func (d *Dialect) ExplainError(err error, p dialect.ExplainParams) error {
	var state interface{ SQLState() string }
	if !errors.As(err, &state) {
		return nil
	}
	switch state.SQLState() {
	case "42P01":
		return sqlkit.MissingTable(d.Name(), p.Table, err)
	case "42P05", "26000":
		return PreparedBehindPooler(err)
	}
	return nil
}

// PreparedBehindPooler returns the [*dialect.CheckError] of err, a statement's failure
// because a prepared statement of the connection already exists (SQLSTATE 42P05) or does
// not (26000): the sign of a driver that prepares statements (pgx's default, which caches
// them per connection) talking through a transaction-pooling proxy, which runs each
// transaction on whichever server connection is free, where the driver's statements are
// another client's or missing. Retrying does not help: the settings must change.
func PreparedBehindPooler(err error) *dialect.CheckError {
	return &dialect.CheckError{
		Problem: "a prepared statement of this connection is missing or another client's on the server, as happens " +
			"through a transaction-pooling proxy (PgBouncer pool_mode=transaction, say) when the driver prepares statements",
		Fix: "add default_query_exec_mode=exec (or simple_protocol) to the pgx DSN, or use PgBouncer 1.21 or later " +
			"with max_prepared_statements set above 0, or session pooling",
		Err: err,
	}
}

// CheckServer implements [dialect.Checker]: CockroachDB, YugabyteDB before 2025.2.3
// with wake-ups, and an outbox table that Citus distributes are refused.
func (d *Dialect) CheckServer(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ServerParams) error {
	info, err := d.serverInfo(ctx, db, t)
	return sqlkit.CheckServer(info, err, p)
}
