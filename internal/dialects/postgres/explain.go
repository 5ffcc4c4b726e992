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
// missing outbox table.
func (d *Dialect) ExplainError(err error, p dialect.ExplainParams) error {
	var state interface{ SQLState() string }
	if errors.As(err, &state) && state.SQLState() == "42P01" {
		return sqlkit.MissingTable(d.Name(), p.Table, err)
	}
	return nil
}

// CheckServer implements [dialect.Checker]: CockroachDB, YugabyteDB before 2025.2.3
// with wake-ups, and an outbox table that Citus distributes are refused.
func (d *Dialect) CheckServer(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ServerParams) error {
	info, err := d.serverInfo(ctx, db, t)
	return sqlkit.CheckServer(info, err, p)
}
