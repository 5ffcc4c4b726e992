package mysql

import (
	"context"
	"database/sql"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// serverInfo reads what sqlkit.JudgeServer needs: the version.
func (d Dialect) serverInfo(ctx context.Context, db *sql.DB, _ dialect.Table) (sqlkit.ServerInfo, error) {
	var info sqlkit.ServerInfo
	err := db.QueryRowContext(ctx, `SELECT version()`).Scan(&info.Version)
	return info, err
}
