package postgres

import (
	"context"
	"time"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// pgContains tests last_error for a substring, case-sensitively, with no pattern syntax.
func pgContains(ph string) string { return `strpos(last_error, ` + ph + `) > 0` }

// pgDeadGroupsSQL renders DeadGroups' two reads over the partial retention index: the groups,
// and the total with the newest death.
func pgDeadGroupsSQL(t dialect.Table, p dialect.DeadGroupsParams) (groups, total string, gargs, targs []any) {
	tbl := pgTable(t)
	ga, ta := &dialect.Args{Numbered: true}, &dialect.Args{Numbered: true}
	gw := sqlkit.DeadWhere(ga, dialect.ListDeadParams{DeadFilter: p.DeadFilter}, pgAt, pgUUID, pgContains)
	groups = `SELECT COALESCE(last_error, ''), count(*), min(updated_at), max(updated_at) FROM ` + tbl + ` WHERE ` + gw +
		` GROUP BY COALESCE(last_error, '') ORDER BY count(*) DESC, COALESCE(last_error, '') LIMIT ` + ga.Add(p.Limit) + `::bigint`
	total = `SELECT count(*), max(updated_at) FROM ` + tbl + ` WHERE ` + sqlkit.DeadWhere(ta, dialect.ListDeadParams{DeadFilter: p.DeadFilter}, pgAt, pgUUID, pgContains)
	return groups, total, ga.Values, ta.Values
}

func (*Dialect) DeadGroups(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.DeadGroupsParams) (dialect.DeadGroups, error) {
	groups, total, gargs, targs := pgDeadGroupsSQL(t, p)
	return sqlkit.RunDeadGroups(ctx, q, groups, total, gargs, targs)
}

// pgActivitySQL renders the read of one status's most recent rows, per minute of Unix time,
// a backward walk of the partial retention index from now - window.
func pgActivitySQL(t dialect.Table, status dialect.Status) string {
	return `SELECT floor(extract(epoch FROM updated_at) / 60)::bigint, count(*) FROM (SELECT updated_at FROM ` + pgTable(t) +
		` WHERE status = '` + string(status) + `' AND updated_at >= now() - ` + pgMicros(`$1::bigint`) +
		` ORDER BY updated_at DESC LIMIT $2::bigint) s GROUP BY 1`
}

func (*Dialect) Activity(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ActivityParams) (dialect.ActivitySample, error) {
	var now time.Time
	if err := q.QueryRowContext(ctx, `SELECT now()`).Scan(&now); err != nil {
		return dialect.ActivitySample{}, err
	}
	return sqlkit.RunActivity(ctx, q, now, func(s dialect.Status) string { return pgActivitySQL(t, s) }, sqlkit.Micros(p.Window), p.Limit)
}

// pgDedupeKeySQL reads a row by the unique partial dedupe index.
func pgDedupeKeySQL(t dialect.Table) string {
	return `SELECT ` + sqlkit.SelectList(sqlkit.RecordColumns, "", nil) + ` FROM ` + pgTable(t) +
		` WHERE namespace = $1 AND topic = $2 AND dedupe_key = $3`
}

func (*Dialect) GetByDedupeKey(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.DedupeKeyParams) (dialect.Record, error) {
	return sqlkit.GetRecord(q.QueryRowContext(ctx, pgDedupeKeySQL(t), p.Namespace, p.Topic, p.DedupeKey))
}
