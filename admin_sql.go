package outbox

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// This file holds what the built-in dialects' admin and retention statements share: the
// three reads of Stats and the dead-letter filter.

// statsReads are a dialect's three Stats statements, rendered for one call.
//
//   - live: namespace, topic, due pending, scheduled pending, processing, and the age in
//     microseconds of the oldest due pending row (0 when none), grouped by namespace and
//     topic, over the claim index, within the scope;
//   - dead: namespace, topic, count of dead rows, within the scope;
//   - sample: namespace, topic, tenant_id and a count, grouped, over the most recent
//     delivered rows (any scope, bounded by the statement's LIMIT);
//   - total: the table's delivered rows, estimated, given how many live and dead rows
//     the other reads counted; run only when the sample is full.
type statsReads struct {
	live, dead, sample          string
	liveArgs, deadArgs, sampArg []any
	total                       func(counted int64) (int64, error)
}

// topicKey is the (namespace, topic) of a TopicStats entry.
type topicKey struct{ ns, topic string }

// runStatsReads runs r on q and merges its rows into a StatsSample.
func runStatsReads(ctx context.Context, q DBTX, sc Scope, limit int, r statsReads) (StatsSample, error) {
	byTopic := map[topicKey]*TopicStats{}
	entry := func(ns, topic string) *TopicStats {
		k := topicKey{ns, topic}
		if byTopic[k] == nil {
			byTopic[k] = &TopicStats{Namespace: ns, Topic: topic}
		}
		return byTopic[k]
	}
	_, err := queryAll(ctx, q, r.live, r.liveArgs, func(s rowScanner) (struct{}, error) {
		var (
			ns, topic                 string
			due, sched, proc, ageUsec int64
		)
		if err := s.Scan(&ns, &topic, &due, &sched, &proc, &ageUsec); err != nil {
			return struct{}{}, err
		}
		e := entry(ns, topic)
		e.Pending, e.Scheduled, e.Processing = due, sched, proc
		e.OldestPendingAge = time.Duration(max(ageUsec, 0)) * time.Microsecond
		return struct{}{}, nil
	})
	if err != nil {
		return StatsSample{}, err
	}
	_, err = queryAll(ctx, q, r.dead, r.deadArgs, func(s rowScanner) (struct{}, error) {
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
		return StatsSample{}, err
	}
	var out StatsSample
	_, err = queryAll(ctx, q, r.sample, r.sampArg, func(s rowScanner) (struct{}, error) {
		var (
			ns, topic string
			tenant    uuid.NullUUID
			n         int64
		)
		if err := s.Scan(&ns, &topic, &tenant, &n); err != nil {
			return struct{}{}, err
		}
		out.DeliveredSampled += n
		if inScope(sc, ns, topic, tenant.UUID) {
			entry(ns, topic).Delivered += n
		}
		return struct{}{}, nil
	})
	if err != nil {
		return StatsSample{}, err
	}
	if out.DeliveredSampled >= int64(limit) {
		var counted int64
		for _, e := range byTopic {
			counted += e.Pending + e.Scheduled + e.Processing + e.Dead
		}
		if out.DeliveredTotal, err = r.total(counted); err != nil {
			return StatsSample{}, err
		}
		out.DeliveredTotal = max(out.DeliveredTotal, out.DeliveredSampled)
	}
	for _, e := range byTopic {
		out.Topics = append(out.Topics, *e)
	}
	return out, nil
}

// inScope reports whether a row of (ns, topic, tenant) is in sc.
func inScope(sc Scope, ns, topic string, tenant uuid.UUID) bool {
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

// sqliteRetained renders status = 'status' for a delivered or dead status, after the
// predicate of the partial retention index, which SQLite can use only when a query's WHERE
// repeats that predicate's term (it does not infer status IN (...) from status = ...). The
// other databases read the repeated term as the single value.
func sqliteRetained(status Status) string {
	return `status IN ('delivered', 'dead') AND status = '` + string(status) + `'`
}

// deadWhere renders the WHERE terms of ListDead: dead rows in the filter, after the keyset.
// at binds a time the way the dialect compares updated_at; enc binds a UUID.
func deadWhere(a *args, p ListDeadParams, at func(a *args, t time.Time) string, enc func(uuid.UUID) any) string {
	w := sqliteRetained(StatusDead) + scopeSQL(a, p.Scope, "", enc)
	if !p.Since.IsZero() {
		w += ` AND updated_at >= ` + at(a, p.Since)
	}
	if !p.Until.IsZero() {
		w += ` AND updated_at < ` + at(a, p.Until)
	}
	if p.AfterID != uuid.Nil {
		w += ` AND updated_at <= ` + at(a, p.AfterTime) + ` AND (updated_at < ` + at(a, p.AfterTime) +
			` OR id < ` + a.add(enc(p.AfterID)) + `)`
	}
	return w
}
