// Package outbox implements the transactional outbox pattern on database/sql.
//
// A service writes its business rows and an event row in one transaction with
// [Store.Enqueue]; a background [Publisher] later claims committed rows, hands them to a
// user-supplied transport, and acks, retries with jittered exponential backoff, or
// dead-letters them. Every committed event is delivered at least once or ends dead;
// nothing leaves the table except through retention the user configures.
//
// # States
//
//	pending ──claim──▶ processing ──ack──▶ delivered
//	   ▲                 │  │  └─lease expired, reclaimed─▶ processing
//	   └──nack (retry)───┘  └──nack at the limit, permanent error, bad hash──▶ dead
//
// delivered and dead are terminal for the publisher.
//
// # Leases and tokens
//
// A claim sets locked_by, locked_until = now + lease and a fresh random lease token on each
// row it takes. Ack, nack and lease renewal apply only where the row is still processing
// under that token, so a stale worker whose lease was taken over can never overwrite the
// new owner's outcome: it gets [ErrLeaseLost]. A lease that expired but was not yet
// reclaimed can still be acked by its holder (the token still matches and nobody else
// has the row), which saves a duplicate delivery. Tokens are random rather than a counter
// so that a row replayed from dead cannot be mistaken for an old claim.
//
// # Clocks
//
// Leases and schedules compare times on one clock for all workers: the database's
// (now() on PostgreSQL, UTC_TIMESTAMP(6) on MySQL). SQLite has no server: its statements
// read the host's clock themselves (julianday('now'), a millisecond's resolution) once they
// hold the write lock; every worker of one SQLite file runs on one host.
//
// # Wake-ups
//
// A [Publisher] claims as soon as there is work instead of waiting for its next poll: an
// enqueue on its [Store] wakes it in the same process, a commit anywhere wakes it on
// PostgreSQL (LISTEN/NOTIFY, the [dialect.Notifier] ability), and [Publisher.Wake] takes
// a signal of your own. Polling remains the fallback.
//
// # Dialects
//
// The engine owns validation, ids, hashing, the retry policy and the state machine; a
// [Dialect] owns the SQL. Built in: [Postgres], [MySQL], [SQLite]. The root package imports
// no database driver; register the one you use. Writing a dialect of your own needs only
// package [github.com/outboxgo/outbox/dialect], which holds the whole contract (this
// package aliases the few of its types you meet as a user: [Record], [Status], [Scope],
// [Lease], [Outcome], ...); the conformance package proves a dialect, built-in or your
// own, against the rules above.
package outbox
