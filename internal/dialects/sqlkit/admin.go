package sqlkit

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
)

// This file holds what the built-in dialects' admin and retention statements share: the
// three reads of Stats and the dead-letter filter.

// StatsReads are a dialect's three Stats statements, rendered for one call.
//
//   - live: namespace, topic, due pending, scheduled pending, processing, the age in
//     microseconds of the oldest due pending row (0 when none), and of the oldest
//     undelivered row since it was first due (0 when none; see [SQLFirstDue]), grouped by
//     namespace and topic, over the claim index, within the scope;
//   - dead: namespace, topic, count of dead rows, within the scope;
//   - sample: namespace, topic, tenant_id, a count, the count of rows settled at the
//     sample's oldest updated_at, and that time's age in microseconds, grouped, over the
//     most recent delivered rows (any scope, bounded by the statement's LIMIT: see
//     [SampleSQL]);
//   - total: the table's delivered rows, estimated, given how many live and dead rows
//     the other reads counted; run only when the sample is full.
type StatsReads struct {
	Live, Dead, Sample             string
	LiveArgs, DeadArgs, SampleArgs []any
	Total                          func(counted int64) (int64, error)
}

// SQLFirstDue renders when a live row was first due, given the dialect's now: while it was
// never claimed (no lease token), its next_attempt_at, which nothing has moved; once it
// was, its created_at, since each retry and each outage's probe moves next_attempt_at
// forward. NULL for a row never claimed and not due yet (delayed).
func SQLFirstDue(now string) string {
	return `CASE WHEN lease_token IS NOT NULL THEN created_at WHEN next_attempt_at <= ` + now + ` THEN next_attempt_at END`
}

// SampleSQL renders the sample read over the rows that recent selects (namespace, topic,
// tenant_id and updated_at of the most recent delivered rows, with their LIMIT): per
// (namespace, topic, tenant), the rows, the rows at the sample's oldest updated_at (a
// window function over the limited rows), and age(lo), the dialect's age in microseconds
// of the oldest updated_at.
func SampleSQL(recent string, age func(lo string) string) string {
	return `SELECT namespace, topic, tenant_id, COUNT(*), SUM(CASE WHEN updated_at = lo THEN 1 ELSE 0 END), ` + age("MAX(lo)") +
		` FROM (SELECT namespace, topic, tenant_id, updated_at, MIN(updated_at) OVER () AS lo FROM (` + recent + `) s0) s` +
		` GROUP BY namespace, topic, tenant_id`
}

// topicKey is the (namespace, topic) of a TopicStats entry.
type topicKey struct{ ns, topic string }

// RunStatsReads runs r on q and merges its rows into a dialect.StatsSample.
func RunStatsReads(ctx context.Context, q dialect.DBTX, sc dialect.Scope, limit int, r StatsReads) (dialect.StatsSample, error) {
	byTopic := map[topicKey]*dialect.TopicStats{}
	entry := func(ns, topic string) *dialect.TopicStats {
		k := topicKey{ns, topic}
		if byTopic[k] == nil {
			byTopic[k] = &dialect.TopicStats{Namespace: ns, Topic: topic}
		}
		return byTopic[k]
	}
	_, err := QueryAll(ctx, q, r.Live, r.LiveArgs, func(s RowScanner) (struct{}, error) {
		var (
			ns, topic                          string
			due, sched, proc, ageUsec, undUsec int64
		)
		if err := s.Scan(&ns, &topic, &due, &sched, &proc, &ageUsec, &undUsec); err != nil {
			return struct{}{}, err
		}
		e := entry(ns, topic)
		e.Pending, e.Scheduled, e.Processing = due, sched, proc
		e.OldestPendingAge = time.Duration(max(ageUsec, 0)) * time.Microsecond
		e.OldestUndeliveredAge = time.Duration(max(undUsec, 0)) * time.Microsecond
		return struct{}{}, nil
	})
	if err != nil {
		return dialect.StatsSample{}, err
	}
	_, err = QueryAll(ctx, q, r.Dead, r.DeadArgs, func(s RowScanner) (struct{}, error) {
		var (
			ns, topic string
			n         int64
		)
		if err := s.Scan(&ns, &topic, &n); err != nil {
			return struct{}{}, err
		}
		entry(ns, topic).Dead = n
		return struct{}{}, nil
	})
	if err != nil {
		return dialect.StatsSample{}, err
	}
	var out dialect.StatsSample
	atLo := map[topicKey]int64{}
	var loUsec int64
	_, err = QueryAll(ctx, q, r.Sample, r.SampleArgs, func(s RowScanner) (struct{}, error) {
		var (
			ns, topic   string
			tenant      uuid.NullUUID
			n, at, usec int64
		)
		if err := s.Scan(&ns, &topic, &tenant, &n, &at, &usec); err != nil {
			return struct{}{}, err
		}
		out.DeliveredSampled += n
		loUsec = max(loUsec, usec)
		if inScope(sc, ns, topic, tenant.UUID) {
			entry(ns, topic).Delivered += n
			atLo[topicKey{ns, topic}] += at
		}
		return struct{}{}, nil
	})
	if err != nil {
		return dialect.StatsSample{}, err
	}
	if out.DeliveredSampled >= int64(limit) {
		// The sample may have cut the rows settled at its oldest time: count after it.
		out.DeliveredWindow = time.Duration(max(loUsec, 1)) * time.Microsecond
		for k, n := range atLo {
			byTopic[k].Delivered -= n
		}
		var counted int64
		for _, e := range byTopic {
			counted += e.Pending + e.Scheduled + e.Processing + e.Dead
		}
		if out.DeliveredTotal, err = r.Total(counted); err != nil {
			return dialect.StatsSample{}, err
		}
		out.DeliveredTotal = max(out.DeliveredTotal, out.DeliveredSampled)
	}
	for _, e := range byTopic {
		out.Topics = append(out.Topics, *e)
	}
	return out, nil
}

// inScope reports whether a row of (ns, topic, tenant) is in sc.
func inScope(sc dialect.Scope, ns, topic string, tenant uuid.UUID) bool {
	if sc.Namespace != "" && ns != sc.Namespace {
		return false
	}
	if sc.TenantID != uuid.Nil && tenant != sc.TenantID {
		return false
	}
	if len(sc.Topics) == 0 {
		return true
	}
	for _, t := range sc.Topics {
		if t == topic {
			return true
		}
	}
	return false
}

// Retained renders status = 'status' for a delivered or dead status, after the
// predicate of the partial retention index, which SQLite can use only when a query's WHERE
// repeats that predicate's term (it does not infer status IN (...) from status = ...). The
// other databases read the repeated term as the single value.
func Retained(status dialect.Status) string {
	return `status IN ('delivered', 'dead') AND status = '` + string(status) + `'`
}

// DeadWhere renders the WHERE terms of ListDead: dead rows in the filter, after the keyset.
// at binds a time the way the dialect compares updated_at; enc binds a UUID; contains
// renders the dialect's case-sensitive substring test of last_error.
func DeadWhere(a *dialect.Args, p dialect.ListDeadParams, at func(a *dialect.Args, t time.Time) string, enc func(uuid.UUID) any, contains func(ph string) string) string {
	w := Retained(dialect.StatusDead) + ScopeSQL(a, p.Scope, "", enc)
	if !p.Since.IsZero() {
		w += ` AND updated_at >= ` + at(a, p.Since)
	}
	if !p.Until.IsZero() {
		w += ` AND updated_at < ` + at(a, p.Until)
	}
	w += errorWhere(a, p.DeadFilter, contains)
	if p.AfterID != uuid.Nil {
		w += ` AND updated_at <= ` + at(a, p.AfterTime) + ` AND (updated_at < ` + at(a, p.AfterTime) +
			` OR id < ` + a.Add(enc(p.AfterID)) + `)`
	}
	return w
}

// errorWhere renders the error terms of a dead filter. They test each dead row that the
// retention index range yields; no index holds last_error, and none is needed: the range
// holds only dead rows.
func errorWhere(a *dialect.Args, f dialect.DeadFilter, contains func(ph string) string) string {
	w := ""
	if f.ErrorContains != "" {
		w += ` AND ` + contains(a.Add(f.ErrorContains))
	}
	if f.LastError != "" {
		w += ` AND last_error = ` + a.Add(f.LastError)
	}
	return w
}

// RunDeadGroups runs DeadGroups' two reads: groups yields last error, count, first and last
// death; total yields the count and the newest death.
func RunDeadGroups(ctx context.Context, q dialect.DBTX, groups, total string, gargs, targs []any) (dialect.DeadGroups, error) {
	var out dialect.DeadGroups
	var err error
	out.Groups, err = QueryAll(ctx, q, groups, gargs, func(s RowScanner) (dialect.DeadGroup, error) {
		var g dialect.DeadGroup
		err := s.Scan(&g.LastError, &g.Count, dialect.ScanTime(&g.FirstDied), dialect.ScanTime(&g.LastDied))
		return g, err
	})
	if err != nil {
		return dialect.DeadGroups{}, err
	}
	if err := q.QueryRowContext(ctx, total, targs...).Scan(&out.Total, dialect.ScanTime(&out.Newest)); err != nil {
		return dialect.DeadGroups{}, err
	}
	return out, nil
}

// RunActivity runs Activity's read of each status (query renders it; its arguments are the
// window in microseconds and the limit) and merges them with the clock's now.
func RunActivity(ctx context.Context, q dialect.DBTX, now time.Time, query func(dialect.Status) string, window int64, limit int) (dialect.ActivitySample, error) {
	out := dialect.ActivitySample{Now: now.UTC(), Delivered: map[int64]int64{}, Dead: map[int64]int64{}}
	for _, st := range []struct {
		status  dialect.Status
		counts  map[int64]int64
		sampled *int64
	}{{dialect.StatusDelivered, out.Delivered, &out.SampledDelivered}, {dialect.StatusDead, out.Dead, &out.SampledDead}} {
		_, err := QueryAll(ctx, q, query(st.status), []any{window, limit}, func(s RowScanner) (struct{}, error) {
			var minute, n int64
			if err := s.Scan(&minute, &n); err != nil {
				return struct{}{}, err
			}
			st.counts[minute] += n
			*st.sampled += n
			return struct{}{}, nil
		})
		if err != nil {
			return dialect.ActivitySample{}, err
		}
	}
	return out, nil
}
