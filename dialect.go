package outbox

import (
	"github.com/outboxgo/outbox/dialect"
)

// Dialect adapts the outbox to one database: [New] takes one. The engine ([Store],
// [Publisher]) owns validation, ids, hashing, the retry policy and the state machine; a
// Dialect owns the SQL. Built in: [Postgres], [MySQL], [SQLite].
//
// To write one for another database, see package [dialect], which holds the whole
// contract (this type is [dialect.Dialect]): the checklist, the optional abilities, and
// how to prove a dialect with the conformance suite.
type Dialect = dialect.Dialect

// The types of a row, as a Store returns and takes them. They are defined in package
// dialect, the contract with database adapters, and aliased here: outbox.Record and
// dialect.Record are one type.

// Record is one row of the outbox table as it is stored: [Store.Claim] returns the rows it
// leased as Records, [Store.Get] reads any row, [Store.ListDead] pages through dead ones.
// Times are UTC, a zero time meaning NULL. [Record.Integrity] reports a row changed behind
// the library's back; [Record.Lease] names the claim that holds it. See [dialect.Record]
// for its fields.
type Record = dialect.Record

// Status is the state of a row: pending, processing, delivered or dead. See the package
// documentation for the transitions.
type Status = dialect.Status

// The four states of a row.
const (
	StatusPending    = dialect.StatusPending
	StatusProcessing = dialect.StatusProcessing
	StatusDelivered  = dialect.StatusDelivered
	StatusDead       = dialect.StatusDead
)

// Headers are string metadata carried beside the payload (trace context, content type,
// correlation ids), as in [Message.Headers]. They are stored as a JSON object; a nil or
// empty map is stored as NULL.
type Headers = dialect.Headers

// Lease names one claimed row (ID) and the token of the claim that holds it (Token). Pass
// it to [Store.Ack], [Store.Extend] and, inside a [Failure] or an [Outcome], to
// [Store.Nack] and [Store.Complete]; [Record.Lease] returns it.
type Lease = dialect.Lease

// Outcome is the fate of one claimed row, applied by [Store.Complete]: its [Lease], the
// Status it goes to (delivered, pending to retry after Delay, or dead), the Error to record,
// and RefundAttempt to give back the attempt of a delivery the destination's outage
// prevented ([Unavailable]). See [dialect.Outcome] for its fields.
type Outcome = dialect.Outcome

// Scope restricts which rows a claim, a publisher or an operation may touch: one Namespace,
// some Topics, one TenantID. Zero fields match everything.
type Scope = dialect.Scope
