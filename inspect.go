package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
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

// DeadGroupsOptions are the arguments of [Store.DeadGroups].
type DeadGroupsOptions struct {
	DeadFilter
	// Limit is the most groups returned: default [DefaultDeadGroupsLimit], at most
	// [MaxBatch]. [DeadGroups.Total] counts every row in the filter regardless.
	Limit int
}

// DeadGroup is the dead rows that share one last error, as [Store.DeadGroups] returns them:
// the LastError ("" when none was recorded), their Count, and their FirstDied and LastDied
// (the oldest and newest updated_at).
type DeadGroup = dialect.DeadGroup

// DeadGroups is what [Store.DeadGroups] returns: the largest Groups, most rows first (ties
// by LastError), the Total of dead rows in the filter, in the groups returned or not, and
// the Newest death among them; a filter with Until set just after Newest selects exactly
// the rows counted, however many die later.
type DeadGroups = dialect.DeadGroups

// ActivityOptions are the arguments of [Store.Activity].
type ActivityOptions struct {
	// Minutes is the window: default [DefaultActivityMinutes], at most [MaxActivityMinutes].
	Minutes int
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

func (s *Store) inspect(op string) (dialect.Inspector, error) {
	d, ok := s.dialect.(dialect.Inspector)
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
// live row. A dialect without [dialect.Inspector] returns an error matching
// [errors.ErrUnsupported].
func (s *Store) DeadGroups(ctx context.Context, o DeadGroupsOptions) (DeadGroups, error) {
	if err := validateDeadFilter(o.DeadFilter); err != nil {
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
	g, err := d.DeadGroups(ctx, s.db, s.table, dialect.DeadGroupsParams(o))
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
// [dialect.Inspector] returns an error matching [errors.ErrUnsupported].
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
	raw, err := d.Activity(ctx, s.db, s.table, dialect.ActivityParams{Window: window, Limit: ActivitySampleRows})
	if err != nil {
		return Activity{}, s.sqlError("activity", err)
	}
	return activityMinutes(raw, o.Minutes, ActivitySampleRows), nil
}

// activityMinutes lays the sample out over the n minutes that end with the current one.
func activityMinutes(raw dialect.ActivitySample, n, limit int) Activity {
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
// was purged or discarded is free, and not found. A dialect without [dialect.Inspector]
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
	r, err := d.GetByDedupeKey(ctx, s.db, s.table, dialect.DedupeKeyParams{Namespace: namespace, Topic: topic, DedupeKey: key})
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
