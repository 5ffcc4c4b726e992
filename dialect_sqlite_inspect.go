package outbox

import (
	"context"
	"time"

	"github.com/outboxgo/outbox/dialect"
)

// sqliteContains tests last_error for a substring, case-sensitively, with no pattern syntax.
func sqliteContains(ph string) string { return `instr(last_error, ` + ph + `) > 0` }

// sqliteDeadGroupsSQL renders DeadGroups' two reads over the partial retention index.
func sqliteDeadGroupsSQL(t dialect.Table, p dialect.DeadGroupsParams) (groups, total string, gargs, targs []any) {
	from := quoteIdent(t.Name(), '"') + sqliteIndex(t, "retention")
	ga, ta := &args{}, &args{}
	gw := deadWhere(ga, dialect.ListDeadParams{DeadFilter: p.DeadFilter}, sqliteAt, uuidBytes, sqliteContains)
	groups = `SELECT COALESCE(last_error, ''), COUNT(*), MIN(updated_at), MAX(updated_at) FROM ` + from + ` WHERE ` + gw +
		` GROUP BY COALESCE(last_error, '') ORDER BY COUNT(*) DESC, COALESCE(last_error, '') LIMIT ` + ga.Add(p.Limit)
	total = `SELECT COUNT(*), MAX(updated_at) FROM ` + from + ` WHERE ` + deadWhere(ta, dialect.ListDeadParams{DeadFilter: p.DeadFilter}, sqliteAt, uuidBytes, sqliteContains)
	return groups, total, ga.Values, ta.Values
}

func (sqliteDialect) DeadGroups(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.DeadGroupsParams) (DeadGroups, error) {
	groups, total, gargs, targs := sqliteDeadGroupsSQL(t, p)
	return runDeadGroups(ctx, q, groups, total, gargs, targs)
}

// sqliteActivitySQL renders the read of one status's most recent rows, per minute of Unix
// time, a backward walk of the partial retention index.
func sqliteActivitySQL(t dialect.Table, status Status) string {
	return `SELECT updated_at / 60000000, COUNT(*) FROM (SELECT updated_at FROM ` + quoteIdent(t.Name(), '"') + sqliteIndex(t, "retention") +
		` WHERE ` + sqliteRetained(status) + ` AND updated_at >= ` + sqliteNow + ` - ? ORDER BY updated_at DESC LIMIT ?) GROUP BY 1`
}

func (sqliteDialect) Activity(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ActivityParams) (dialect.ActivitySample, error) {
	var now int64
	if err := q.QueryRowContext(ctx, `SELECT `+sqliteNow).Scan(&now); err != nil {
		return dialect.ActivitySample{}, err
	}
	return runActivity(ctx, q, time.UnixMicro(now), func(s Status) string { return sqliteActivitySQL(t, s) }, micros(p.Window), p.Limit)
}

// sqliteDedupeKeySQL reads a row by the unique partial dedupe index.
func sqliteDedupeKeySQL(t dialect.Table) string {
	return `SELECT ` + selectList(recordColumns, "", nil) + ` FROM ` + quoteIdent(t.Name(), '"') + sqliteIndex(t, "dedupe") +
		` WHERE namespace = ? AND topic = ? AND dedupe_key = ?`
}

func (sqliteDialect) GetByDedupeKey(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.DedupeKeyParams) (Record, error) {
	return getRecord(q.QueryRowContext(ctx, sqliteDedupeKeySQL(t), p.Namespace, p.Topic, p.DedupeKey))
}
