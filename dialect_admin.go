package outbox

import (
	"context"
	"database/sql"
	"time"

	"github.com/google/uuid"
)

// AdminDialect is the optional ability behind [Store.Stats], [Store.ListDead],
// [Store.Replay], [Store.ReplayWhere] and [Store.Discard]. The engine finds it by type
// assertion on the [Dialect]; a dialect without it makes those calls return an error
// matching [errors.ErrUnsupported], and so may an implementation for a single method it
// cannot offer. The engine validates every parameter before a method runs. The checklist:
//
//  1. Stats counts the rows in p.Scope by (namespace, topic): pending and due, pending and
//     not yet due, processing, dead, and the age of the oldest due pending row (now -
//     next_attempt_at on the database clock). Delivered rows may be many, so the delivered
//     counts come from a bounded sample: the p.DeliveredSample most recently settled
//     delivered rows of the whole table (any scope), read through an index on (status,
//     updated_at), counted per (namespace, topic) within the scope. When the sample is full
//     the dialect also estimates how many delivered rows the table holds (any scope)
//     without reading them: from the planner's statistics, say, or an estimate of the
//     table's rows less the live and dead rows it counted.
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
type AdminDialect interface {
	Dialect
	Stats(ctx context.Context, q DBTX, t Table, p StatsParams) (StatsSample, error)
	ListDead(ctx context.Context, q DBTX, t Table, p ListDeadParams) ([]Record, error)
	Replay(ctx context.Context, db *sql.DB, t Table, p ReplayParams) ([]uuid.UUID, error)
	Discard(ctx context.Context, db *sql.DB, t Table, p DiscardParams) ([]uuid.UUID, error)
}

// RetentionDialect is the optional ability behind [Store.Purge] and a [Publisher]'s
// [Retention]. The engine finds it by type assertion on the [Dialect]; without it, Purge
// returns an error matching [errors.ErrUnsupported].
//
// Purge deletes up to p.Limit rows of status p.Status (delivered or dead) whose updated_at
// is older than now - p.OlderThan on the database clock, oldest first, in one short
// transaction of its own, and returns how many it deleted. It must find them through an
// index on (status, updated_at), never touch a row of another status, delete whatever
// exists only for the deleted rows (dedupe keys kept in another table), and let several
// purgers run at once (SKIP LOCKED, or a single-writer guard) without waiting on each other
// or on claims.
type RetentionDialect interface {
	Dialect
	Purge(ctx context.Context, db *sql.DB, t Table, p PurgeParams) (int64, error)
}

// StatsParams are the arguments of [AdminDialect.Stats].
type StatsParams struct {
	Scope
	// DeliveredSample is how many of the most recent delivered rows to read at most.
	DeliveredSample int
}

// StatsSample is what [AdminDialect.Stats] returns: exact counts of the live and dead rows
// and a bounded sample of the delivered ones. The engine turns it into [Stats].
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
}

// ListDeadParams are the arguments of [AdminDialect.ListDead].
type ListDeadParams struct {
	DeadFilter
	Limit int
	// AfterTime and AfterID are the keyset of the last row of the previous page; AfterID
	// uuid.Nil means the first page.
	AfterTime time.Time
	AfterID   uuid.UUID
}

// ReplayParams are the arguments of [AdminDialect.Replay].
type ReplayParams struct {
	IDs []uuid.UUID
	// Token is written to lease_token on every replayed row, so that no lease of an earlier
	// life of the row can settle it.
	Token uuid.UUID
}

// DiscardParams are the arguments of [AdminDialect.Discard].
type DiscardParams struct {
	IDs []uuid.UUID
}

// PurgeParams are the arguments of [RetentionDialect.Purge].
type PurgeParams struct {
	// Status is StatusDelivered or StatusDead.
	Status    Status
	OlderThan time.Duration
	Limit     int
}
