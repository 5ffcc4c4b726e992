package sqlite

import (
	"context"
	"time"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// sqliteContains tests last_error for a substring, case-sensitively, with no pattern syntax.
func sqliteContains(ph string) string { return `instr(last_error, ` + ph + `) > 0` }

// sqliteDeadGroupsSQL renders DeadGroups' two reads over the partial retention index.
func sqliteDeadGroupsSQL(t dialect.Table, p dialect.DeadGroupsParams) (groups, total string, gargs, targs []any) {
	from := sqlkit.QuoteIdent(t.Name(), '"') + sqliteIndex(t, "retention")
	ga, ta := &dialect.Args{}, &dialect.Args{}
	gw := sqlkit.DeadWhere(ga, dialect.ListDeadParams{DeadFilter: p.DeadFilter}, sqliteAt, sqlkit.UUIDBytes, sqliteContains)
	groups = `SELECT COALESCE(last_error, ''), COUNT(*), MIN(updated_at), MAX(updated_at) FROM ` + from + ` WHERE ` + gw +
		` GROUP BY COALESCE(last_error, '') ORDER BY COUNT(*) DESC, COALESCE(last_error, '') LIMIT ` + ga.Add(p.Limit)
	total = `SELECT COUNT(*), MAX(updated_at) FROM ` + from + ` WHERE ` + sqlkit.DeadWhere(ta, dialect.ListDeadParams{DeadFilter: p.DeadFilter}, sqliteAt, sqlkit.UUIDBytes, sqliteContains)
	return groups, total, ga.Values, ta.Values
}

func (Dialect) DeadGroups(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.DeadGroupsParams) (dialect.DeadGroups, error) {
	groups, total, gargs, targs := sqliteDeadGroupsSQL(t, p)
	return sqlkit.RunDeadGroups(ctx, q, groups, total, gargs, targs)
}

// sqliteActivitySQL renders the read of one status's most recent rows, per minute of Unix
// time, a backward walk of the partial retention index.
func sqliteActivitySQL(t dialect.Table, status dialect.Status) string {
	return `SELECT updated_at / 60000000, COUNT(*) FROM (SELECT updated_at FROM ` + sqlkit.QuoteIdent(t.Name(), '"') + sqliteIndex(t, "retention") +
		` WHERE ` + sqlkit.Retained(status) + ` AND updated_at >= ` + sqliteNow + ` - ? ORDER BY updated_at DESC LIMIT ?) GROUP BY 1`
}

func (Dialect) Activity(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ActivityParams) (dialect.ActivitySample, error) {
	var now int64
	if err := q.QueryRowContext(ctx, `SELECT `+sqliteNow).Scan(&now); err != nil {
		return dialect.ActivitySample{}, err
	}
	return sqlkit.RunActivity(ctx, q, time.UnixMicro(now), func(s dialect.Status) string { return sqliteActivitySQL(t, s) }, sqlkit.Micros(p.Window), p.Limit)
}

// sqliteDedupeKeySQL reads a row by the unique partial dedupe index.
func sqliteDedupeKeySQL(t dialect.Table) string {
	return `SELECT ` + sqlkit.SelectList(sqlkit.RecordColumns, "", nil) + ` FROM ` + sqlkit.QuoteIdent(t.Name(), '"') + sqliteIndex(t, "dedupe") +
		` WHERE namespace = ? AND topic = ? AND dedupe_key = ?`
}

func (Dialect) GetByDedupeKey(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.DedupeKeyParams) (dialect.Record, error) {
	return sqlkit.GetRecord(q.QueryRowContext(ctx, sqliteDedupeKeySQL(t), p.Namespace, p.Topic, p.DedupeKey))
}
