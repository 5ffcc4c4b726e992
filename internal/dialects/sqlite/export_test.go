package sqlite

import "github.com/outboxgo/outbox/dialect"

// The statement renderers the EXPLAIN tests of package sqlite_test read: the statement of
// one purge batch that finds the rows to delete (its arguments are the age in
// microseconds and the batch size), and those of the inspection calls.
var (
	PurgeSQL      = sqlitePurgeSQL
	DeadGroupsSQL = sqliteDeadGroupsSQL
	ActivitySQL   = sqliteActivitySQL
	DedupeKeySQL  = sqliteDedupeKeySQL
)

// PreparedStatements reports how many statements d, a Store's dialect, keeps prepared.
func PreparedStatements(d dialect.Dialect) int {
	s, ok := d.(Dialect)
	if !ok || s.stmts == nil {
		return 0
	}
	return s.stmts.Len()
}
