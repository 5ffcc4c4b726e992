package dialect

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"time"

	"github.com/google/uuid"
)

// This file holds every optional ability of a dialect: an interface that a [Dialect] value
// may also implement, found by the engine with a type assertion on the dialect given to
// outbox.New. None embeds Dialect. A dialect without an ability makes the matching Store
// call return an error matching [errors.ErrUnsupported]; so may a method of an ability for
// a case it cannot handle. After each interface come the types of its parameters and
// results. The engine validates every parameter before a method runs.

// Schemer is the ability to place the table in a named schema ([NewTableIn]). The engine
// refuses a table with a schema, before any statement runs, for a dialect that lacks it; a
// dialect that has it qualifies the table by its schema wherever it renders it, and so the
// names of indexes and of notification channels derived from it. The built-in PostgreSQL
// dialect implements it.
type Schemer interface {
	// SupportsSchema reports whether the dialect honours [Table.Schema].
	SupportsSchema() bool
}

// Checker checks that db is a database the dialect is written for and that the table t is
// ready to use. The engine's Store.Check calls it, and a Publisher when it starts. It
// returns a [*CheckError] for a problem that configuration must fix, and any other error
// (the server cannot be reached) as it is. The conformance suite's Check section is the
// checklist. The built-in dialects implement it.
type Checker interface {
	Check(ctx context.Context, db *sql.DB, t Table) error
}

// Notifier gives wake-ups that cross processes. Signal, run on an enqueue's transaction,
// arranges for the database to tell every listener of the table once that transaction
// commits, and never if it rolls back (PostgreSQL's NOTIFY); Listen waits for those
// signals on a connection of its own. The built-in dialects implement it: PostgreSQL with
// LISTEN/NOTIFY (Listen needs the pgx driver), MySQL and SQLite by asking the database
// for rows committed since ([PollingListener]). A Publisher listens when its dialect has
// the ability, and polls as well, so a lost signal costs at most a poll interval.
//
// The rules, which the conformance suite's Notify section checks:
//
//  1. A signal is delivered only once its transaction commits: an open transaction wakes
//     nobody, nor does a rolled-back one.
//  2. A signal wakes only the listeners of its own table in its own database (or schema):
//     not those of another table, nor those of a table of the same name elsewhere on the
//     server, whose publishers would claim for nothing.
//  3. Listen calls ready once, when it listens; it returns soon after ctx ends, and the
//     connection it held is closed, never given back to the pool while it listens.
type Notifier interface {
	// Signal is called on the caller's transaction after the rows of namespace were
	// inserted. Several calls in one transaction may be merged into one signal.
	Signal(ctx context.Context, q DBTX, t Table, namespace string) error

	// Listen calls ready once, when it listens, then wake with the namespace of every signal,
	// until ctx ends or the connection fails; it returns why it stopped. It returns an
	// error matching [errors.ErrUnsupported] when db's driver cannot listen.
	Listen(ctx context.Context, db *sql.DB, t Table, ready func(), wake func(namespace string)) error
}

// PollingListener is implemented by a [Notifier] whose Listen asks the database at an
// interval rather than waiting for a signal the server pushes: every listener then costs
// the database queries while idle, one each IdlePollInterval at most. The built-in
// MySQL and SQLite dialects implement it (their Signal does nothing: Listen finds the
// committed rows itself). A Publisher listens all the same, for wake-ups within
// milliseconds; a Relay, which bounds the idle queries of its many stores with its probe
// pace, does not listen to such stores.
type PollingListener interface {
	Notifier
	// IdlePollInterval is the longest pause between two queries of an idle listener.
	IdlePollInterval() time.Duration
}

// SettleClaimer records the outcomes of one batch and claims the next in a single round
// trip or transaction: one commit where [Dialect.Complete] and [Dialect.Claim] take two. A
// Publisher uses it after every full batch; the engine's Store.CompleteAndClaim exposes it
// to relays of one's own. The built-in dialects implement it.
//
// CompleteAndClaim applies outcomes exactly as Complete does and claims exactly as Claim
// does, atomically: when it returns an error, neither took effect, or (the reply was lost)
// both did. The claim sees the outcomes applied: a settled row is claimable again only if
// its outcome made it so (a retry without delay), never because its old lease expired
// while it was being published, and an ordered claim sees the keys the outcomes released.
// It returns the claimed records, in (created_at, id) order, and the outcomes' ids whose
// lease was lost, as Complete does: the order of Store.CompleteAndClaim. The conformance
// suite's SettleAndClaim section checks it when the dialect has it.
type SettleClaimer interface {
	CompleteAndClaim(ctx context.Context, db *sql.DB, t Table, outcomes []Outcome, p ClaimParams) (claimed []Record, lost []uuid.UUID, err error)
}

// OrderedClaimer claims in order per partition key ([ClaimParams.Ordered]) and lists the
// keys a dead row holds back. The engine's Store.Claim with ClaimOptions.Ordered,
// Store.BlockedKeys and a Publisher with PublisherOptions.Ordered return an error matching
// [errors.ErrUnsupported] for a dialect without it, instead of claiming out of order. The
// built-in dialects implement it; their tables need the order index of the ordered
// migration set (migrations.Options.Ordered), which is opt in.
//
// An implementation's [Dialect.Claim], given p.Ordered, returns a row with a partition key
// only when it is the head of its key: the first row, by (created_at, id), among the rows
// of its namespace and partition key that are pending, processing or (unless
// p.OrderedSkipDead) dead. Two concurrent claims must never return two rows of one key. A
// dialect that can claim in order only in some configurations returns
// [errors.ErrUnsupported] from Claim in the others. The conformance suite's Ordered
// section is the checklist.
type OrderedClaimer interface {
	// BlockedKeys lists up to p.Limit partition keys in p.Scope whose head is dead while
	// rows wait behind it, oldest head first.
	BlockedKeys(ctx context.Context, q DBTX, t Table, p BlockedKeysParams) ([]BlockedKey, error)
	// CheckOrdered checks that the table t has what ordered claims and BlockedKeys need
	// beyond what [Checker] checks (the built-in dialects: the order index), so that they
	// never run without it, which would read the whole table on every claim. It returns a
	// [*CheckError] that says what to run when something is missing, nil when nothing is
	// (or nothing is needed), an error matching [errors.ErrUnsupported] when it cannot tell,
	// and any other error (the server cannot be reached) as it is. The engine's Store runs
	// it before its first ordered claim or BlockedKeys until it passes once, and a
	// Publisher with PublisherOptions.Ordered when it starts.
	CheckOrdered(ctx context.Context, db *sql.DB, t Table) error
}

// BlockedKeysParams are the arguments of [OrderedClaimer.BlockedKeys].
type BlockedKeysParams struct {
	// Scope filters on the dead head row.
	Scope
	Limit int
}

// BlockedKey is a partition key whose head row is dead, as [OrderedClaimer.BlockedKeys]
// and the engine's Store.BlockedKeys report it. Ordered publishers with the default
// head-of-line policy deliver nothing more of the key until an operator replays the head
// (it goes back to pending and is delivered first) or discards it (the next row becomes
// the head).
type BlockedKey struct {
	Namespace    string
	PartitionKey string
	// HeadID is the dead row at the head of the key.
	HeadID uuid.UUID
	// Topic and LastError are the dead row's topic and why it died.
	Topic     string
	LastError string
	// Waiting is how many rows of the key are pending or processing behind the head.
	Waiting int64
}

// Purger deletes old delivered and dead rows: the ability behind the engine's Store.Purge
// and a Publisher's Retention. Without it, Purge returns an error matching
// [errors.ErrUnsupported].
//
// Purge deletes up to p.Limit rows of status p.Status (delivered or dead) whose updated_at
// is older than now - p.OlderThan on the database clock, oldest first, in one short
// transaction of its own, and returns how many it deleted. It must find them through an
// index on (status, updated_at), never touch a row of another status, delete whatever
// exists only for the deleted rows (dedupe keys kept in another table), and let several
// purgers run at once (SKIP LOCKED, or a single-writer guard) without waiting on each other
// or on claims.
type Purger interface {
	Purge(ctx context.Context, db *sql.DB, t Table, p PurgeParams) (int64, error)
}

// PurgeParams are the arguments of [Purger.Purge].
type PurgeParams struct {
	// Status is StatusDelivered or StatusDead.
	Status    Status
	OlderThan time.Duration
	Limit     int
}

// Administrator answers an operator: the ability behind the engine's Store.Stats,
// Store.ListDead, Store.Replay, Store.ReplayWhere and Store.Discard. A dialect without it
// makes those calls return an error matching [errors.ErrUnsupported], and so may an
// implementation for a single method it cannot offer. The checklist:
//
//  1. Stats counts the rows in p.Scope by (namespace, topic): pending and due, pending and
//     not yet due, processing, dead, the age of the oldest due pending row (now -
//     next_attempt_at on the database clock) and the age of the oldest undelivered one
//     ([TopicStats].OldestUndeliveredAge). Delivered rows may be many, so the delivered
//     counts come from a bounded sample: the p.DeliveredSample most recently settled
//     delivered rows of the whole table (any scope), read through an index on (status,
//     updated_at), counted per (namespace, topic) within the scope. When the sample is full
//     the counts leave out the rows settled at the very time of its oldest row, whose age
//     is [StatsSample].DeliveredWindow, so that they are exact since then; and the dialect
//     estimates how many delivered rows the table holds (any scope) without reading them:
//     from the planner's statistics, say, or an estimate of the table's rows less the live
//     and dead rows it counted.
//  2. ListDead returns up to p.Limit dead rows in p.Filter, newest death (updated_at) first,
//     ties by id descending, starting strictly after the keyset (p.AfterTime, p.AfterID)
//     when p.AfterID is not uuid.Nil. Never OFFSET.
//  3. Replay moves the dead rows among p.IDs to pending: attempts 0, next_attempt_at now,
//     no lease, lease_token p.Token, replays + 1, updated_at now, last_error kept. Rows
//     that are not dead are not touched. It returns the ids it moved.
//  4. Discard deletes the dead rows among p.IDs (and anything that exists only for them,
//     such as dedupe keys kept in another table) and returns the ids it deleted.
//
// Replay and Discard run on the pool, in short transactions of their own, like a claim.
type Administrator interface {
	Stats(ctx context.Context, q DBTX, t Table, p StatsParams) (StatsSample, error)
	ListDead(ctx context.Context, q DBTX, t Table, p ListDeadParams) ([]Record, error)
	Replay(ctx context.Context, db *sql.DB, t Table, p ReplayParams) ([]uuid.UUID, error)
	Discard(ctx context.Context, db *sql.DB, t Table, p DiscardParams) ([]uuid.UUID, error)
}

// StatsParams are the arguments of [Administrator.Stats].
type StatsParams struct {
	Scope
	// DeliveredSample is how many of the most recent delivered rows to read at most.
	DeliveredSample int
}

// StatsSample is what [Administrator.Stats] returns: exact counts of the live and dead rows
// and a bounded sample of the delivered ones. The engine turns it into its Stats.
type StatsSample struct {
	// Topics holds one entry per (namespace, topic) in scope with any row counted. Every
	// field is exact except Delivered, which counts the sample's rows.
	Topics []TopicStats
	// DeliveredSampled is how many delivered rows the sample read, in any scope. Below
	// [StatsParams.DeliveredSample] it read them all, and the Delivered counts are exact.
	DeliveredSampled int64
	// DeliveredTotal estimates the delivered rows of the whole table, in any scope. It is
	// read only when the sample was full.
	DeliveredTotal int64
	// DeliveredWindow, when the sample was full, is the age (on the database clock) of its
	// oldest row: the Delivered counts are then exactly the rows delivered (updated_at)
	// after it, the rows at that very time left out, since the sample may have cut them.
	DeliveredWindow time.Duration
}

// TopicStats are the counts of one (namespace, topic): in a [StatsSample], and in the
// engine's Stats.
//
// OldestUndeliveredAge is how long the oldest pending or processing row has been due since
// it first was: its next_attempt_at while it was never claimed (lease_token NULL), its
// created_at once it was (a retry or an outage's probe moves next_attempt_at, not that).
type TopicStats struct {
	Namespace, Topic                                string
	Pending, Scheduled, Processing, Delivered, Dead int64
	OldestPendingAge, OldestUndeliveredAge          time.Duration
}

// ListDeadParams are the arguments of [Administrator.ListDead].
type ListDeadParams struct {
	DeadFilter
	Limit int
	// AfterTime and AfterID are the keyset of the last row of the previous page; AfterID
	// uuid.Nil means the first page.
	AfterTime time.Time
	AfterID   uuid.UUID
}

// DeadFilter selects dead rows: those in Scope (namespace, topics, tenant) that died
// (the updated_at of a dead row) at Since or later and before Until, and whose last error
// contains ErrorContains and equals LastError. Zero values are open ends.
type DeadFilter struct {
	Scope
	Since, Until time.Time
	// ErrorContains selects rows whose last error contains it (case-sensitive), LastError
	// rows whose last error is exactly it (a group of [Inspector.DeadGroups]). The engine
	// passes either only to a dialect that is also an [Inspector]; for others it refuses
	// them with an error matching [errors.ErrUnsupported].
	ErrorContains, LastError string
}

// ReplayParams are the arguments of [Administrator.Replay].
type ReplayParams struct {
	IDs []uuid.UUID
	// Token is written to lease_token on every replayed row, so that no lease of an earlier
	// life of the row can settle it.
	Token uuid.UUID
}

// DiscardParams are the arguments of [Administrator.Discard].
type DiscardParams struct {
	IDs []uuid.UUID
}

// Inspector answers a dashboard (such as package outboxui) beyond [Administrator]: the
// ability behind the engine's Store.DeadGroups, Store.Activity, Store.GetByDedupeKey, and
// the error filters of [DeadFilter] (ErrorContains and LastError). Without it those calls
// return an error matching [errors.ErrUnsupported], and so do Store.ListDead,
// Store.ReplayWhere and Store.DiscardWhere with an error filter, so that no dialect that
// ignores the filter replays or discards more than was asked. A dialect with Inspector
// implements Administrator too. The checklist:
//
//  1. Its [Administrator.ListDead] honours [DeadFilter.ErrorContains] (a case-sensitive
//     substring of last_error) and [DeadFilter.LastError] (last_error equal to it).
//  2. DeadGroups counts the dead rows in p.DeadFilter per distinct last_error (NULL as
//     ""), with the first and last death (updated_at) of each, most rows first, ties by
//     the error text, at most p.Limit groups; and the total count and newest death of all
//     the rows in the filter. It reads the dead rows through the index on (status,
//     updated_at), never the delivered ones.
//  3. Activity counts, per minute of Unix time (floor(updated_at / 1 min)), the most recent
//     rows of each status, delivered and dead, settled (updated_at) at or after now -
//     p.Window on the database clock, reading at most p.Limit rows of each status through
//     the index on (status, updated_at), newest first; and returns the database clock's now.
//  4. GetByDedupeKey reads the row that holds (namespace, topic, dedupe key) through the
//     dedupe index (or table), or returns [ErrNotFound].
type Inspector interface {
	DeadGroups(ctx context.Context, q DBTX, t Table, p DeadGroupsParams) (DeadGroups, error)
	Activity(ctx context.Context, q DBTX, t Table, p ActivityParams) (ActivitySample, error)
	GetByDedupeKey(ctx context.Context, q DBTX, t Table, p DedupeKeyParams) (Record, error)
}

// DeadGroupsParams are the arguments of [Inspector.DeadGroups].
type DeadGroupsParams struct {
	DeadFilter
	Limit int
}

// DeadGroup is the dead rows that share one last error.
type DeadGroup struct {
	// LastError is the error the rows died of ("" when none was recorded).
	LastError string
	Count     int64
	// FirstDied and LastDied are the oldest and newest death (updated_at) in the group.
	FirstDied, LastDied time.Time
}

// DeadGroups is what [Inspector.DeadGroups] and the engine's Store.DeadGroups return.
type DeadGroups struct {
	// Groups are the largest groups, most rows first, ties by LastError.
	Groups []DeadGroup
	// Total counts every dead row in the filter, in the groups returned or not.
	Total int64
	// Newest is the newest death among them (zero when Total is 0). A filter with Until
	// set just after it selects exactly the rows counted, however many die later.
	Newest time.Time
}

// ActivityParams are the arguments of [Inspector.Activity].
type ActivityParams struct {
	Window time.Duration
	// Limit is how many rows of each status to read at most.
	Limit int
}

// ActivitySample is what [Inspector.Activity] returns.
type ActivitySample struct {
	// Now is the database clock.
	Now time.Time
	// Delivered and Dead map a minute of Unix time (Unix seconds / 60) to how many rows
	// the sample read of that status settled in it; SampledDelivered and SampledDead are
	// how many rows each read.
	Delivered, Dead               map[int64]int64
	SampledDelivered, SampledDead int64
}

// DedupeKeyParams are the arguments of [Inspector.GetByDedupeKey].
type DedupeKeyParams struct {
	Namespace, Topic, DedupeKey string
}

// PoolBinder lets a dialect keep state per pool, such as prepared statements. outbox.New
// calls BindPool with the Store's pool and uses the Dialect it returns in place of the one
// it was given, so that the state lives and dies with the Store (a prepared *sql.Stmt
// belongs to one pool and is closed with it). The returned Dialect must have every ability
// the original has, and it must run its statements only on the pool it was bound to.
//
// A dialect value that was not bound (used directly, or wrapped by another dialect that
// does not pass BindPool on) must still work: it keeps no such state and runs every
// statement unprepared. The conformance suite runs the dialect as outbox.New binds it.
type PoolBinder interface {
	BindPool(db *sql.DB) Dialect
}

// Renderer renders the statements of an enqueue instead of running them, so that the
// engine can run them on a connection that database/sql does not manage: package pgxv5
// enqueues on a pgx transaction with it, through the engine's Store.EnqueueOn. A dialect
// with it should build its own [Dialect.Insert] and [Notifier.Signal] from the same
// renderings and run them with [RunInsert] and a [DBTXRunner], so that an insert is built
// one way whatever runs it. The built-in PostgreSQL dialect implements it; a dialect whose
// insert needs the answer of one statement to render the next (MySQL's, which reserves
// dedupe keys first) cannot. The checklist, which the pgxv5 module's tests check for
// PostgreSQL:
//
//  1. RenderInsert returns the statements that write rows, in order, as [Dialect.Insert]
//     would run them: the same SQL, with arguments that the database's native driver
//     binds as database/sql binds them (strings, []byte, int64, slices of them). Each
//     statement writes the next [InsertStatement.Rows] of rows; together they write all.
//  2. Each statement says, in [InsertStatement.Result], how its caller learns which rows
//     went in, and a duplicate dedupe key never raises an error (it would abort the
//     caller's transaction on PostgreSQL): see [InsertResult].
//  3. RenderSignal returns the statement that [Notifier.Signal] runs for namespace, to be
//     run with [Runner.Exec] on the caller's transaction, and false when the dialect is
//     not a [Notifier].
//
// The renderings depend only on their arguments: they read no connection state.
type Renderer interface {
	RenderInsert(t Table, rows []Row) ([]InsertStatement, error)
	RenderSignal(t Table, namespace string) (Statement, bool)
}

// Statement is one SQL statement and its arguments, with the placeholders of the database.
type Statement struct {
	Query string
	Args  []any
}

// InsertStatement is one statement of a [Renderer]'s insert.
type InsertStatement struct {
	Statement
	// Rows is how many rows it writes: the next Rows of those rendered, in order.
	Rows int
	// Result says how its caller learns which of its rows were inserted.
	Result InsertResult
}

// InsertResult is how a caller learns which rows of an [InsertStatement] were inserted;
// [RunInsert] reads each kind.
type InsertResult uint8

const (
	// InsertedAll: the statement inserts all its rows or fails (none has a dedupe key).
	// Run it with [Runner.Exec].
	InsertedAll InsertResult = iota
	// InsertedIfAffected: the statement writes one row and skips it, without an error,
	// when its dedupe key exists. Run it with [Runner.Exec]; one affected row means it
	// went in.
	InsertedIfAffected
	// InsertedReturned: the statement skips rows whose dedupe key exists, without an
	// error, and returns the id of each row it inserted, one column. Run it with
	// [Runner.QueryIDs]; a row whose id is not returned was a duplicate.
	InsertedReturned
)

// Runner runs rendered statements on the caller's transaction, whatever its driver: the
// engine's Store.EnqueueOn takes one. [DBTXRunner] adapts a [DBTX]; package pgxv5 adapts a
// pgx transaction.
type Runner interface {
	// Exec runs a statement that returns no rows and returns how many rows it affected.
	Exec(ctx context.Context, query string, args ...any) (int64, error)
	// QueryIDs runs a statement that returns one column of ids and returns them in the
	// order the database did, as [QueryIDs] does.
	QueryIDs(ctx context.Context, query string, args ...any) ([]uuid.UUID, error)
}

// FirstUseChecker catches, on the caller's own transaction at a store's first enqueue, the
// setup mistakes that would otherwise show up late or as something else: a pool of another
// database than the dialect's (whose statements fail with syntax errors), or settings
// that work until a publisher runs beside the producers (the built-in SQLite dialect: no
// WAL or no busy timeout). The engine's Store runs it before the first Insert, and again
// at each enqueue until it reaches a verdict; after that an enqueue pays one atomic load.
// The built-in dialects implement it.
//
// The rules, which the conformance suite's Check section checks when the dialect has it:
//
//  1. It runs its statements on tx only, the caller's transaction, never on another
//     connection of the pool: the caller holds one, and on a pool of one connection a
//     second would wait forever. drv, the pool's driver, tells what the pool is without a
//     query (its type), where the dialect knows the driver.
//  2. It never leaves tx unusable: it sends only statements that cannot fail on the
//     database it is written for, since a failed statement aborts a PostgreSQL
//     transaction, and the caller's work with it.
//  3. It returns nil when the store is fit to use, and a [*CheckError] for a setup
//     problem, the one [Checker.Check] returns for it; the engine returns that error from
//     this and every later enqueue of the store, which inserts nothing.
//  4. It returns any other error when it could not tell (a version query the server does
//     not know, a lost connection). The engine then lets the enqueue go on, and checks
//     again at the next one only when the error may pass (the context ended, the
//     connection or transaction is gone, or the transaction was aborted before).
type FirstUseChecker interface {
	CheckFirstUse(ctx context.Context, drv driver.Driver, tx DBTX) error
}

// ErrorExplainer explains a driver's error in the terms of the outbox: what went wrong and
// what to do. The engine's Store passes it the error of every statement of the dialect
// that fails (Insert, Claim, Complete, the operator's calls, ...) before it wraps it. The
// built-in dialects implement it.
//
// The rules, which the conformance suite's Check section checks when the dialect has it:
//
//  1. It returns nil when it has nothing to add; the engine then wraps err as it is.
//  2. It returns a [*CheckError] for a problem that configuration must fix, with err as
//     its Err: at least the outbox table (p.Table) that does not exist, whose Fix names
//     the migrations (migrations.Up and `outbox migrate up`); also, say, a statement
//     bigger than the server accepts. The engine returns it as it is.
//  3. It returns any other error, wrapping err, to add what it knows about a failure that
//     may have another cause (a connection that broke while a big payload was sent); the
//     engine adds the operation's name.
//  4. It never runs a statement: it reads err and p only.
type ErrorExplainer interface {
	ExplainError(err error, p ExplainParams) error
}

// ExplainParams are the arguments of [ErrorExplainer.ExplainError].
type ExplainParams struct {
	// Table is the outbox table the failed statement used.
	Table Table
	// PayloadBytes is how many payload bytes the failed statement carried: the sum of the
	// rows' payloads for an Insert, 0 for any other statement.
	PayloadBytes int
}

// ServerChecker recognises a server that speaks the dialect's protocol but is another
// database (a distributed SQL server that reports itself as PostgreSQL or MySQL, say), and
// refuses it where a claim is unsafe on it or something the Store is set to use is known
// to fail there. The engine's Store.Check runs it before [Checker.Check], which would take
// such a server for the real thing, on a dialect that has both. The built-in PostgreSQL and
// MySQL dialects implement it.
//
// It returns nil for a server it does not refuse (one it does not recognise included), a
// [*CheckError] that says what to do for one it refuses, and any other error when it could
// not read what the server is; the engine ignores that error and leaves it to
// [Checker.Check], which reports an unreachable server.
type ServerChecker interface {
	CheckServer(ctx context.Context, db *sql.DB, t Table, p ServerParams) error
}

// ServerParams are the arguments of [ServerChecker.CheckServer]: what the Store is set to
// use, which may decide whether a server will do.
type ServerParams struct {
	// Notify reports that the Store sends wake-ups across processes through the dialect's
	// [Notifier] (the engine's Options.DisableNotify is not set).
	Notify bool
}
