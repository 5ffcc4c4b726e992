package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
)

// sqliteAt binds a time as the Unix microseconds SQLite stores.
func sqliteAt(a *args, t time.Time) string { return a.Add(t.UnixMicro()) }

// sqliteIndex renders INDEXED BY for one of the table's named indexes.
func sqliteIndex(t dialect.Table, purpose string) string {
	return ` INDEXED BY ` + quoteIdent(t.Index(purpose), '"')
}

// Stats reads the live rows through the partial claim index, the dead rows and the
// delivered sample through the partial retention index. SQLite keeps no row estimates; the
// table's rows are estimated from its rowids instead (max - min + 1, two lookups: rows are
// appended with growing rowids and purged oldest first, so only rows deleted out of order,
// by Discard, make it high), less the live and dead rows counted. An exact COUNT(*) of a
// million delivered rows reads every entry of the retention index, a second or more here.
func (sqliteDialect) Stats(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.StatsParams) (dialect.StatsSample, error) {
	tbl := quoteIdent(t.Name(), '"')
	due := `status = 'pending' AND next_attempt_at <= ` + sqliteNow
	la, da := &args{}, &args{}
	r := statsReads{
		live: `SELECT namespace, topic, COALESCE(SUM(` + due + `), 0),` +
			` COALESCE(SUM(status = 'pending' AND next_attempt_at > ` + sqliteNow + `), 0), COALESCE(SUM(status = 'processing'), 0),` +
			` COALESCE(` + sqliteNow + ` - MIN(CASE WHEN ` + due + ` THEN next_attempt_at END), 0),` +
			` COALESCE(` + sqliteNow + ` - MIN(` + sqlFirstDue(sqliteNow) + `), 0)` +
			` FROM ` + tbl + sqliteIndex(t, "claim") + ` WHERE status IN ('pending', 'processing')` + scopeSQL(la, p.Scope, "", uuidBytes) +
			` GROUP BY namespace, topic`,
		dead: `SELECT namespace, topic, COUNT(*) FROM ` + tbl + sqliteIndex(t, "retention") + ` WHERE ` + sqliteRetained(StatusDead) +
			scopeSQL(da, p.Scope, "", uuidBytes) + ` GROUP BY namespace, topic`,
		sample: sampleSQL(`SELECT namespace, topic, tenant_id, updated_at FROM `+tbl+sqliteIndex(t, "retention")+
			` WHERE `+sqliteRetained(StatusDelivered)+` ORDER BY updated_at DESC LIMIT ?`,
			func(lo string) string { return `COALESCE(` + sqliteNow + ` - ` + lo + `, 0)` }),
		sampArg: []any{p.DeliveredSample},
		total: func(counted int64) (n int64, err error) {
			// Two subqueries: SQLite reads min or max alone from the end of the rowid
			// b-tree, but scans the table for both in one select.
			err = q.QueryRowContext(ctx, `SELECT COALESCE((SELECT max(rowid) FROM `+tbl+`) - (SELECT min(rowid) FROM `+tbl+`) + 1, 0)`).Scan(&n)
			return n - counted, err
		},
	}
	r.liveArgs, r.deadArgs = la.Values, da.Values
	return runStatsReads(ctx, q, p.Scope, p.DeliveredSample, r)
}

// ListDead walks the partial retention index (status, updated_at) backwards.
func (sqliteDialect) ListDead(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ListDeadParams) ([]Record, error) {
	a := &args{}
	query := `SELECT ` + selectList(recordColumns, "", nil) + ` FROM ` + quoteIdent(t.Name(), '"') + sqliteIndex(t, "retention") +
		` WHERE ` + deadWhere(a, p, sqliteAt, uuidBytes, sqliteContains) + ` ORDER BY updated_at DESC, id DESC LIMIT ` + a.Add(p.Limit)
	return queryAll(ctx, q, query, a.Values, scanRecord)
}

// Replay is one UPDATE ... RETURNING in autocommit, in the pool's turn with the library's
// other writes.
func (d sqliteDialect) Replay(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ReplayParams) (ids []uuid.UUID, err error) {
	err = d.write(ctx, db, func(q, _ dialect.DBTX) error {
		a := &args{}
		query := `UPDATE ` + quoteIdent(t.Name(), '"') + ` SET status = 'pending', attempts = 0, next_attempt_at = ` + sqliteNow +
			`, locked_by = NULL, locked_until = NULL, lease_token = ` + a.Add(uuidBytes(p.Token)) +
			`, replays = replays + 1, updated_at = ` + sqliteStamp +
			` WHERE id IN ` + a.List(len(p.IDs), func(i int) any { return uuidBytes(p.IDs[i]) }) + ` AND status = 'dead' RETURNING id`
		ids, err = queryIDs(ctx, q, query, a.Values...)
		return err
	})
	return ids, err
}

// Discard is one DELETE ... RETURNING in autocommit.
func (d sqliteDialect) Discard(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.DiscardParams) (ids []uuid.UUID, err error) {
	err = d.write(ctx, db, func(q, _ dialect.DBTX) error {
		a := &args{}
		ids, err = queryIDs(ctx, q, `DELETE FROM `+quoteIdent(t.Name(), '"')+` WHERE id IN `+
			a.List(len(p.IDs), func(i int) any { return uuidBytes(p.IDs[i]) })+` AND status = 'dead' RETURNING id`, a.Values...)
		return err
	})
	return ids, err
}

// sqlitePurgeSQL renders one purge batch: the oldest rows of the status by the partial
// retention index, deleted in one autocommit statement. SQLite has one writer, so
// concurrent purgers simply take turns.
func sqlitePurgeSQL(t dialect.Table, status Status) string {
	tbl := quoteIdent(t.Name(), '"')
	return `DELETE FROM ` + tbl + ` WHERE id IN (SELECT id FROM ` + tbl + sqliteIndex(t, "retention") +
		` WHERE ` + sqliteRetained(status) + ` AND updated_at < ` + sqliteNow + ` - ? ORDER BY updated_at LIMIT ?)`
}

func (d sqliteDialect) Purge(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.PurgeParams) (n int64, err error) {
	if p.Status != StatusDelivered && p.Status != StatusDead {
		return 0, fmt.Errorf("purge of %q rows: only delivered and dead rows may be purged", p.Status)
	}
	err = d.write(ctx, db, func(q, _ dialect.DBTX) error {
		res, err := q.ExecContext(ctx, sqlitePurgeSQL(t, p.Status), micros(p.OlderThan), p.Limit)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return n, err
}
