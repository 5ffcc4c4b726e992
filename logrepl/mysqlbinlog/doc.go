// Package outboxbinlog delivers an outbox's messages from the MySQL or MariaDB binary log
// (row-based replication) instead of by polling the table.
//
// A Store made with outbox.Options.LogLease inserts each message that is due at once
// already leased to the log's reader ([outbox.LogWorkerID]); a [Publisher] follows the
// server's binlog as a replica would, takes the write-rows events of the outbox table in
// commit order (a transaction is handed over at its XID event), hands them to the same
// [outbox.Transport] a polling outbox.Publisher uses, and settles them under their insert
// lease with [outbox.Store.CompleteTx]: one UPDATE per event beyond its INSERT, batched.
// The binlog position it has reached (a GTID set, or a file and offset where GTIDs are off)
// is written to a table of its own at most once per Options.PositionInterval (with a
// settle, or alone) and when it stops, and only once the outcomes it covers are committed:
// the stored position may lag the outcomes, never lead them. A reader killed at any point
// resumes from it without losing or skipping a committed event, and skips the rows it reads
// again that were settled already, so a crash costs a re-read of the binlog, not a second
// publish of what was delivered.
//
// The table stays the truth: a failed delivery goes back to pending under the retry policy
// and polling publishers retry it, and a row whose lease ran out (the reader was down,
// behind, or the binlog it needed was purged) is reclaimed by polling, which then owns it;
// the reader's late outcome for it is refused as a lost lease.
//
// The server needs binlog_format = ROW and a user with REPLICATION SLAVE and REPLICATION
// CLIENT (MariaDB: BINLOG MONITOR) for the binlog connection. Run creates the position
// table when it is missing; [Setup] creates it ahead of time for readers whose user may
// not, [Drop] drops it, and [Positions] reads the stored positions against the server's
// binlog with no reader running (the outbox command's log setup, log drop and stats).
// docs/log-delivery.md in the repository says what to set up and how ownership, positions
// and purged binlogs work.
package outboxbinlog
