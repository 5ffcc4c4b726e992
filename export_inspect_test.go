package outbox

import "github.com/outboxgo/outbox/dialect"

// InspectSQL renders, per built-in dialect, the statements of the inspection calls with
// their arguments, for the EXPLAIN tests in package outbox_test: the two reads of
// DeadGroups (groups, then total), Activity's read of one status, and GetByDedupeKey's.
type InspectStatement struct {
	Name  string
	Query string
	Args  []any
}

// InspectSQL returns the statements of one built-in dialect for filter f.
func InspectSQL(name string, t dialect.Table, f DeadFilter) []InspectStatement {
	p := dialect.DeadGroupsParams{DeadFilter: f, Limit: DefaultDeadGroupsLimit}
	var (
		groups, total func(dialect.Table, dialect.DeadGroupsParams) (string, string, []any, []any)
		activity      func(dialect.Table, Status) string
		dedupe        func(dialect.Table) string
	)
	switch name {
	case "postgres":
		groups, activity, dedupe = pgDeadGroupsSQL, pgActivitySQL, pgDedupeKeySQL
	case "mysql":
		groups, activity, dedupe = mysqlDeadGroupsSQL, mysqlActivitySQL, mysqlDedupeKeySQL
	case "sqlite":
		groups, activity, dedupe = sqliteDeadGroupsSQL, sqliteActivitySQL, sqliteDedupeKeySQL
	}
	total = groups
	g, _, ga, _ := groups(t, p)
	_, tq, _, ta := total(t, p)
	// Activity's limit is below the rows in the window, as on a busy table, so that the
	// plan is the walk that stops at the limit.
	window, limit := int64(3600_000_000), 100
	return []InspectStatement{
		{"dead groups", g, ga},
		{"dead total", tq, ta},
		{"activity delivered", activity(t, StatusDelivered), []any{window, limit}},
		{"activity dead", activity(t, StatusDead), []any{window, limit}},
		{"dedupe key", dedupe(t), []any{"orders", "order.created", "k-1"}},
	}
}
