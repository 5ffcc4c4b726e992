package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// sqliteAt binds a time as the Unix microseconds SQLite stores.
func sqliteAt(a *dialect.Args, t time.Time) string { return a.Add(t.UnixMicro()) }

// sqliteIndex renders INDEXED BY for one of the table's named indexes.
func sqliteIndex(t dialect.Table, purpose string) string {
	return ` INDEXED BY ` + sqlkit.QuoteIdent(t.Index(purpose), '"')
}

// Stats reads the live rows through the partial claim index, the dead rows and the
// delivered sample through the partial retention index. SQLite keeps no row estimates; the
// table's rows are estimated from its rowids instead (max - min + 1, two lookups: rows are
// appended with growing rowids and purged oldest first, so only rows deleted out of order,
// by Discard, make it high), less the live and dead rows counted. An exact COUNT(*) of a
// million delivered rows reads every entry of the retention index, a second or more here.
func (Dialect) Stats(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.StatsParams) (dialect.StatsSample, error) {
	tbl := sqlkit.QuoteIdent(t.Name(), '"')
	due := `status = 'pending' AND next_attempt_at <= ` + sqliteNow
	la, da := &dialect.Args{}, &dialect.Args{}
	r := sqlkit.StatsReads{
		Live: `SELECT namespace, topic, COALESCE(SUM(` + due + `), 0),` +
			` COALESCE(SUM(status = 'pending' AND next_attempt_at > ` + sqliteNow + `), 0), COALESCE(SUM(status = 'processing'), 0),` +
			` COALESCE(` + sqliteNow + ` - MIN(CASE WHEN ` + due + ` THEN next_attempt_at END), 0),` +
			` COALESCE(` + sqliteNow + ` - MIN(` + sqlkit.SQLFirstDue(sqliteNow) + `), 0)` +
			` FROM ` + tbl + sqliteIndex(t, "claim") + ` WHERE status IN ('pending', 'processing')` + sqlkit.ScopeSQL(la, p.Scope, "", sqlkit.UUIDBytes) +
			` GROUP BY namespace, topic`,
		Dead: `SELECT namespace, topic, COUNT(*) FROM ` + tbl + sqliteIndex(t, "retention") + ` WHERE ` + sqlkit.Retained(dialect.StatusDead) +
			sqlkit.ScopeSQL(da, p.Scope, "", sqlkit.UUIDBytes) + ` GROUP BY namespace, topic`,
		Sample: sqlkit.SampleSQL(`SELECT namespace, topic, tenant_id, updated_at FROM `+tbl+sqliteIndex(t, "retention")+
			` WHERE `+sqlkit.Retained(dialect.StatusDelivered)+` ORDER BY updated_at DESC LIMIT ?`,
			func(lo string) string { return `COALESCE(` + sqliteNow + ` - ` + lo + `, 0)` }),
		SampleArgs: []any{p.DeliveredSample},
		Total: func(counted int64) (n int64, err error) {
			// Two subqueries: SQLite reads min or max alone from the end of the rowid
			// b-tree, but scans the table for both in one select.
			err = q.QueryRowContext(ctx, `SELECT COALESCE((SELECT max(rowid) FROM `+tbl+`) - (SELECT min(rowid) FROM `+tbl+`) + 1, 0)`).Scan(&n)
			return n - counted, err
		},
	}
	r.LiveArgs, r.DeadArgs = la.Values, da.Values
	return sqlkit.RunStatsReads(ctx, q, p.Scope, p.DeliveredSample, r)
}

// ListDead walks the partial retention index (status, updated_at) backwards.
func (Dialect) ListDead(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ListDeadParams) ([]dialect.Record, error) {
	a := &dialect.Args{}
	query := `SELECT ` + sqlkit.SelectList(sqlkit.RecordColumns, "", nil) + ` FROM ` + sqlkit.QuoteIdent(t.Name(), '"') + sqliteIndex(t, "retention") +
		` WHERE ` + sqlkit.DeadWhere(a, p, sqliteAt, sqlkit.UUIDBytes, sqliteContains) + ` ORDER BY updated_at DESC, id DESC LIMIT ` + a.Add(p.Limit)
	return sqlkit.QueryAll(ctx, q, query, a.Values, sqlkit.ScanRecord)
}

// Replay is one UPDATE ... RETURNING in autocommit, in the pool's turn with the library's
// other writes.
func (d Dialect) Replay(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ReplayParams) (ids []uuid.UUID, err error) {
	err = d.write(ctx, db, func(q, _ dialect.DBTX) error {
		a := &dialect.Args{}
		query := `UPDATE ` + sqlkit.QuoteIdent(t.Name(), '"') + ` SET status = 'pending', attempts = 0, next_attempt_at = ` + sqliteNow +
			`, locked_by = NULL, locked_until = NULL, lease_token = ` + a.Add(sqlkit.UUIDBytes(p.Token)) +
			`, replays = replays + 1, updated_at = ` + sqliteStamp +
			` WHERE id IN ` + a.List(len(p.IDs), func(i int) any { return sqlkit.UUIDBytes(p.IDs[i]) }) + ` AND status = 'dead' RETURNING id`
		ids, err = dialect.QueryIDs(ctx, q, query, a.Values...)
		return err
	})
	return ids, err
}

// Discard is one DELETE ... RETURNING in autocommit.
func (d Dialect) Discard(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.DiscardParams) (ids []uuid.UUID, err error) {
	err = d.write(ctx, db, func(q, _ dialect.DBTX) error {
		a := &dialect.Args{}
		ids, err = dialect.QueryIDs(ctx, q, `DELETE FROM `+sqlkit.QuoteIdent(t.Name(), '"')+` WHERE id IN `+
			a.List(len(p.IDs), func(i int) any { return sqlkit.UUIDBytes(p.IDs[i]) })+` AND status = 'dead' RETURNING id`, a.Values...)
		return err
	})
	return ids, err
}

// sqlitePurgeSQL renders one purge batch: the oldest rows of the status by the partial
// retention index, deleted in one autocommit statement. SQLite has one writer, so
// concurrent purgers simply take turns.
func sqlitePurgeSQL(t dialect.Table, status dialect.Status) string {
	tbl := sqlkit.QuoteIdent(t.Name(), '"')
	return `DELETE FROM ` + tbl + ` WHERE id IN (SELECT id FROM ` + tbl + sqliteIndex(t, "retention") +
		` WHERE ` + sqlkit.Retained(status) + ` AND updated_at < ` + sqliteNow + ` - ? ORDER BY updated_at LIMIT ?)`
}

func (d Dialect) Purge(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.PurgeParams) (n int64, err error) {
	if p.Status != dialect.StatusDelivered && p.Status != dialect.StatusDead {
		return 0, fmt.Errorf("purge of %q rows: only delivered and dead rows may be purged", p.Status)
	}
	err = d.write(ctx, db, func(q, _ dialect.DBTX) error {
		res, err := q.ExecContext(ctx, sqlitePurgeSQL(t, p.Status), sqlkit.Micros(p.OlderThan), p.Limit)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return n, err
}
