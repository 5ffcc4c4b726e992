package outbox

import "github.com/outboxgo/outbox/internal/dialects/mysql"

// MySQL returns the dialect for MySQL 8.0+ and MariaDB 10.6+ (InnoDB), tested with
// github.com/go-sql-driver/mysql on MariaDB. Create the tables with the migrations package:
// besides the outbox table, MySQL keeps dedupe keys in a second table, <table>_dedupe, and
// lock stripes for them in a third, <table>_dedupe_lock.
//
// Producers racing for one dedupe key queue on its stripe, so a loser learns "already
// enqueued" once the winner commits, or wins once the winner rolls back, and its transaction
// goes on. Keys that share a stripe (1 in 4,096) wait for each other too; enqueue the keyed
// events of one transaction in one EnqueueBatch call, which locks their stripes in one order,
// rather than in several calls whose order another transaction may reverse.
//
// Claims run in short READ COMMITTED transactions with FOR UPDATE SKIP LOCKED, and retry
// after a deadlock or lock wait timeout. Every time is the server's UTC_TIMESTAMP(6), so the
// DSN's parseTime and loc and the session's time_zone do not matter.
//
// Server and driver settings: keep binlog_format ROW or MIXED (the defaults), since READ
// COMMITTED writes cannot be logged as statements; do not set clientFoundRows=true in the
// DSN, which would make a duplicate dedupe key look enqueued; interpolateParams=true saves
// a round trip per statement.
func MySQL() Dialect { return mysql.New() }
