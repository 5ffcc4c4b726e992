package postgres

import (
	"context"
	"database/sql"
	"errors"
	"strings"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// serverInfo reads what sqlkit.JudgeServer needs: the version, and whether Citus is installed and
// distributes the table. CockroachDB is recognised from its version alone.
func (d *Dialect) serverInfo(ctx context.Context, db *sql.DB, t dialect.Table) (sqlkit.ServerInfo, error) {
	var info sqlkit.ServerInfo
	if err := db.QueryRowContext(ctx, `SELECT version()`).Scan(&info.Version); err != nil {
		return info, err
	}
	if product, _ := sqlkit.DistributedProduct(info.Version); product != "" || !strings.HasPrefix(info.Version, "PostgreSQL") {
		return info, nil
	}
	err := db.QueryRowContext(ctx, `SELECT extversion FROM pg_extension WHERE extname = 'citus'`).Scan(&info.Citus)
	if errors.Is(err, sql.ErrNoRows) {
		return info, nil
	} else if err != nil {
		return info, err
	}
	err = db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass($1))`,
		pgTable(t)).Scan(&info.CitusDistributed)
	return info, err
}
