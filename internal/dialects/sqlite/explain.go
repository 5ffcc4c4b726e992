package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"strings"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// CheckFirstUse implements [dialect.Checker]: the pool must be SQLite, and the
// caller's connection must run in WAL mode with a busy timeout (sqliteSettings), read with
// PRAGMA journal_mode and PRAGMA busy_timeout on the caller's transaction.
func (d Dialect) CheckFirstUse(ctx context.Context, drv driver.Driver, tx dialect.DBTX) error {
	same, err := sqlkit.CheckKind(ctx, d.Name(), drv, tx)
	if !same || err != nil {
		return err
	}
	var mode string
	var timeout int
	if err := tx.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		return err
	}
	if err := tx.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&timeout); err != nil {
		return err
	}
	return sqliteSettings(mode, timeout)
}

// CheckServer implements [dialect.Checker]: no server imitates SQLite, a library in the
// process.
func (Dialect) CheckServer(context.Context, *sql.DB, dialect.Table, dialect.ServerParams) error {
	return nil
}

// ExplainError implements [dialect.Checker]: "no such table" is the missing outbox
// table.
func (d Dialect) ExplainError(err error, p dialect.ExplainParams) error {
	if strings.Contains(err.Error(), "no such table") {
		return sqlkit.MissingTable(d.Name(), p.Table, err)
	}
	return nil
}
