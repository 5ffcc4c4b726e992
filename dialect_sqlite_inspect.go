package outbox

import (
	"context"
	"time"
)

var _ InspectDialect = sqliteDialect{}

// sqliteContains tests last_error for a substring, case-sensitively, with no pattern syntax.
func sqliteContains(ph string) string { return `instr(last_error, ` + ph + `) > 0` }

// sqliteDeadGroupsSQL renders DeadGroups' two reads over the partial retention index.
func sqliteDeadGroupsSQL(t Table, p DeadGroupsParams) (groups, total string, gargs, targs []any) {
	from := quoteIdent(t.Name(), '"') + sqliteIndex(t, "retention")
	ga, ta := &args{}, &args{}
	gw := deadWhere(ga, ListDeadParams{DeadFilter: p.DeadFilter}, sqliteAt, uuidBytes, sqliteContains)
	groups = `SELECT COALESCE(last_error, ''), COUNT(*), MIN(updated_at), MAX(updated_at) FROM ` + from + ` WHERE ` + gw +
		` GROUP BY COALESCE(last_error, '') ORDER BY COUNT(*) DESC, COALESCE(last_error, '') LIMIT ` + ga.add(p.Limit)
	total = `SELECT COUNT(*), MAX(updated_at) FROM ` + from + ` WHERE ` + deadWhere(ta, ListDeadParams{DeadFilter: p.DeadFilter}, sqliteAt, uuidBytes, sqliteContains)
	return groups, total, ga.vals, ta.vals
}

func (sqliteDialect) DeadGroups(ctx context.Context, q DBTX, t Table, p DeadGroupsParams) (DeadGroups, error) {
	groups, total, gargs, targs := sqliteDeadGroupsSQL(t, p)
	return runDeadGroups(ctx, q, groups, total, gargs, targs)
}

// sqliteActivitySQL renders the read of one status's most recent rows, per minute of Unix
// time, a backward walk of the partial retention index.
func sqliteActivitySQL(t Table, status Status) string {
	return `SELECT updated_at / 60000000, COUNT(*) FROM (SELECT updated_at FROM ` + quoteIdent(t.Name(), '"') + sqliteIndex(t, "retention") +
		` WHERE ` + sqliteRetained(status) + ` AND updated_at >= ` + sqliteNow + ` - ? ORDER BY updated_at DESC LIMIT ?) GROUP BY 1`
}

func (sqliteDialect) Activity(ctx context.Context, q DBTX, t Table, p ActivityParams) (ActivitySample, error) {
	var now int64
	if err := q.QueryRowContext(ctx, `SELECT `+sqliteNow).Scan(&now); err != nil {
		return ActivitySample{}, err
	}
	return runActivity(ctx, q, time.UnixMicro(now), func(s Status) string { return sqliteActivitySQL(t, s) }, micros(p.Window), p.Limit)
}

// sqliteDedupeKeySQL reads a row by the unique partial dedupe index.
func sqliteDedupeKeySQL(t Table) string {
	return `SELECT ` + selectList(recordColumns, "", nil) + ` FROM ` + quoteIdent(t.Name(), '"') + sqliteIndex(t, "dedupe") +
		` WHERE namespace = ? AND topic = ? AND dedupe_key = ?`
}

func (sqliteDialect) GetByDedupeKey(ctx context.Context, q DBTX, t Table, p DedupeKeyParams) (Record, error) {
	return getRecord(q.QueryRowContext(ctx, sqliteDedupeKeySQL(t), p.Namespace, p.Topic, p.DedupeKey))
}
