package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Bounds and defaults of the inspection calls.
const (
	// DefaultDeadGroupsLimit is how many groups [Store.DeadGroups] returns when Limit is zero.
	DefaultDeadGroupsLimit = 20
	// DefaultActivityMinutes is the window of [Store.Activity] when Minutes is zero;
	// MaxActivityMinutes the longest window it accepts (one day).
	DefaultActivityMinutes = 60
	MaxActivityMinutes     = 24 * 60
	// ActivitySampleRows is how many of the most recently settled rows of each status
	// (delivered, dead) [Store.Activity] reads at most. Within it the counts are exact;
	// beyond it the minutes before [Activity.ExactSince] are incomplete.
	ActivitySampleRows = 10_000
)

// InspectDialect is the optional ability behind [Store.DeadGroups], [Store.Activity],
// [Store.GetByDedupeKey], and the error filters of [DeadFilter] (ErrorContains and
// LastError): what a dashboard such as package outboxui reads beyond [AdminDialect]. The
// engine finds it by type assertion; without it those calls return an error matching
// [errors.ErrUnsupported], and so do [Store.ListDead], [Store.ReplayWhere] and
// [Store.DiscardWhere] with an error filter, so that no dialect that ignores the filter
// replays or discards more than was asked. The checklist:
//
//  1. Its [AdminDialect.ListDead] honours [DeadFilter.ErrorContains] (a case-sensitive
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
type InspectDialect interface {
	AdminDialect
	DeadGroups(ctx context.Context, q DBTX, t Table, p DeadGroupsParams) (DeadGroups, error)
	Activity(ctx context.Context, q DBTX, t Table, p ActivityParams) (ActivitySample, error)
	GetByDedupeKey(ctx context.Context, q DBTX, t Table, p DedupeKeyParams) (Record, error)
}

// DeadGroupsOptions are the arguments of [Store.DeadGroups].
type DeadGroupsOptions struct {
	DeadFilter
	// Limit is the most groups returned: default [DefaultDeadGroupsLimit], at most
	// [MaxBatch]. [DeadGroups.Total] counts every row in the filter regardless.
	Limit int
}

// DeadGroupsParams are the arguments of [InspectDialect.DeadGroups].
type DeadGroupsParams struct {
	DeadFilter
	Limit int
}

// DeadGroup is the dead rows that share one last error, as [Store.DeadGroups] returns them.
type DeadGroup struct {
	// LastError is the error the rows died of ("" when none was recorded).
	LastError string
	Count     int64
	// FirstDied and LastDied are the oldest and newest death (updated_at) in the group.
	FirstDied, LastDied time.Time
}

// DeadGroups is what [Store.DeadGroups] returns.
type DeadGroups struct {
	// Groups are the largest groups, most rows first, ties by LastError.
	Groups []DeadGroup
	// Total counts every dead row in the filter, in the groups returned or not.
	Total int64
	// Newest is the newest death among them (zero when Total is 0). A filter with Until
	// set just after it selects exactly the rows counted, however many die later.
	Newest time.Time
}

// ActivityOptions are the arguments of [Store.Activity].
type ActivityOptions struct {
	// Minutes is the window: default [DefaultActivityMinutes], at most [MaxActivityMinutes].
	Minutes int
}

// ActivityParams are the arguments of [InspectDialect.Activity].
type ActivityParams struct {
	Window time.Duration
	// Limit is how many rows of each status to read at most.
	Limit int
}

// ActivitySample is what [InspectDialect.Activity] returns.
type ActivitySample struct {
	// Now is the database clock.
	Now time.Time
	// Delivered and Dead map a minute of Unix time (Unix seconds / 60) to how many rows
	// the sample read of that status settled in it; SampledDelivered and SampledDead are
	// how many rows each read.
	Delivered, Dead               map[int64]int64
	SampledDelivered, SampledDead int64
}

// MinuteActivity counts the rows that settled in one minute.
type MinuteActivity struct {
	// Start is the minute's start, UTC.
	Start           time.Time
	Delivered, Dead int64
}

// Activity is what [Store.Activity] returns: delivered and dead rows per minute.
type Activity struct {
	// Now is the database clock when the counts were read.
	Now time.Time
	// Minutes are the window's minutes, oldest first, the last one the current minute (on
	// the database clock), partial.
	Minutes []MinuteActivity
	// ExactSince is where the counts become exact: when more rows of a status settled in
	// the window than [ActivitySampleRows], the minutes before it count only the rows read (the
	// minute it names is exact, the one before it partial). Zero when every minute is exact.
	ExactSince time.Time
}

// DedupeKeyParams are the arguments of [InspectDialect.GetByDedupeKey].
type DedupeKeyParams struct {
	Namespace, Topic, DedupeKey string
}

func (s *Store) inspect(op string) (InspectDialect, error) {
	d, ok := s.dialect.(InspectDialect)
	if !ok {
		return nil, fmt.Errorf("outbox: %s: dialect %q has no inspection queries: %w", op, s.dialect.Name(), errors.ErrUnsupported)
	}
	return d, nil
}

// checkErrorFilter refuses an error filter for a dialect that may ignore it.
func (s *Store) checkErrorFilter(op string, f DeadFilter) error {
	if f.ErrorContains == "" && f.LastError == "" {
		return nil
	}
	_, err := s.inspect(op + " by error")
	return err
}

// DeadGroups counts the dead rows that o's filter selects per distinct last error, as
// ServicePulse and CritterWatch group failures: the largest groups first, with how many
// rows each holds and when they died, and the total over all groups. Replay or discard a
// group with [Store.ReplayWhere] or [Store.DiscardWhere] and [DeadFilter.LastError]. It
// reads every dead row in the filter through the retention index, never a delivered or
// live row. A dialect without [InspectDialect] returns an error matching
// [errors.ErrUnsupported].
func (s *Store) DeadGroups(ctx context.Context, o DeadGroupsOptions) (DeadGroups, error) {
	if err := o.validate(); err != nil {
		return DeadGroups{}, err
	}
	switch {
	case o.Limit == 0:
		o.Limit = DefaultDeadGroupsLimit
	case o.Limit < 1 || o.Limit > MaxBatch:
		return DeadGroups{}, invalid("Limit", "must be between 1 and %d, got %d", MaxBatch, o.Limit)
	}
	d, err := s.inspect("dead groups")
	if err != nil {
		return DeadGroups{}, err
	}
	g, err := d.DeadGroups(ctx, s.db, s.table, DeadGroupsParams(o))
	if err != nil {
		return DeadGroups{}, s.sqlError("dead groups", err)
	}
	return g, nil
}

// Activity counts the rows delivered and the rows that died per minute over the last
// o.Minutes minutes (on the database clock), for a throughput chart. It reads at most
// [ActivitySampleRows] of the most recently settled rows of each status, newest first, through
// the retention index, so its cost does not grow with the traffic; past that many, the
// older minutes are incomplete and [Activity.ExactSince] says from where the counts are
// exact. It counts the whole table, whatever the namespace. A dialect without
// [InspectDialect] returns an error matching [errors.ErrUnsupported].
func (s *Store) Activity(ctx context.Context, o ActivityOptions) (Activity, error) {
	switch {
	case o.Minutes == 0:
		o.Minutes = DefaultActivityMinutes
	case o.Minutes < 1 || o.Minutes > MaxActivityMinutes:
		return Activity{}, invalid("Minutes", "must be between 1 and %d, got %d", MaxActivityMinutes, o.Minutes)
	}
	d, err := s.inspect("activity")
	if err != nil {
		return Activity{}, err
	}
	window := time.Duration(o.Minutes) * time.Minute
	raw, err := d.Activity(ctx, s.db, s.table, ActivityParams{Window: window, Limit: ActivitySampleRows})
	if err != nil {
		return Activity{}, s.sqlError("activity", err)
	}
	return raw.minutes(o.Minutes, ActivitySampleRows), nil
}

// minutes lays the sample out over the n minutes that end with the current one.
func (raw ActivitySample) minutes(n, limit int) Activity {
	now := raw.Now.UTC()
	last := now.Unix() / 60
	a := Activity{Now: now}
	for m := last - int64(n) + 1; m <= last; m++ {
		a.Minutes = append(a.Minutes, MinuteActivity{Start: time.Unix(m*60, 0).UTC(), Delivered: raw.Delivered[m], Dead: raw.Dead[m]})
	}
	// A full sample stopped inside its oldest minute: the counts are exact after it.
	exact := int64(0)
	for _, full := range []struct {
		sampled int64
		counts  map[int64]int64
	}{{raw.SampledDelivered, raw.Delivered}, {raw.SampledDead, raw.Dead}} {
		if full.sampled < int64(limit) {
			continue
		}
		oldest := last
		for m := range full.counts {
			oldest = min(oldest, m)
		}
		exact = max(exact, oldest+1)
	}
	if exact > 0 {
		a.ExactSince = time.Unix(exact*60, 0).UTC()
	}
	return a
}

// GetByDedupeKey reads the row that holds the dedupe key in its namespace and topic (see
// [Message.DedupeKey]) through the dedupe index, or returns [ErrNotFound]; a key whose row
// was purged or discarded is free, and not found. A dialect without [InspectDialect]
// returns an error matching [errors.ErrUnsupported].
func (s *Store) GetByDedupeKey(ctx context.Context, namespace, topic, key string) (Record, error) {
	if err := checkText("Namespace", namespace, 1, MaxNamespaceBytes); err != nil {
		return Record{}, err
	}
	if err := checkText("Topic", topic, 1, MaxTopicBytes); err != nil {
		return Record{}, err
	}
	if err := checkText("DedupeKey", key, 1, MaxDedupeKeyBytes); err != nil {
		return Record{}, err
	}
	d, err := s.inspect("get by dedupe key")
	if err != nil {
		return Record{}, err
	}
	r, err := d.GetByDedupeKey(ctx, s.db, s.table, DedupeKeyParams{Namespace: namespace, Topic: topic, DedupeKey: key})
	if errors.Is(err, ErrNotFound) {
		return Record{}, ErrNotFound
	}
	if err != nil {
		return Record{}, s.sqlError("get by dedupe key", err)
	}
	return r, nil
}

// DiscardWhere discards every dead row that f selects, [MaxBatch] at a time (each batch a
// [Store.Discard] of the ids of one [Store.ListDead] page), and returns how many it
// deleted. Rows that die while it runs are newer than its first page and are not
// discarded; to act on exactly the rows an operator saw counted, set f.Until just after
// [DeadGroups.Newest]. When ctx ends it stops between batches and returns the count so far.
func (s *Store) DiscardWhere(ctx context.Context, f DeadFilter) (int64, error) {
	return s.eachDeadPage(ctx, f, func(ids []uuid.UUID) (int, error) {
		r, err := s.Discard(ctx, ids...)
		return len(r.Discarded), err
	})
}
