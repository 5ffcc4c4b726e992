package mysql

import (
	"context"
	"time"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// mysqlContains tests last_error for a substring; the table's binary collation makes it
// case-sensitive, with no pattern syntax.
func mysqlContains(ph string) string { return `LOCATE(` + ph + `, last_error) > 0` }

// mysqlDeadGroupsSQL renders DeadGroups' two reads over the retention index (status,
// updated_at).
func mysqlDeadGroupsSQL(t dialect.Table, p dialect.DeadGroupsParams) (groups, total string, gargs, targs []any) {
	from := mysqlTable(t) + mysqlIndex(t, "retention")
	ga, ta := &dialect.Args{}, &dialect.Args{}
	gw := sqlkit.DeadWhere(ga, dialect.ListDeadParams{DeadFilter: p.DeadFilter}, mysqlAt, sqlkit.UUIDBytes, mysqlContains)
	groups = `SELECT COALESCE(last_error, ''), COUNT(*), ` + mysqlMicros(`MIN(updated_at)`) + `, ` + mysqlMicros(`MAX(updated_at)`) +
		` FROM ` + from + ` WHERE ` + gw + ` GROUP BY COALESCE(last_error, '') ORDER BY COUNT(*) DESC, COALESCE(last_error, '') LIMIT ` + ga.Add(p.Limit)
	total = `SELECT COUNT(*), ` + mysqlMicros(`MAX(updated_at)`) + ` FROM ` + from + ` WHERE ` +
		sqlkit.DeadWhere(ta, dialect.ListDeadParams{DeadFilter: p.DeadFilter}, mysqlAt, sqlkit.UUIDBytes, mysqlContains)
	return groups, total, ga.Values, ta.Values
}

func (Dialect) DeadGroups(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.DeadGroupsParams) (dialect.DeadGroups, error) {
	groups, total, gargs, targs := mysqlDeadGroupsSQL(t, p)
	return sqlkit.RunDeadGroups(ctx, q, groups, total, gargs, targs)
}

// mysqlActivitySQL renders the read of one status's most recent rows, per minute of Unix
// time, a backward range of the retention index.
func mysqlActivitySQL(t dialect.Table, status dialect.Status) string {
	return `SELECT ` + mysqlMicros(`updated_at`) + ` DIV 60000000, COUNT(*) FROM (SELECT updated_at FROM ` + mysqlTable(t) + mysqlIndex(t, "retention") +
		` WHERE status = '` + string(status) + `' AND updated_at >= DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND)` +
		` ORDER BY updated_at DESC LIMIT ?) s GROUP BY 1`
}

func (Dialect) Activity(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ActivityParams) (dialect.ActivitySample, error) {
	var now int64
	if err := q.QueryRowContext(ctx, `SELECT `+mysqlMicros(`UTC_TIMESTAMP(6)`)).Scan(&now); err != nil {
		return dialect.ActivitySample{}, err
	}
	return sqlkit.RunActivity(ctx, q, time.UnixMicro(now), func(s dialect.Status) string { return mysqlActivitySQL(t, s) }, sqlkit.Micros(p.Window), p.Limit)
}

// mysqlDedupeKeySQL finds the key in <table>_dedupe by its primary key, then the row by
// its primary key.
func mysqlDedupeKeySQL(t dialect.Table) string {
	return `SELECT ` + mysqlColumns + ` FROM ` + mysqlTable(t) + ` WHERE id = (SELECT id FROM ` + mysqlDedupeTable(t) +
		` WHERE namespace = ? AND topic = ? AND dedupe_key = ?)`
}

func (Dialect) GetByDedupeKey(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.DedupeKeyParams) (dialect.Record, error) {
	return sqlkit.GetRecord(q.QueryRowContext(ctx, mysqlDedupeKeySQL(t), p.Namespace, p.Topic, p.DedupeKey))
}
