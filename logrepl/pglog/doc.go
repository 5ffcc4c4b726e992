// Package outboxpglog delivers an outbox's messages from PostgreSQL's write-ahead log
// (logical replication, the pgoutput plugin) instead of by polling the table.
//
// A Store made with outbox.Options.LogLease inserts each message that is due at once
// already leased to the log's reader ([outbox.LogWorkerID]); a [Publisher] reads the
// committed inserts from a replication slot, in commit order, hands them to the same
// [outbox.Transport] a polling outbox.Publisher uses, and settles them with
// [outbox.Store.Complete] under their insert lease: one UPDATE per event beyond its
// INSERT, batched. The table stays the truth: a failed delivery goes back to pending
// under the retry policy and polling publishers retry it, and a row whose lease ran out
// (the reader was down, behind, or its slot was lost) is reclaimed by polling, which
// then owns it; the reader's late outcome for it is refused as a lost lease. The slot's
// position is confirmed only after the outcomes of everything before it are committed,
// so a reader killed at any point resumes without losing or skipping a committed event.
//
// The server needs wal_level = logical, and the replication connection a role with the
// REPLICATION attribute (or a superuser). Run creates the publication and the slot when
// they are missing; [Setup] creates them ahead of time for readers whose role may not,
// [Drop] drops them, and [Slots] reads their lag with no reader running (the outbox
// command's log setup, log drop and stats). docs/log-delivery.md in the repository says
// what to set up and how ownership, positions and slot hygiene work.
package outboxpglog
