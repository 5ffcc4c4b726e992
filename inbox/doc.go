// Package inbox turns at-least-once delivery into effectively-once processing on the
// consumer's side: it records each message a consumer group has processed in a table keyed
// by (consumer_group, message_id), in the same database transaction as the handler's own
// writes.
//
// [Inbox.Process] begins a transaction, claims the key with an insert that cannot conflict
// twice, runs the handler on that transaction and commits both together. A second delivery
// of the same message to the same group finds the key and is skipped: [Result.Duplicate]
// reports it, and the handler never runs. A concurrent second delivery waits for the first
// one's transaction and is then skipped, or, when the first rolled back, processes the
// message itself. A handler error rolls the claim back with the handler's writes, so the
// message is processed again when it is redelivered. Groups are independent: each group
// processes each message once.
//
// Consumers that manage their own transaction call [Inbox.Claim] on it first thing and skip
// their work when it reports a duplicate.
//
// The inbox remembers a message only as long as its row is kept: [Inbox.Purge] deletes rows
// older than a duration, and a message redelivered after its row was purged is processed
// again. The retention is the dedupe window; keep it longer than the broker may redeliver.
//
// [MigrateUp] creates the table from the embedded goose migrations; the same files run with
// the goose command line from inbox/migrations/<dialect>.
package inbox
