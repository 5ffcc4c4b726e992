package dialect

import (
	"context"
	"database/sql"
	"time"

	"github.com/google/uuid"
)

// DBTX is what [*sql.DB], [*sql.Tx] and [*sql.Conn] have in common: the three methods a
// [Dialect] runs its statements with, on the transaction or pool the engine passes it.
// The engine's Enqueue does not take a DBTX but an outbox.Tx, so that a *sql.DB cannot be
// passed in place of the caller's transaction.
type DBTX interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Runner runs statements on a transaction that database/sql does not manage, whatever its
// driver: the engine's Store.EnqueueOn takes one, and package pgxv5 adapts a pgx
// transaction to it. A dialect never implements it; the built-in PostgreSQL dialect renders
// the statements of an enqueue for it.
type Runner interface {
	// Exec runs a statement that returns no rows and returns how many rows it affected.
	Exec(ctx context.Context, query string, args ...any) (int64, error)
	// QueryIDs runs a statement that returns one column of ids and returns them in the
	// order the database did, as [QueryIDs] does.
	QueryIDs(ctx context.Context, query string, args ...any) ([]uuid.UUID, error)
}

// Dialect adapts the outbox to one database. The engine (outbox.Store, outbox.Publisher) owns
// validation, ids, hashing, retry policy and the state machine; a Dialect owns the SQL and
// executes it. Built-in dialects: outbox.Postgres, outbox.MySQL, outbox.SQLite.
//
// A dialect for another database (CockroachDB, SQL Server, ...) implements these methods
// and proves itself by calling conformance.Run from its own test. The checklist:
//
//  1. Schema: one table with the columns of [Record] (types are yours; the meaning is fixed),
//     a unique index on (namespace, topic, dedupe_key) that lets rows without a dedupe key
//     coexist, an index that serves the claim in due order without sorting the pending set,
//     reading the rows not due yet or touching delivered rows, and an index for retention
//     on (status, updated_at).
//     Quote the table name from [Table.Name]; it is already validated.
//  2. Time: use one clock for every worker, the database's where it has one. Never trust the
//     client's clock or session time zone for leases and schedules.
//  3. Insert writes rows with status pending, attempts 0, no lease and next_attempt_at =
//     now + Row.Delay, on q (a row with [Row.Lease] set, which only a built-in dialect is
//     given, is written leased instead). The engine always passes a transaction (the caller's outbox.Tx,
//     or its own for Store.EnqueueStandalone), so several statements are atomic. Insert
//     never commits, never rolls back and never aborts the transaction on a dedupe
//     conflict: a conflicting row is skipped and reported as not inserted. Any other error
//     is returned, never swallowed.
//  4. Claim selects eligible rows, (pending and due) or (processing and lease expired), with
//     attempts < MaxAttempts and within [Scope], in the order they became due (next_attempt_at,
//     or an expired lease's locked_until, then id; ordered claims: (created_at, id)), at most Limit, and
//     atomically sets status processing, attempts+1, locked_by, locked_until = now + Lease,
//     lease_token = Token and updated_at = now, from one now: locked_until - updated_at is
//     exactly the lease. Concurrent claimers must never return the same row while its lease
//     is valid (FOR UPDATE SKIP LOCKED, or a single-writer guard). It runs in its own short
//     transaction on db, never in a caller's, and returns the records as they are after the
//     claim, in (created_at, id) order (RETURNING has no order of its own: sort).
//  5. Complete applies each [Outcome] only where the row is still processing under the
//     outcome's token, in one statement, and returns the ids it could not apply (lease lost).
//     Every outcome clears the lease (locked_by and locked_until NULL) and advances
//     updated_at; pending sets next_attempt_at = now + Delay and last_error; dead sets
//     last_error; delivered sets delivered_at = updated_at (one now). An outcome with
//     RefundAttempt also sets attempts = max(attempts - 1, 0): the claim counted an attempt
//     that the destination's outage did not let happen. A dialect written before
//     RefundAttempt existed ignores it and fails the conformance suite's
//     Settle/UnavailableRefundsAttempt.
//  6. Extend pushes locked_until to now + Lease and sets updated_at = now (one now, so that
//     locked_until - updated_at is the new lease) for rows still held under their token, and
//     returns the ids it could not extend.
//  7. Bury moves rows at or over the attempt limit that no live lease protects to dead, with
//     last_error = Reason and lease_token = Token, clearing locked_by and locked_until.
//  8. Get reads one row by id and returns [ErrNotFound] when there is none.
//  9. Connections: no method (nor any optional ability's) holds a connection of db, a
//     transaction or a *sql.Conn taken from it, while it waits for another connection of
//     db: no db.PrepareContext, db.QueryContext or second BeginTx inside a transaction.
//     On a pool of one connection such a call waits forever, and users run pools that
//     small. The conformance suite runs every call on a one-connection pool.
//  10. Every change of a row's state (claim, settle, extend, bury, replay) strictly
//     advances updated_at on the database clock: two statements of one transaction (a
//     settle and the claim after it) must not share a now that would tie them, nor two
//     changes within one tick of a coarse clock. Compute the stamp once per statement, so
//     that locked_until - updated_at stays exactly the lease. How the built-in dialects
//     do it:
//     PostgreSQL: now() is the transaction's start. Each change is a transaction of its
//     own, except the ordered settle-and-claim, which settles and then claims in one; so
//     the claim writes GREATEST(now(), updated_at + interval '1 microsecond') to
//     updated_at (and that plus the lease to locked_until). The unordered
//     settle-and-claim is one statement that never claims the rows it settles.
//     statement_timestamp() (a statement's own time) or clock_timestamp() in the same
//     GREATEST serve a dialect of one's own as well; never now() alone where two changes
//     of a row can share a transaction.
//     MySQL and MariaDB: UTC_TIMESTAMP(6), the statement's time to the microsecond (never
//     NOW() or UTC_TIMESTAMP() without (6), a second's resolution); the claim reads it in
//     its locking SELECT and writes that value. A settle and the claim after it are
//     separate statements, a round trip apart: more than a microsecond.
//     GREATEST(UTC_TIMESTAMP(6), updated_at + INTERVAL 1 MICROSECOND) makes sure of it.
//     SQLite: julianday('now') has a millisecond's resolution, so every change writes
//     max(now, updated_at + 1 microsecond), times kept as integer microseconds.
//     The conformance suite checks it with a retry claimed again by CompleteAndClaim
//     (ordered and not) and a run of extends within one tick.
//  11. Reading a row never fails because one stored value is damaged: payload and
//     payload_hash are returned as stored (the engine compares them), and headers that do
//     not decode into [Headers] are reported in [Record.HeadersErr] with Headers nil, so
//     that one row edited by hand does not fail a claim of many ([ScanHeaders] does this).
//  12. Times are returned in UTC, a NULL time as the zero time ([ScanTime] does both); an
//     empty string and uuid.Nil mean NULL in both directions.
//
// The conformance suite checks each rule. It touches the table only through hooks of
// conformance.Harness (Up, UpOrdered, Down, Count, Corrupt, DropColumn, OtherServer), whose
// defaults fit the built-in schemas: a dialect with a schema of its own sets them.
//
// The interface is kept this small on purpose. Abilities that only some databases have come
// as optional interfaces that the engine finds by type assertion, returning
// [errors.ErrUnsupported] when a dialect lacks one, so adding an ability never breaks an
// existing dialect. The package documentation lists them.
//
// The methods' parameters and results are the types of this package; [Args], [ScanTime],
// [ScanHeaders], [QueryIDs], [Lost] and [SortClaimed] help write them.
type Dialect interface {
	// Name is a short stable name: "postgres", "mysql", "sqlite" for the built-in dialects.
	// The migrations package picks its files by it, and the conformance suite's Harness
	// defaults use those migrations for it; the engine itself only names the dialect in
	// its errors. So an outside dialect may reuse a built-in's name only when it uses
	// that built-in's schema as the migrations package creates it (a pgx-native dialect
	// over the PostgreSQL tables, say); a dialect with a schema of its own takes a name of
	// its own ("custom-postgres"), which the migrations package refuses, and sets every
	// table hook of conformance.Harness.
	Name() string

	// Insert writes rows and reports for each whether it was inserted (false: a row with
	// the same namespace, topic and dedupe key exists). It may split rows into several
	// statements to stay within the database's placeholder limits.
	Insert(ctx context.Context, q DBTX, t Table, rows []Row) (inserted []bool, err error)

	// Claim leases up to p.Limit eligible rows and returns them as they are after the claim.
	Claim(ctx context.Context, db *sql.DB, t Table, p ClaimParams) ([]Record, error)

	// Complete settles claimed rows and returns the ids whose lease was lost. The engine
	// never names a row under two leases in one call.
	Complete(ctx context.Context, q DBTX, t Table, outcomes []Outcome) (lost []uuid.UUID, err error)

	// Extend renews leases and returns the ids whose lease was lost. The engine never
	// names a row under two leases in one call.
	Extend(ctx context.Context, q DBTX, t Table, p ExtendParams) (lost []uuid.UUID, err error)

	// Bury dead-letters up to p.Limit exhausted rows and returns their ids.
	Bury(ctx context.Context, q DBTX, t Table, p BuryParams) ([]uuid.UUID, error)

	// Get returns one row, or [ErrNotFound].
	Get(ctx context.Context, q DBTX, t Table, id uuid.UUID) (Record, error)
}

// Row is one validated message ready to insert, as the engine hands it to [Dialect.Insert].
// Empty strings and [uuid.Nil] mean NULL.
type Row struct {
	ID           uuid.UUID
	Namespace    string
	Topic        string
	TenantID     uuid.UUID
	DedupeKey    string
	PartitionKey string
	Headers      Headers
	Payload      []byte
	PayloadHash  []byte
	// Delay is added to the database clock's now to give next_attempt_at.
	Delay time.Duration
	// Lease, when its Duration is positive, writes the row already claimed, so that a
	// reader of the database's log can deliver it while no claim may take it: status
	// processing, attempts 1, locked_by = Lease.WorkerID, lease_token = Lease.Token and
	// locked_until = now + Lease.Duration, from the same now as created_at. Claims pass over
	// the row until the lease expires, then reclaim it as any expired lease. The engine sets
	// it only with Delay zero, and only on a built-in dialect that can (PostgreSQL's and MySQL's,
	// for outbox.Options.LogLease): a dialect of one's own never sees it set. A built-in dialect
	// that cannot returns an error matching [errors.ErrUnsupported] for such a row.
	Lease InsertLease
}

// InsertLease is the lease a row is inserted under ([Row.Lease]). The zero value is none.
type InsertLease struct {
	WorkerID string
	Token    uuid.UUID
	Duration time.Duration
}

// Scope restricts which rows a claim or a sweep may touch. Zero fields match everything.
type Scope struct {
	Namespace string
	Topics    []string
	TenantID  uuid.UUID
}

// ClaimParams are the arguments of [Dialect.Claim]. New fields may be added; a dialect that
// does not understand a non-zero new field must return [errors.ErrUnsupported]:
// [ClaimParams.Unsupported] does this check.
type ClaimParams struct {
	Scope
	Limit       int
	Lease       time.Duration
	MaxAttempts int
	WorkerID    string
	// Token is written to lease_token on every claimed row; Complete and Extend present it.
	Token uuid.UUID
	// Ordered claims a row that has a partition key only while it is the head of its key:
	// no earlier row (by created_at, id) of the same namespace and partition key is pending,
	// processing or, unless OrderedSkipDead, dead. Rows without a partition key are claimed
	// as usual. A dialect that cannot must return [errors.ErrUnsupported]; the engine calls
	// it with Ordered only when it implements [OrderedClaimer].
	Ordered bool
	// OrderedSkipDead, with Ordered, lets a dead row stop holding back the rows after it.
	OrderedSkipDead bool
	// Runs, with Ordered, asks the claimer that takes a key's head to take the key's
	// following rows too, its run: in (created_at, id) order, in the same transaction, each
	// while it is pending, due (next_attempt_at <= now), below MaxAttempts and in Scope,
	// stopping at the first row of the key that is not (a row in flight, a dead row unless
	// OrderedSkipDead passes over it, a row not due yet, a row another transaction holds
	// locked: a run never skips a row and takes one after it), all within Limit for the
	// whole batch. The run's rows are leased as the head is (same token, worker, lease and
	// attempts+1). Other claimers still take only heads, so no two claims split a key. A
	// dialect may ignore Runs ([ClaimParams.Unsupported] does) and claim heads only, which
	// stays correct: the engine sets it only as a request ([OrderedClaimer] rule 6).
	Runs bool
	// RunShare, with Runs, is how many claimers share the keys, as a Publisher's claim loops
	// do: a claim takes the heads of at most RunShare-th of the keys whose heads it finds,
	// rounded up (so never none of one), fills the batch with their runs, and leaves the
	// other keys to the other claimers rather than looking for more. 0 or 1: every head it
	// finds. A dialect may ignore it, as it may ignore Runs.
	RunShare int
	// Continue, with Runs, is read by CompleteAndClaim: before it looks for heads, the claim
	// takes the runs that follow the keys its outcomes delivered, each key of which every
	// outcome was applied and delivered, from the key's last such row, as though that row
	// were a head it held (its next row is the key's head: every row before it is
	// delivered). A key with any other outcome, or a lease found lost, is not continued.
	// The engine sets it only when the outcomes settle every row it holds of such a key.
	// The runs take a share of Limit per key first, then what is left, as runs do; only
	// when they leave the batch short does the claim look for other heads. It spares the
	// search for heads while a loop's keys keep it busy, so a claimer that continues keys
	// can keep other keys' heads waiting: a Publisher sets it on most of a loop's claims,
	// not all. A dialect may ignore it, as it may ignore Runs.
	Continue bool
}

// Lease names one claimed row and the token of the claim that holds it.
type Lease struct {
	ID    uuid.UUID
	Token uuid.UUID
}

// Outcome is the fate of one claimed row, applied by [Dialect.Complete].
type Outcome struct {
	Lease
	// Status is StatusDelivered, StatusPending (retry) or StatusDead.
	Status Status
	// Delay, for StatusPending, gives next_attempt_at = now + Delay.
	Delay time.Duration
	// Error is recorded in last_error for StatusPending and StatusDead (already bounded).
	Error string
	// RefundAttempt, for StatusPending only, gives back the attempt that the claim counted:
	// attempts = max(attempts - 1, 0), in the same statement. It is set when the delivery
	// failed because the destination was unreachable (outbox.Unavailable): the message was
	// never tried, so an outage of any length spends none of its attempts and never
	// dead-letters it. Attempts are still counted at claim, so that a message which crashes
	// its publisher uses them up. The engine never sets it with any other status.
	RefundAttempt bool
}

// ExtendParams are the arguments of [Dialect.Extend].
type ExtendParams struct {
	Leases []Lease
	Lease  time.Duration
}

// BuryParams are the arguments of [Dialect.Bury]: rows in Scope with attempts >= MaxAttempts
// that are pending, or processing with an expired lease, become dead with last_error =
// Reason and lease_token = Token.
type BuryParams struct {
	Scope
	MaxAttempts int
	Limit       int
	Reason      string
	Token       uuid.UUID
	// ExpiredOnly narrows the sweep to processing rows whose lease expired, the only
	// exhausted rows that appear while the attempt limit stays the same (a worker crashed
	// during the last attempt). They are few, and a dialect should find them without
	// walking the pending backlog where an index allows it (one that leads with status). A
	// dialect may ignore it and sweep pending rows too: burying those is right as well.
	ExpiredOnly bool
}
