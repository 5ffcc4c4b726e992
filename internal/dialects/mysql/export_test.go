package mysql

// The statement renderers the EXPLAIN tests of package mysql_test read: the statement of
// one purge batch that finds the rows to delete (its arguments are the age in
// microseconds and the batch size), and those of the inspection calls.
var (
	PurgeSQL      = mysqlPurgeSQL
	DeadGroupsSQL = mysqlDeadGroupsSQL
	ActivitySQL   = mysqlActivitySQL
	DedupeKeySQL  = mysqlDedupeKeySQL
)
