package outbox

import (
	"cmp"
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
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

// DeadGroups counts the dead rows that o's filter selects per distinct last error, as
// ServicePulse and CritterWatch group failures: the largest groups first, with how many
// rows each holds and when they died, and the total over all groups. Replay or discard a
// group with [Store.ReplayWhere] or [Store.DiscardWhere] and [DeadFilter.LastError]. It
// reads every dead row in the filter through the retention index, never a delivered or
// live row. A dialect without [dialect.Admin] returns an error matching
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
	d, err := s.admin("dead groups")
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
// [dialect.Admin] returns an error matching [errors.ErrUnsupported].
func (s *Store) Activity(ctx context.Context, o ActivityOptions) (Activity, error) {
	switch {
	case o.Minutes == 0:
		o.Minutes = DefaultActivityMinutes
	case o.Minutes < 1 || o.Minutes > MaxActivityMinutes:
		return Activity{}, invalid("Minutes", "must be between 1 and %d, got %d", MaxActivityMinutes, o.Minutes)
	}
	d, err := s.admin("activity")
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
// was purged or discarded is free, and not found. A dialect without [dialect.Admin]
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
	d, err := s.admin("get by dedupe key")
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

// DeadCauseTexts is how many distinct last errors [Store.DeadCauses] reads at most, the
// commonest first. Rows whose error is rarer than that are counted in
// [DeadCauses.Ungrouped], in no cause.
const DeadCauseTexts = 10_000

// DeadCause is the dead rows whose last errors share one [ErrorFingerprint]: one cause,
// whatever topic, id, count or name its messages carry.
type DeadCause struct {
	// Fingerprint is the errors' text with its variable parts masked (see
	// [ErrorFingerprint]); "" for rows that recorded no error.
	Fingerprint string
	// Count is the rows of the cause; FirstDied and LastDied the oldest and newest death
	// (updated_at) among them.
	Count               int64
	FirstDied, LastDied time.Time
	// Texts are the cause's distinct last errors, most rows first (ties by the text), each
	// with its own count and deaths. [DeadFilter.LastError] selects the rows of one.
	Texts []DeadGroup
}

// DeadCauses is what [Store.DeadCauses] returns: the largest Causes, most rows first (ties
// by Fingerprint); the Total of dead rows in the filter and the Newest death among them,
// as in [DeadGroups]; and Ungrouped, the rows whose last error was too rare to be read
// (beyond [DeadCauseTexts] distinct errors), counted in Total and in no cause.
type DeadCauses struct {
	Causes    []DeadCause
	Total     int64
	Newest    time.Time
	Ungrouped int64
}

// The variable parts [ErrorFingerprint] masks, in the order it masks them.
var (
	fpURL    = regexp.MustCompile(`\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s/"'<>]+(/[^\s"'<>]*)?`)
	fpQuoted = regexp.MustCompile("\"(?:[^\"\\\\\\n]|\\\\.){0,512}\"|'[^'\\n]{0,512}'|`[^`\\n]{0,512}`")
	fpUUID   = regexp.MustCompile(`\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b`)
	// A hexadecimal run of 12 or more with a digit in it: a hash, an object id, a trace id.
	fpHex = regexp.MustCompile(`\b[0-9a-fA-F]*[0-9][0-9a-fA-F]*\b`)
	// A dotted, slashed or colon-joined name that starts with a letter: a topic, a subject,
	// a queue, a host name, a file (orders.created, tenant-7/invoices, kafka:orders).
	fpName = regexp.MustCompile(`\b[A-Za-z_][A-Za-z0-9_-]*(?:[./][A-Za-z0-9_-]+)+\b`)
	// A number, with its fraction and a unit glued to it (42, 1.5, 250ms, 64KiB).
	fpNumber = regexp.MustCompile(`\d+(?:\.\d+)?[A-Za-zµ]*`)
)

// ErrorFingerprint returns what stays of a last error when its variable parts are masked,
// so that one cause is one group however many topics, rows or attempts it hit: a URL's
// path (its scheme and host stay) becomes "/…"; a quoted string "…"; a UUID <uuid>; a run
// of 12 or more hexadecimal digits <id>; a name joined by dots or slashes (a topic, a
// subject, a host) <name>; and a number, with a unit glued to it, <n>, except a three-digit
// number from 100 to 599 that stands alone, kept because it is usually a status code (HTTP
// 503 and 400 are two causes). Runs of blanks become one space.
//
// "kafka: produce to orders.created: MESSAGE_TOO_LARGE" and the same error for any other
// topic have the fingerprint "kafka: produce to <name>: MESSAGE_TOO_LARGE".
func ErrorFingerprint(lastError string) string {
	s := strings.Join(strings.Fields(strings.ReplaceAll(lastError, "\x00", "")), " ")
	// URLs are set aside first, their paths cut, so that the masks below leave their hosts.
	var urls []string
	s = fpURL.ReplaceAllStringFunc(s, func(u string) string {
		rest := strings.TrimRight(u, ":,;.)")
		end := u[len(rest):]
		if i := strings.Index(rest, "://"); strings.Contains(rest[i+3:], "/") {
			rest = rest[:i+3+strings.Index(rest[i+3:], "/")] + "/…"
		}
		urls = append(urls, rest)
		return "\x00" + end
	})
	s = fpQuoted.ReplaceAllStringFunc(s, func(q string) string { return q[:1] + "…" + q[:1] })
	s = fpUUID.ReplaceAllString(s, "<uuid>")
	s = fpHex.ReplaceAllStringFunc(s, func(h string) string {
		if len(h) >= 12 {
			return "<id>"
		}
		return h
	})
	s = fpName.ReplaceAllString(s, "<name>")
	s = fpNumber.ReplaceAllStringFunc(s, func(n string) string {
		if len(n) == 3 && strings.Trim(n, "0123456789") == "" && n >= "100" && n <= "599" {
			return n
		}
		return "<n>"
	})
	for _, u := range urls {
		s = strings.Replace(s, "\x00", u, 1)
	}
	return s
}

// DeadCauses groups the dead rows that o's filter selects by the [ErrorFingerprint] of
// their last error: one group per cause, with the distinct texts inside it, largest first,
// at most o.Limit causes (default [DefaultDeadGroupsLimit], at most [MaxBatch]). It reads
// the database's groups by exact text ([Store.DeadGroups], up to [DeadCauseTexts] of them,
// through the retention index) and merges them here, so every dialect with
// [dialect.Admin] groups alike. Act on a cause with [Store.ReplayCause] and
// [Store.DiscardCause].
func (s *Store) DeadCauses(ctx context.Context, o DeadGroupsOptions) (DeadCauses, error) {
	switch {
	case o.Limit == 0:
		o.Limit = DefaultDeadGroupsLimit
	case o.Limit < 1 || o.Limit > MaxBatch:
		return DeadCauses{}, invalid("Limit", "must be between 1 and %d, got %d", MaxBatch, o.Limit)
	}
	c, err := s.deadCauses(ctx, o.DeadFilter, "dead causes")
	if err != nil {
		return DeadCauses{}, err
	}
	if len(c.Causes) > o.Limit {
		c.Causes = c.Causes[:o.Limit]
	}
	return c, nil
}

// deadCauses returns every cause of the rows f selects.
func (s *Store) deadCauses(ctx context.Context, f DeadFilter, op string) (DeadCauses, error) {
	if err := validateDeadFilter(f); err != nil {
		return DeadCauses{}, err
	}
	d, err := s.admin(op)
	if err != nil {
		return DeadCauses{}, err
	}
	g, err := d.DeadGroups(ctx, s.db, s.table, dialect.DeadGroupsParams{DeadFilter: f, Limit: DeadCauseTexts})
	if err != nil {
		return DeadCauses{}, s.sqlError(op, err)
	}
	return mergeCauses(g), nil
}

// mergeCauses merges exact-text groups by fingerprint.
func mergeCauses(g DeadGroups) DeadCauses {
	out := DeadCauses{Total: g.Total, Newest: g.Newest, Ungrouped: g.Total}
	at := map[string]int{}
	for _, t := range g.Groups {
		fp := ErrorFingerprint(t.LastError)
		i, ok := at[fp]
		if !ok {
			i = len(out.Causes)
			at[fp] = i
			out.Causes = append(out.Causes, DeadCause{Fingerprint: fp, FirstDied: t.FirstDied, LastDied: t.LastDied})
		}
		c := &out.Causes[i]
		c.Count += t.Count
		c.Texts = append(c.Texts, t)
		c.FirstDied = minTime(c.FirstDied, t.FirstDied)
		c.LastDied = maxTime(c.LastDied, t.LastDied)
		out.Ungrouped -= t.Count
	}
	slices.SortFunc(out.Causes, func(a, b DeadCause) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Fingerprint, b.Fingerprint))
	})
	return out
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// ReplayCause replays the dead rows that f selects whose last error has the fingerprint
// fp (a [DeadCause.Fingerprint]), as [Store.ReplayWhere] does for each of its texts, and
// returns how many it replayed. To act on exactly the rows an operator saw counted, set
// f.Until just after [DeadCauses.Newest]. A fingerprint no row has replays nothing, and
// so does the cause "" (rows that recorded no error, which no error filter selects: replay
// them by id, or with [Store.ReplayWhere]).
func (s *Store) ReplayCause(ctx context.Context, f DeadFilter, fp string) (int64, error) {
	return s.eachCauseText(ctx, f, fp, "replay cause", s.ReplayWhere)
}

// DiscardCause discards the dead rows that f selects whose last error has the fingerprint
// fp, as [Store.DiscardWhere] does for each of its texts, and returns how many it deleted.
func (s *Store) DiscardCause(ctx context.Context, f DeadFilter, fp string) (int64, error) {
	return s.eachCauseText(ctx, f, fp, "discard cause", s.DiscardWhere)
}

// eachCauseText runs act over f narrowed to each text of the cause fp.
func (s *Store) eachCauseText(ctx context.Context, f DeadFilter, fp, op string, act func(context.Context, DeadFilter) (int64, error)) (int64, error) {
	if err := checkText("fingerprint", fp, 0, MaxLastErrorBytes); err != nil {
		return 0, err
	}
	if f.LastError != "" {
		return 0, invalid("LastError", "selects one text; a cause selects its texts itself, so leave it empty")
	}
	c, err := s.deadCauses(ctx, f, op)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, cause := range c.Causes {
		if cause.Fingerprint != fp {
			continue
		}
		for _, t := range cause.Texts {
			if t.LastError == "" {
				continue // LastError "" is no filter: it would act on every row in f
			}
			tf := f
			tf.LastError = t.LastError
			done, err := act(ctx, tf)
			n += done
			if err != nil {
				return n, err
			}
		}
	}
	return n, nil
}
