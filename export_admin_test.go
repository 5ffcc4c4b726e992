package outbox

import "github.com/outboxgo/outbox/dialect"

// PurgeSQL renders, per built-in dialect, the statement of one purge batch that finds the
// rows to delete (the whole DELETE on PostgreSQL and SQLite, the locking read on MySQL,
// which then deletes by primary key), for the EXPLAIN tests in package outbox_test. Its
// arguments are the age in microseconds and the batch size.
var PurgeSQL = map[string]func(dialect.Table, Status) string{
	"postgres": pgPurgeSQL,
	"mysql":    mysqlPurgeSQL,
	"sqlite":   sqlitePurgeSQL,
}
