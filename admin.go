package outbox

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
)

// Operations bounds and defaults.
const (
	// DefaultListDeadLimit is the page size of [Store.ListDead] when Limit is zero.
	DefaultListDeadLimit = 50
	// DefaultPurgeBatch is [PurgeOptions.BatchSize] when it is zero.
	DefaultPurgeBatch = 1000
	// StatsDeliveredSample is how many of the most recently delivered rows [Store.Stats]
	// reads at most. Up to this many delivered rows, the delivered counts are exact, of all
	// time; beyond it they are exact since [Stats.DeliveredSince], and the unscoped total
	// is an estimate ([Stats.DeliveredEstimated]).
	StatsDeliveredSample = 2000
)

// Stats counts rows by state, as [Store.Stats] returns them.
type Stats struct {
	// Pending counts pending rows that are due now; Scheduled pending rows not yet due
	// (delayed, or waiting for a retry). Processing counts rows under a lease, expired
	// leases included. Dead counts dead letters.
	Pending, Scheduled, Processing, Delivered, Dead int64
	// Delivered counts delivered rows. Up to [StatsDeliveredSample] of them in the table,
	// every delivered count is exact, of all time. Beyond it, reading them all would cost a
	// scan, so:
	//   - each [TopicStats.Delivered] counts exactly the rows delivered after
	//     DeliveredSince (the settle time of the oldest of the StatsDeliveredSample most
	//     recently delivered rows): a window that is shorter the busier the table, never an
	//     extrapolation;
	//   - Delivered, with no scope, estimates the table's delivered rows from the
	//     database's statistics, without reading them, and DeliveredEstimated is set (the
	//     planner's estimate on PostgreSQL; the table's estimated rows less the live and
	//     dead ones on MySQL, from InnoDB's statistics, and on SQLite, from the rowids: as
	//     good as those statistics); with a scope, it is the sum of the topics' counts
	//     since DeliveredSince, exact.
	DeliveredEstimated bool
	DeliveredSince     time.Time
	// OldestPendingAge is how long the oldest due pending row has been due: now -
	// next_attempt_at on the database clock, so a delayed or retried row counts from when
	// it became due, not from when it was enqueued. Zero when no row is due. On a healthy
	// outbox it stays below the publishers' poll interval. Each retry, and each probe of a
	// broker during an outage, moves next_attempt_at forward: a row stuck behind an outage
	// keeps leaving the due set, so this age stays low: do not alert on it alone.
	OldestPendingAge time.Duration
	// OldestUndeliveredAge is how long the oldest pending or processing row has waited
	// since it was first due: its next_attempt_at while no publisher has claimed it, and
	// its enqueue (created_at) once one has, whatever retries and outage probes did since.
	// An event enqueued with a Delay and then retried counts its Delay too, and a replayed
	// dead letter counts from its first enqueue. Zero when nothing is due. Alert on this
	// age: it grows whenever an event waits, a broker outage included.
	OldestUndeliveredAge time.Duration
	// Topics breaks the counts down per (namespace, topic), sorted by namespace then topic.
	Topics []TopicStats
}

// TopicStats are the counts of one (namespace, topic), as in [Stats]: its Pending,
// Scheduled, Processing, Delivered and Dead rows and its OldestPendingAge.
type TopicStats = dialect.TopicStats

// DeadFilter selects dead rows: those in Scope (namespace, topics, tenant) that died
// (the updated_at of a dead row) at Since or later and before Until, and whose last error
// contains ErrorContains (case-sensitive) or equals LastError (a group of
// [Store.DeadGroups]). Zero values are open ends. A dialect that cannot filter by the
// error returns an error matching [errors.ErrUnsupported] for them (the built-in ones all
// can). Each is at most [MaxLastErrorBytes].
type DeadFilter = dialect.DeadFilter

// ListDeadOptions are the arguments of [Store.ListDead].
type ListDeadOptions struct {
	DeadFilter
	// Limit is the page size: default [DefaultListDeadLimit], at most [MaxBatch].
	Limit int
	// Cursor is the previous page's [DeadPage.Next]; "" for the first page. Use it with
	// the same filter it came from.
	Cursor string
}

// DeadPage is one page of dead rows.
type DeadPage struct {
	// Records are newest death first (updated_at descending, then id descending), each
	// complete: LastError, Attempts, Replays, times and Payload.
	Records []Record
	// Next is the cursor of the next page; "" when this page was the last.
	Next string
}

// ReplayResult reports what [Store.Replay] did with each id, in the order given.
type ReplayResult struct {
	// Replayed are the ids of dead rows now pending again.
	Replayed []uuid.UUID
	// Skipped are the ids of rows that were not dead (or do not exist); they are unchanged.
	Skipped []uuid.UUID
}

// DiscardResult reports what [Store.Discard] did with each id, in the order given.
type DiscardResult struct {
	// Discarded are the ids of dead rows now deleted.
	Discarded []uuid.UUID
	// Skipped are the ids of rows that were not dead (or do not exist); they are unchanged.
	Skipped []uuid.UUID
}

// PurgeOptions are the arguments of [Store.Purge].
type PurgeOptions struct {
	// DeliveredOlderThan deletes delivered rows settled (updated_at) longer ago than this,
	// on the database clock; zero keeps every delivered row. Deleting a delivered row frees
	// its dedupe key (see [Message.DedupeKey]).
	DeliveredOlderThan time.Duration
	// DeadOlderThan deletes dead rows that died longer ago than this; zero keeps them.
	DeadOlderThan time.Duration
	// BatchSize is the most rows one statement deletes, each batch in its own short
	// transaction: default [DefaultPurgeBatch], at most [MaxBatch].
	BatchSize int
	// Progress, when set, is called after each batch with the running totals.
	Progress func(PurgeResult)
}

// PurgeResult counts the rows [Store.Purge] deleted.
type PurgeResult struct{ Delivered, Dead int64 }

func (s *Store) admin(op string) (dialect.Admin, error) {
	d, ok := s.dialect.(dialect.Admin)
	if !ok {
		return nil, fmt.Errorf("outbox: %s: dialect %q has no operator queries (dialect.Admin): %w", op, s.dialect.Name(), errors.ErrUnsupported)
	}
	return d, nil
}

// Stats counts the rows in scope by state, in total and per (namespace, topic). Live and
// dead rows are counted exactly, through the claim and retention indexes; delivered rows
// exactly up to [StatsDeliveredSample] of them and estimated beyond (see
// [Stats.DeliveredEstimated]), so the cost does not grow with the delivered rows a table
// retains. A dialect without [dialect.Admin] returns an error matching
// [errors.ErrUnsupported].
func (s *Store) Stats(ctx context.Context, scope Scope) (Stats, error) {
	if err := validateScope(scope); err != nil {
		return Stats{}, err
	}
	d, err := s.admin("stats")
	if err != nil {
		return Stats{}, err
	}
	raw, err := d.Stats(ctx, s.db, s.table, dialect.StatsParams{Scope: scope, DeliveredSample: StatsDeliveredSample})
	if err != nil {
		return Stats{}, fmt.Errorf("outbox: stats: %w", err)
	}
	st := Stats{Topics: slices.Clone(raw.Topics)}
	if raw.DeliveredSampled >= StatsDeliveredSample {
		// The topics' counts are exact over the sample's window; no share of an
		// estimated total is given per topic, since the mix of older rows is not known.
		st.DeliveredSince = time.Now().Add(-raw.DeliveredWindow).UTC().Truncate(time.Microsecond)
	}
	slices.SortFunc(st.Topics, func(a, b TopicStats) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Topic, b.Topic))
	})
	for _, t := range st.Topics {
		st.Pending += t.Pending
		st.Scheduled += t.Scheduled
		st.Processing += t.Processing
		st.Delivered += t.Delivered
		st.Dead += t.Dead
		st.OldestPendingAge = max(st.OldestPendingAge, t.OldestPendingAge)
		st.OldestUndeliveredAge = max(st.OldestUndeliveredAge, t.OldestUndeliveredAge)
	}
	if !st.DeliveredSince.IsZero() && scope.Namespace == "" && len(scope.Topics) == 0 && scope.TenantID == uuid.Nil {
		st.DeliveredEstimated = true
		st.Delivered = max(raw.DeliveredTotal, raw.DeliveredSampled)
	}
	return st, nil
}

// deadCursorVersion tags the cursor encoding, so that a future change can refuse old ones.
const deadCursorVersion = 1

// encodeDeadCursor returns the opaque cursor after the row (updated, id).
func encodeDeadCursor(updated time.Time, id uuid.UUID) string {
	b := make([]byte, 0, 25)
	b = append(b, deadCursorVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(updated.UnixMicro()))
	b = append(b, id[:]...)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeDeadCursor(c string) (time.Time, uuid.UUID, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil || len(b) != 25 || b[0] != deadCursorVersion {
		return time.Time{}, uuid.Nil, invalid("Cursor", "is not a cursor returned by ListDead")
	}
	id, _ := uuid.FromBytes(b[9:])
	if id == uuid.Nil {
		return time.Time{}, uuid.Nil, invalid("Cursor", "is not a cursor returned by ListDead")
	}
	return time.UnixMicro(int64(binary.BigEndian.Uint64(b[1:9]))).UTC(), id, nil
}

// validateDeadFilter refuses a filter the dialects must not see.
func validateDeadFilter(f DeadFilter) error {
	if err := validateScope(f.Scope); err != nil {
		return err
	}
	if err := checkText("ErrorContains", f.ErrorContains, 0, MaxLastErrorBytes); err != nil {
		return err
	}
	if err := checkText("LastError", f.LastError, 0, MaxLastErrorBytes); err != nil {
		return err
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && f.Until.Before(f.Since) {
		return invalid("Until", "(%s) is before Since (%s)", f.Until.Format(time.RFC3339Nano), f.Since.Format(time.RFC3339Nano))
	}
	return nil
}

// ListDead returns one page of dead rows that o's filter selects, newest death first.
// Pages are keyset-paginated on (updated_at, id): pass [DeadPage.Next] as the next call's
// Cursor until it is "". Rows that die while an operator pages are newer than the first
// page and do not shift the later ones. A malformed cursor returns a [*ValidationError].
func (s *Store) ListDead(ctx context.Context, o ListDeadOptions) (DeadPage, error) {
	if err := validateDeadFilter(o.DeadFilter); err != nil {
		return DeadPage{}, err
	}
	switch {
	case o.Limit == 0:
		o.Limit = DefaultListDeadLimit
	case o.Limit < 1 || o.Limit > MaxBatch:
		return DeadPage{}, invalid("Limit", "must be between 1 and %d, got %d", MaxBatch, o.Limit)
	}
	p := dialect.ListDeadParams{DeadFilter: o.DeadFilter, Limit: o.Limit + 1}
	var err error
	if o.Cursor != "" {
		if p.AfterTime, p.AfterID, err = decodeDeadCursor(o.Cursor); err != nil {
			return DeadPage{}, err
		}
	}
	d, err := s.admin("list dead")
	if err != nil {
		return DeadPage{}, err
	}
	recs, err := d.ListDead(ctx, s.db, s.table, p)
	if err != nil {
		return DeadPage{}, fmt.Errorf("outbox: list dead: %w", err)
	}
	page := DeadPage{Records: recs}
	if len(recs) > o.Limit {
		page.Records = recs[:o.Limit]
		last := page.Records[o.Limit-1]
		page.Next = encodeDeadCursor(last.UpdatedAt, last.ID)
	}
	return page, nil
}

// checkIDs refuses more than [MaxBatch] ids and returns them without repeats, in order.
func checkIDs(ids []uuid.UUID) ([]uuid.UUID, error) {
	if len(ids) > MaxBatch {
		return nil, invalid("ids", "lists %d ids, more than the limit of %d per call", len(ids), MaxBatch)
	}
	seen := make(map[uuid.UUID]bool, len(ids))
	out := make([]uuid.UUID, 0, len(ids))
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out, nil
}

// splitIDs sorts ids into those in done and the others, keeping their order.
func splitIDs(ids, done []uuid.UUID) (in, out []uuid.UUID) {
	set := make(map[uuid.UUID]bool, len(done))
	for _, id := range done {
		set[id] = true
	}
	for _, id := range ids {
		if set[id] {
			in = append(in, id)
		} else {
			out = append(out, id)
		}
	}
	return in, out
}

// Replay moves dead rows back to pending: due now, attempts 0, a fresh lease token (no
// lease from the row's earlier life can settle it), last_error kept until the next
// outcome, and [Record.Replays] one higher. Only dead rows change; ids of rows in another
// state, or of no row, are reported in [ReplayResult.Skipped], not as an error. Replaying
// twice is harmless: the second call skips the row, now pending. At most [MaxBatch] ids per
// call (repeats count once); see [Store.ReplayWhere] for more.
func (s *Store) Replay(ctx context.Context, ids ...uuid.UUID) (ReplayResult, error) {
	ids, err := checkIDs(ids)
	if err != nil || len(ids) == 0 {
		return ReplayResult{}, err
	}
	d, err := s.admin("replay")
	if err != nil {
		return ReplayResult{}, err
	}
	done, err := d.Replay(ctx, s.db, s.table, dialect.ReplayParams{IDs: ids, Token: uuid.New()})
	if err != nil {
		return ReplayResult{}, fmt.Errorf("outbox: replay: %w", err)
	}
	var r ReplayResult
	r.Replayed, r.Skipped = splitIDs(ids, done)
	return r, nil
}

// ReplayWhere replays every dead row that f selects, [MaxBatch] at a time (each batch a
// [Store.Replay] of the ids of one [Store.ListDead] page), and returns how many it replayed.
// Rows that die again while it runs are newer than its first page and are not replayed a
// second time. When ctx ends it stops between batches and returns the count so far.
func (s *Store) ReplayWhere(ctx context.Context, f DeadFilter) (int64, error) {
	return s.eachDeadPage(ctx, f, func(ids []uuid.UUID) (int, error) {
		r, err := s.Replay(ctx, ids...)
		return len(r.Replayed), err
	})
}

// eachDeadPage calls act with the ids of each page of [MaxBatch] dead rows that f selects,
// oldest cursor first, and adds up what act reports it changed. It stops at the first error
// and returns the count so far.
func (s *Store) eachDeadPage(ctx context.Context, f DeadFilter, act func(ids []uuid.UUID) (int, error)) (int64, error) {
	var (
		n      int64
		cursor string
	)
	for {
		page, err := s.ListDead(ctx, ListDeadOptions{DeadFilter: f, Limit: MaxBatch, Cursor: cursor})
		if err != nil {
			return n, err
		}
		if len(page.Records) > 0 {
			done, err := act(recordIDs(page.Records))
			if err != nil {
				return n, err
			}
			n += int64(done)
		}
		if page.Next == "" {
			return n, nil
		}
		cursor = page.Next
	}
}

func recordIDs(recs []Record) []uuid.UUID {
	out := make([]uuid.UUID, len(recs))
	for i := range recs {
		out[i] = recs[i].ID
	}
	return out
}

// Discard deletes dead rows an operator gives up on, with their dedupe keys (a new event
// with the same key can then be enqueued). Rows in another state, or no row, are reported
// in [DiscardResult.Skipped] and unchanged. At most [MaxBatch] ids per call.
func (s *Store) Discard(ctx context.Context, ids ...uuid.UUID) (DiscardResult, error) {
	ids, err := checkIDs(ids)
	if err != nil || len(ids) == 0 {
		return DiscardResult{}, err
	}
	d, err := s.admin("discard")
	if err != nil {
		return DiscardResult{}, err
	}
	done, err := d.Discard(ctx, s.db, s.table, dialect.DiscardParams{IDs: ids})
	if err != nil {
		return DiscardResult{}, fmt.Errorf("outbox: discard: %w", err)
	}
	var r DiscardResult
	r.Discarded, r.Skipped = splitIDs(ids, done)
	return r, nil
}

func (o *PurgeOptions) validate() error {
	switch {
	case o.DeliveredOlderThan < 0:
		return invalid("DeliveredOlderThan", "must not be negative, got %s", o.DeliveredOlderThan)
	case o.DeadOlderThan < 0:
		return invalid("DeadOlderThan", "must not be negative, got %s", o.DeadOlderThan)
	case o.DeliveredOlderThan == 0 && o.DeadOlderThan == 0:
		return invalid("PurgeOptions", "set DeliveredOlderThan, DeadOlderThan or both: zero keeps that kind of row")
	}
	switch {
	case o.BatchSize == 0:
		o.BatchSize = DefaultPurgeBatch
	case o.BatchSize < 1 || o.BatchSize > MaxBatch:
		return invalid("BatchSize", "must be between 1 and %d, got %d", MaxBatch, o.BatchSize)
	}
	return nil
}

// Purge deletes delivered rows settled longer ago than o.DeliveredOlderThan and dead rows
// that died longer ago than o.DeadOlderThan (updated_at, on the database clock), in
// batches of o.BatchSize, each one statement in its own short transaction, so that no lock
// is held for long and a cancelled purge keeps what it deleted. Pending and processing rows
// are never touched. Several purges, and publishers' retention loops, may run at once: each
// skips the rows another is deleting. It returns how many rows went, also when ctx ends
// half way (with ctx's error). A dialect without [dialect.Admin] returns an error
// matching [errors.ErrUnsupported].
func (s *Store) Purge(ctx context.Context, o PurgeOptions) (PurgeResult, error) {
	if err := o.validate(); err != nil {
		return PurgeResult{}, err
	}
	if _, err := s.retention(); err != nil {
		return PurgeResult{}, err
	}
	var res PurgeResult
	for _, kind := range res.kinds(o.DeliveredOlderThan, o.DeadOlderThan) {
		for {
			if err := ctx.Err(); err != nil {
				return res, fmt.Errorf("outbox: purge: %w", err)
			}
			n, err := s.purgeBatch(ctx, kind.status, kind.older, o.BatchSize)
			if err != nil {
				return res, err
			}
			*kind.count += n
			if n > 0 && o.Progress != nil {
				o.Progress(res)
			}
			if n < int64(o.BatchSize) {
				break
			}
		}
	}
	return res, nil
}

func (s *Store) retention() (dialect.Admin, error) {
	d, ok := s.dialect.(dialect.Admin)
	if !ok {
		return nil, fmt.Errorf("outbox: purge: dialect %q has no retention: %w", s.dialect.Name(), errors.ErrUnsupported)
	}
	return d, nil
}

// purgeBatch deletes one batch of up to limit rows of status older than older.
func (s *Store) purgeBatch(ctx context.Context, status Status, older time.Duration, limit int) (int64, error) {
	d, err := s.retention()
	if err != nil {
		return 0, err
	}
	n, err := d.Purge(ctx, s.db, s.table, dialect.PurgeParams{Status: status, OlderThan: older, Limit: limit})
	if err != nil {
		return 0, fmt.Errorf("outbox: purge %s rows: %w", status, err)
	}
	return n, nil
}

// purgeKind is one status a purge deletes, its age limit, and its count in a PurgeResult.
type purgeKind struct {
	status Status
	older  time.Duration
	count  *int64
}

// kinds returns the statuses to purge, delivered first, each counted in r; a zero age
// keeps that status.
func (r *PurgeResult) kinds(delivered, dead time.Duration) []purgeKind {
	var out []purgeKind
	if delivered > 0 {
		out = append(out, purgeKind{StatusDelivered, delivered, &r.Delivered})
	}
	if dead > 0 {
		out = append(out, purgeKind{StatusDead, dead, &r.Dead})
	}
	return out
}
