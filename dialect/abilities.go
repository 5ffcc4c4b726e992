package dialect

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"time"

	"github.com/google/uuid"
)

// This file holds the optional abilities of a dialect: interfaces that a [Dialect]
// value may also implement, found by the engine with a type assertion on the dialect given
// to outbox.New. None embeds Dialect. A dialect without an ability makes the matching Store
// calls return an error matching [errors.ErrUnsupported]; so may a method of an ability for
// a case it cannot handle, where its checklist allows. After each interface come the types
// of its parameters and results. The engine validates every parameter before a method runs.

// Checker checks the setup: that the pool is a database the dialect is written for, that
// the table is ready, and what a driver's error means in the outbox's terms. The engine's
// Store.Check calls CheckServer and then Check, a Publisher runs Store.Check when it starts,
// the Store runs CheckFirstUse at its first enqueue and passes ExplainError every failed
// statement of the dialect. The built-in dialects implement it. A method with nothing to
// check or add returns nil; Check returns an error matching [errors.ErrUnsupported] when the
// dialect cannot check at all.
//
// The checklist, which the conformance suite's Checker section checks:
//
//  1. Check returns nil for a ready table, and a [*CheckError] that says what to run for a
//     missing table, a missing column and a database of another kind (a server of another
//     protocol through any driver); any other error (the server cannot be reached) as it is.
//  2. CheckFirstUse runs its statements on tx only, the caller's transaction, never on
//     another connection of the pool: the caller holds one, and on a pool of one
//     connection a second would wait forever. drv, the pool's driver, tells what the pool
//     is without a query (its type), where the dialect knows the driver.
//  3. CheckFirstUse never leaves tx unusable: it sends only statements that cannot fail on
//     the database it is written for, since a failed statement aborts a PostgreSQL
//     transaction, and the caller's work with it.
//  4. CheckFirstUse returns nil when the store is fit to use (or there is nothing to
//     check), the [*CheckError] Check returns for a setup problem (the engine returns it
//     from this and every later enqueue of the store, which inserts nothing), and any other
//     error when it could not tell (a version query the server does not know, a lost
//     connection): the engine lets the enqueue go on, and checks again at the next one
//     only when the error may pass (the context ended, the connection or transaction is
//     gone, or the transaction was aborted before).
//  5. CheckServer returns nil for a server it does not refuse (one it does not recognise
//     included), a [*CheckError] that says what to do for one it refuses, and any other
//     error when it could not read what the server is; the engine ignores that error and
//     leaves it to Check, which reports an unreachable server.
//  6. ExplainError returns nil when it has nothing to add; the engine then wraps err as it
//     is. For the outbox table (p.Table) that does not exist it returns a [*CheckError]
//     with err as its Err, whose Fix says how to create the table with the dialect's own
//     migrations (the built-in dialects name migrations.Up and `outbox migrate up`; a
//     dialect with a schema of its own names its own); it may return one for any other
//     problem that configuration must fix (a statement bigger than the server accepts).
//     The engine returns a [*CheckError] as it is.
//  7. ExplainError may return any other error, wrapping err, to add what it knows about a
//     failure that may have another cause (a connection that broke while a big payload was
//     sent); the engine adds the operation's name. It never runs a statement: it reads err
//     and p only.
type Checker interface {
	// Check checks that db is a database of the dialect's kind and that the table t has
	// every column and index the dialect uses (rule 1).
	Check(ctx context.Context, db *sql.DB, t Table) error

	// CheckFirstUse catches, on the caller's own transaction tx at a store's first enqueue,
	// the setup mistakes that would otherwise show up late or as something else: a pool of
	// another database than the dialect's (whose statements fail with syntax errors), or
	// settings that work until a publisher runs beside the producers (the built-in SQLite
	// dialect: no WAL or no busy timeout). drv is the pool's driver. Rules 2 to 4.
	CheckFirstUse(ctx context.Context, drv driver.Driver, tx DBTX) error

	// CheckServer recognises a server that speaks the dialect's protocol but is another
	// database (a distributed SQL server that reports itself as PostgreSQL or MySQL, say),
	// and refuses it where a claim is unsafe on it or something the Store is set to use
	// (p) is known to fail there. Store.Check runs it before Check, which would take such
	// a server for the real thing. Rule 5.
	CheckServer(ctx context.Context, db *sql.DB, t Table, p ServerParams) error

	// ExplainError explains err, the error of one of the dialect's statements (Insert,
	// Claim, Complete, the operator's calls, ...), in the terms of the outbox: what went
	// wrong and what to do. Rules 6 and 7.
	ExplainError(err error, p ExplainParams) error
}

// ServerParams are the arguments of [Checker.CheckServer]: what the Store is set to use,
// which may decide whether a server will do.
type ServerParams struct {
	// Notify reports that the Store sends wake-ups across processes through the dialect's
	// [Notifier] (the engine's Options.DisableNotify is not set).
	Notify bool
}

// ExplainParams are the arguments of [Checker.ExplainError].
type ExplainParams struct {
	// Table is the outbox table the failed statement used.
	Table Table
	// PayloadBytes is how many payload bytes the failed statement carried: the sum of the
	// rows' payloads for an Insert, 0 for any other statement.
	PayloadBytes int
}

// Admin answers an operator and a dashboard (such as package outboxui): the ability behind
// the engine's Store.Stats, Store.ListDead, Store.Replay, Store.ReplayWhere, Store.Discard,
// Store.DiscardWhere, Store.DeadGroups, Store.DeadCauses, Store.Activity,
// Store.GetByDedupeKey, Store.Purge and a Publisher's Retention. Without it those calls
// return an error matching [errors.ErrUnsupported]; a method may return such an error for
// what the dialect cannot offer (the Store returns it, and the conformance suite skips the
// tests that need it, saying so). The built-in dialects implement it.
//
// The checklist, which the conformance suite's Admin section checks:
//
//  1. Stats counts the rows in p.Scope per (namespace, topic), one [TopicStats] for each
//     pair with any row counted: Pending (pending and due: next_attempt_at <= now),
//     Scheduled (pending and not yet due), Processing and Dead, all exact; now is the
//     database clock.
//  2. Stats' OldestPendingAge is now - next_attempt_at of the oldest due pending row, 0
//     when there is none.
//  3. Stats' OldestUndeliveredAge is how long the oldest pending or processing row has been
//     due since it first was: now - next_attempt_at while it was never claimed
//     (lease_token NULL), now - created_at once it was (a retry or an outage's probe moves
//     next_attempt_at, not that). A row never claimed and not yet due (a delayed row) has
//     no age and counts for nothing here; 0 when no row has an age.
//  4. Stats' delivered counts come from a bounded sample: the p.DeliveredSample most
//     recently settled delivered rows of the whole table (any scope), read through an
//     index on (status, updated_at), never all of them. [StatsSample].DeliveredSampled is
//     how many it read; each [TopicStats].Delivered counts those of them in p.Scope.
//  5. When the sample is full (DeliveredSampled = p.DeliveredSample), [StatsSample].
//     DeliveredWindow is the age of its oldest row's updated_at (at least a microsecond),
//     the Delivered counts leave out the rows settled at exactly that time (the sample may
//     have cut some of them), so that they are exact since then, and DeliveredTotal
//     estimates the delivered rows of the whole table (any scope, at least
//     DeliveredSampled) without reading them: from the planner's statistics, say, or an
//     estimate of the table's rows less the live and dead rows rule 1 counted. When the
//     sample is not full, both stay zero.
//  6. ListDead returns up to p.Limit dead rows in p.DeadFilter, newest death (updated_at)
//     first, ties by id descending, starting strictly after the keyset (p.AfterTime,
//     p.AfterID) when p.AfterID is not uuid.Nil. Never OFFSET. It honours the error filters
//     ([DeadFilter].ErrorContains, a case-sensitive substring of last_error, and LastError,
//     last_error equal to it), or returns an error matching [errors.ErrUnsupported] when
//     either is set: Store.ReplayWhere and Store.DiscardWhere act on what it lists, so a
//     dialect that ignored a filter would replay or discard more than was asked.
//  7. Replay moves the dead rows among p.IDs to pending: attempts 0, next_attempt_at now,
//     no lease, lease_token p.Token, replays + 1, updated_at now, last_error kept. Rows
//     that are not dead are not touched. It returns the ids it moved.
//  8. Discard deletes the dead rows among p.IDs (and anything that exists only for them,
//     such as dedupe keys kept in another table) and returns the ids it deleted.
//  9. DeadGroups counts the dead rows in p.DeadFilter per distinct last_error (NULL as ""),
//     with the first and last death (updated_at) of each, most rows first, ties by the
//     error text, at most p.Limit groups; and the total count and newest death of all the
//     rows in the filter. It reads the dead rows through the index on (status,
//     updated_at), never the delivered ones.
//  10. Activity counts, per minute of Unix time (floor(updated_at / 1 min)), the most recent
//     rows of each status, delivered and dead, settled (updated_at) at or after now -
//     p.Window on the database clock, reading at most p.Limit rows of each status through
//     the index on (status, updated_at), newest first; and returns the database clock's now.
//  11. GetByDedupeKey reads the row that holds (namespace, topic, dedupe key) through the
//     dedupe index (or table), or returns [ErrNotFound].
//  12. Purge deletes up to p.Limit rows of status p.Status (delivered or dead) whose
//     updated_at is older than now - p.OlderThan on the database clock, oldest first, in
//     one short transaction of its own, and returns how many it deleted. It finds them
//     through the index on (status, updated_at), never touches a row of another status,
//     deletes whatever exists only for the deleted rows (dedupe keys kept in another
//     table), and lets several purgers run at once (SKIP LOCKED, or a single-writer
//     guard) without waiting on each other or on claims.
//
// Replay, Discard and Purge run on the pool, in short transactions of their own, like a
// claim; the reads run on q, which the engine passes the pool for.
type Admin interface {
	// Stats counts the rows of the table by state and topic (rules 1 to 5).
	Stats(ctx context.Context, q DBTX, t Table, p StatsParams) (StatsSample, error)
	// ListDead lists one page of dead rows, newest death first (rule 6).
	ListDead(ctx context.Context, q DBTX, t Table, p ListDeadParams) ([]Record, error)
	// Replay moves dead rows back to pending and returns the ids it moved (rule 7).
	Replay(ctx context.Context, db *sql.DB, t Table, p ReplayParams) ([]uuid.UUID, error)
	// Discard deletes dead rows and returns the ids it deleted (rule 8).
	Discard(ctx context.Context, db *sql.DB, t Table, p DiscardParams) ([]uuid.UUID, error)
	// DeadGroups groups dead rows by their last error (rule 9).
	DeadGroups(ctx context.Context, q DBTX, t Table, p DeadGroupsParams) (DeadGroups, error)
	// Activity counts recently settled rows per minute (rule 10).
	Activity(ctx context.Context, q DBTX, t Table, p ActivityParams) (ActivitySample, error)
	// GetByDedupeKey reads the row that holds a dedupe key (rule 11).
	GetByDedupeKey(ctx context.Context, q DBTX, t Table, p DedupeKeyParams) (Record, error)
	// Purge deletes one batch of old delivered or dead rows (rule 12).
	Purge(ctx context.Context, db *sql.DB, t Table, p PurgeParams) (int64, error)
}

// StatsParams are the arguments of [Admin.Stats].
type StatsParams struct {
	Scope
	// DeliveredSample is how many of the most recent delivered rows to read at most.
	DeliveredSample int
}

// StatsSample is what [Admin.Stats] returns: exact counts of the live and dead rows and a
// bounded sample of the delivered ones. The engine turns it into its Stats.
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
// engine's Stats. [Admin] rules 1 to 5 say what each field holds.
type TopicStats struct {
	Namespace, Topic                                string
	Pending, Scheduled, Processing, Delivered, Dead int64
	OldestPendingAge, OldestUndeliveredAge          time.Duration
}

// ListDeadParams are the arguments of [Admin.ListDead].
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
	// rows whose last error is exactly it (a group of [Admin.DeadGroups]). A dialect that
	// cannot filter by them returns an error matching [errors.ErrUnsupported] when either
	// is set ([Admin] rule 6).
	ErrorContains, LastError string
}

// ReplayParams are the arguments of [Admin.Replay].
type ReplayParams struct {
	IDs []uuid.UUID
	// Token is written to lease_token on every replayed row, so that no lease of an earlier
	// life of the row can settle it.
	Token uuid.UUID
}

// DiscardParams are the arguments of [Admin.Discard].
type DiscardParams struct {
	IDs []uuid.UUID
}

// DeadGroupsParams are the arguments of [Admin.DeadGroups].
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

// DeadGroups is what [Admin.DeadGroups] and the engine's Store.DeadGroups return.
type DeadGroups struct {
	// Groups are the largest groups, most rows first, ties by LastError.
	Groups []DeadGroup
	// Total counts every dead row in the filter, in the groups returned or not.
	Total int64
	// Newest is the newest death among them (zero when Total is 0). A filter with Until
	// set just after it selects exactly the rows counted, however many die later.
	Newest time.Time
}

// ActivityParams are the arguments of [Admin.Activity].
type ActivityParams struct {
	Window time.Duration
	// Limit is how many rows of each status to read at most.
	Limit int
}

// ActivitySample is what [Admin.Activity] returns.
type ActivitySample struct {
	// Now is the database clock.
	Now time.Time
	// Delivered and Dead map a minute of Unix time (Unix seconds / 60) to how many rows
	// the sample read of that status settled in it; SampledDelivered and SampledDead are
	// how many rows each read.
	Delivered, Dead               map[int64]int64
	SampledDelivered, SampledDead int64
}

// DedupeKeyParams are the arguments of [Admin.GetByDedupeKey].
type DedupeKeyParams struct {
	Namespace, Topic, DedupeKey string
}

// PurgeParams are the arguments of [Admin.Purge].
type PurgeParams struct {
	// Status is StatusDelivered or StatusDead.
	Status    Status
	OlderThan time.Duration
	Limit     int
}

// Notifier gives wake-ups that cross processes. Signal, run on an enqueue's transaction,
// arranges for the database to tell every listener of the table once that transaction
// commits, and never if it rolls back (PostgreSQL's NOTIFY); Listen waits for those
// signals on a connection of its own. A Publisher listens when its dialect has the
// ability, and polls as well, so a lost signal costs at most a poll interval. The built-in
// dialects implement it: PostgreSQL with LISTEN/NOTIFY (Listen needs the pgx driver),
// MySQL and SQLite by asking the database for rows committed since (their Signal does
// nothing). A Listen that asks the database at an interval costs queries while idle: keep
// that interval long enough for every Publisher of the table to run one listener.
//
// The checklist, which the conformance suite's Notifier section checks:
//
//  1. A signal is delivered only once its transaction commits: an open transaction wakes
//     nobody, nor does a rolled-back one.
//  2. A signal wakes only the listeners of its own table in its own database (or schema):
//     not those of another table, nor those of a table of the same name elsewhere on the
//     server, whose publishers would claim for nothing.
//  3. Listen calls ready once, when it listens; it returns soon after ctx ends, and the
//     connection it held is closed, never given back to the pool while it listens.
//  4. An event enqueued through another pool, or by another process, wakes a Publisher
//     that polls once a minute within seconds.
type Notifier interface {
	// Signal is called on the caller's transaction after the rows of namespace were
	// inserted. Several calls in one transaction may be merged into one signal.
	Signal(ctx context.Context, q DBTX, t Table, namespace string) error

	// Listen calls ready once, when it listens, then wake with the namespace of every signal,
	// until ctx ends or the connection fails; it returns why it stopped. It returns an
	// error matching [errors.ErrUnsupported] when db's driver cannot listen.
	Listen(ctx context.Context, db *sql.DB, t Table, ready func(), wake func(namespace string)) error
}

// OrderedClaimer claims in order per partition key ([ClaimParams.Ordered]) and lists the
// keys a dead row holds back. The engine's Store.Claim with ClaimOptions.Ordered,
// Store.BlockedKeys and a Publisher with PublisherOptions.Ordered return an error matching
// [errors.ErrUnsupported] for a dialect without it, instead of claiming out of order. The
// built-in dialects implement it; their tables need the order index of the ordered
// migration set (migrations.Options.Ordered), which is opt in.
//
// The checklist, which the conformance suite's OrderedClaimer section checks:
//
//  1. The dialect's [Dialect.Claim], given p.Ordered, returns a row with a partition key
//     only when it is the head of its key: the first row, by (created_at, id), among the
//     rows of its namespace and partition key that are pending, processing or (unless
//     p.OrderedSkipDead) dead. Rows without a partition key are claimed as usual.
//  2. Two concurrent claims never return two rows of one key.
//  3. A dialect that can claim in order only in some configurations returns
//     [errors.ErrUnsupported] from Claim in the others.
//  4. BlockedKeys lists the keys whose head is dead while rows wait behind it.
//  5. CheckOrdered refuses, with a [*CheckError] that says what to run, a table that lacks
//     what ordered claims need (the conformance suite's Harness.UpOrdered adds it).
//  6. Optional: given p.Runs too, Claim (and CompleteAndClaim, after its settle) takes with
//     each head it claims the key's run ([ClaimParams.Runs]), and returns every key's rows in
//     sequence (the records in (created_at, id) order, rule 4 of [Dialect], list them so).
//     No other claim may take a row of a run while the run is claimed: others take heads
//     only, the head is held, and a row of the run another transaction holds locked ends
//     the run there. A dialect that ignores Runs claims heads only, which is correct; the
//     conformance suite's OrderedClaimer/Runs tests then check nothing beyond rule 1. Given
//     p.RunShare above 1 too, a claim that found fewer heads than p.Limit takes the oldest
//     ceil(found / RunShare) of them with their runs and visits no keys beyond them
//     ([ClaimParams.RunShare]); ignoring RunShare is correct too. Given p.Continue too,
//     CompleteAndClaim first takes the runs after the keys its outcomes delivered
//     ([ClaimParams.Continue]), and looks for heads only when they leave the batch short;
//     ignoring Continue is correct too.
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

// SettleClaimer records the outcomes of one batch and claims the next in a single round
// trip or transaction: one commit where [Dialect.Complete] and [Dialect.Claim] take two. A
// Publisher uses it after every full batch; the engine's Store.CompleteAndClaim exposes it
// to relays of one's own. A dialect without it still works: the Publisher settles and
// claims one after the other. The built-in dialects implement it.
//
// The checklist, which the conformance suite's SettleClaimer section checks:
//
//  1. CompleteAndClaim applies outcomes exactly as Complete does and claims exactly as
//     Claim does, atomically: when it returns an error, neither took effect, or (the reply
//     was lost) both did.
//  2. The claim sees the outcomes applied: a settled row is claimable again only if its
//     outcome made it so (a retry without delay), never because its old lease expired
//     while it was being published, and an ordered claim sees the keys the outcomes
//     released.
//  3. A row settled and claimed again in one call has its updated_at advanced past the
//     settle ([Dialect] rule 10).
//  4. It returns the claimed records, in (created_at, id) order, and the outcomes' ids whose
//     lease was lost, as Complete does: the order of Store.CompleteAndClaim.
type SettleClaimer interface {
	// CompleteAndClaim settles outcomes and claims the next rows in one transaction.
	CompleteAndClaim(ctx context.Context, db *sql.DB, t Table, outcomes []Outcome, p ClaimParams) (claimed []Record, lost []uuid.UUID, err error)
}
