package customdialect

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
)

// errBadConn makes database/sql discard a connection that listened.
var errBadConn = driver.ErrBadConn

// Stats counts the live and dead rows exactly, and the delivered ones from a sample of the
// most recent, read through the settled index.
func (*Dialect) Stats(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.StatsParams) (dialect.StatsSample, error) {
	a := newArgs()
	tbl := quote(t.Name())
	sc := a.scope(p.Scope, "")
	live := `SELECT namespace, topic,
			count(*) FILTER (WHERE state = 0 AND due_at <= n.now),
			count(*) FILTER (WHERE state = 0 AND due_at > n.now),
			count(*) FILTER (WHERE state = 1),
			count(*) FILTER (WHERE state = 3),
			coalesce(extract(epoch FROM n.now - min(due_at) FILTER (WHERE state = 0 AND due_at <= n.now)) * 1e6, 0)::bigint,
			coalesce(extract(epoch FROM n.now - min(CASE WHEN lease_token IS NOT NULL THEN created_at WHEN due_at <= n.now THEN due_at END)
				FILTER (WHERE state IN (0, 1))) * 1e6, 0)::bigint
		FROM ` + tbl + `, (SELECT ` + now + ` AS now) n WHERE state IN (0, 1, 3)` + sc + ` GROUP BY namespace, topic, n.now`
	type key struct{ ns, topic string }
	byKey := map[key]*dialect.TopicStats{}
	var order []key
	get := func(k key) *dialect.TopicStats {
		if s, ok := byKey[k]; ok {
			return s
		}
		s := &dialect.TopicStats{Namespace: k.ns, Topic: k.topic}
		byKey[k] = s
		order = append(order, k)
		return s
	}
	_, err := query(ctx, q, func(s scanner) (struct{}, error) {
		var k key
		var pend, sched, proc, dead, ageMicros, undMicros int64
		if err := s.Scan(&k.ns, &k.topic, &pend, &sched, &proc, &dead, &ageMicros, &undMicros); err != nil {
			return struct{}{}, err
		}
		ts := get(k)
		ts.Pending, ts.Scheduled, ts.Processing, ts.Dead = pend, sched, proc, dead
		ts.OldestPendingAge = time.Duration(ageMicros) * time.Microsecond
		// First due: due_at while never claimed; created_at once claimed (retries move due_at).
		ts.OldestUndeliveredAge = time.Duration(undMicros) * time.Microsecond
		return struct{}{}, nil
	}, live, a.Values...)
	if err != nil {
		return dialect.StatsSample{}, err
	}
	b := newArgs()
	// Each sampled row, whether it is in scope, and whether it settled at the sample's
	// oldest time (which a full sample may have cut), with that time's age.
	sample := `SELECT namespace, topic, count(*) OVER (), coalesce(TRUE` + b.scope(p.Scope, "") + `, FALSE),
			updated_at = min(updated_at) OVER (), (extract(epoch FROM ` + now + ` - min(updated_at) OVER ()) * 1e6)::bigint
		FROM (SELECT namespace, topic, tenant, updated_at FROM ` + tbl +
		` WHERE state = 2 ORDER BY updated_at DESC LIMIT ` + b.Add(p.DeliveredSample) + `) s`
	var out dialect.StatsSample
	atOldest := map[key]int64{}
	var window int64
	_, err = query(ctx, q, func(s scanner) (struct{}, error) {
		var k key
		var in, oldest bool
		if err := s.Scan(&k.ns, &k.topic, &out.DeliveredSampled, &in, &oldest, &window); err != nil {
			return struct{}{}, err
		}
		if in {
			get(k).Delivered++
			if oldest {
				atOldest[k]++
			}
		}
		return struct{}{}, nil
	}, sample, b.Values...)
	if err != nil {
		return dialect.StatsSample{}, err
	}
	if out.DeliveredSampled >= int64(p.DeliveredSample) {
		// Exact since the sample's oldest time: the rows at it are left out.
		out.DeliveredWindow = time.Duration(max(window, 1)) * time.Microsecond
		for k, n := range atOldest {
			byKey[k].Delivered -= n
		}
		// The planner's estimate of the table's rows, less the live and dead ones counted:
		// no delivered row is read.
		var est float64
		if err := q.QueryRowContext(ctx, `SELECT greatest(reltuples, 0) FROM pg_class WHERE oid = to_regclass($1)`, tbl).Scan(&est); err != nil {
			return dialect.StatsSample{}, err
		}
		out.DeliveredTotal = max(int64(est), out.DeliveredSampled)
	}
	for _, k := range order {
		out.Topics = append(out.Topics, *byKey[k])
	}
	return out, nil
}

// deadFilter renders the WHERE terms of dead rows in f.
func (a *args) deadFilter(f dialect.DeadFilter) string {
	w := `state = 3` + a.scope(f.Scope, "")
	if !f.Since.IsZero() {
		w += ` AND updated_at >= ` + a.Add(f.Since)
	}
	if !f.Until.IsZero() {
		w += ` AND updated_at < ` + a.Add(f.Until)
	}
	if f.ErrorContains != "" {
		w += ` AND strpos(error, ` + a.Add(f.ErrorContains) + `) > 0`
	}
	if f.LastError != "" {
		w += ` AND coalesce(error, '') = ` + a.Add(f.LastError)
	}
	return w
}

// ListDead pages dead rows newest death first, by keyset.
func (*Dialect) ListDead(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ListDeadParams) ([]dialect.Record, error) {
	a := newArgs()
	w := a.deadFilter(p.DeadFilter)
	if p.AfterID != uuid.Nil {
		w += ` AND (updated_at, id) < (` + a.Add(p.AfterTime) + `, ` + a.Add(p.AfterID.String()) + `::uuid)`
	}
	return query(ctx, q, scanRecord, `SELECT `+selectCols+` FROM `+quote(t.Name())+` WHERE `+w+
		` ORDER BY updated_at DESC, id DESC LIMIT `+a.Add(p.Limit), a.Values...)
}

// Replay moves dead rows back to pending, due now, under a fresh token.
func (*Dialect) Replay(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ReplayParams) ([]uuid.UUID, error) {
	a := newArgs()
	return dialect.QueryIDs(ctx, db, `UPDATE `+quote(t.Name())+` SET state = 0, attempts = 0, due_at = `+now+
		`, owner = NULL, lease_until = NULL, lease_token = `+a.Add(p.Token.String())+`::uuid, replays = replays + 1, updated_at = `+now+
		` WHERE id = ANY(`+a.uuids(p.IDs)+`) AND state = 3 RETURNING id`, a.Values...)
}

// Discard deletes dead rows.
func (*Dialect) Discard(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.DiscardParams) ([]uuid.UUID, error) {
	a := newArgs()
	return dialect.QueryIDs(ctx, db, `DELETE FROM `+quote(t.Name())+` WHERE id = ANY(`+a.uuids(p.IDs)+`) AND state = 3 RETURNING id`, a.Values...)
}

// Purge deletes settled rows of one state, oldest first, skipping rows another purger holds.
func (*Dialect) Purge(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.PurgeParams) (int64, error) {
	a := newArgs()
	tbl := quote(t.Name())
	res, err := db.ExecContext(ctx, `WITH picked AS (SELECT id FROM `+tbl+` WHERE state = `+a.Add(stateOf(p.Status))+
		`::smallint AND updated_at < `+now+` - `+a.interval(p.OlderThan)+` ORDER BY updated_at LIMIT `+a.Add(p.Limit)+
		` FOR UPDATE SKIP LOCKED) DELETE FROM `+tbl+` o USING picked WHERE o.id = picked.id`, a.Values...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// DeadGroups counts dead rows per last error.
func (*Dialect) DeadGroups(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.DeadGroupsParams) (dialect.DeadGroups, error) {
	a := newArgs()
	w := a.deadFilter(p.DeadFilter)
	tbl := quote(t.Name())
	var out dialect.DeadGroups
	if err := q.QueryRowContext(ctx, `SELECT count(*), max(updated_at) FROM `+tbl+` WHERE `+w, a.Values...).Scan(&out.Total, dialect.ScanTime(&out.Newest)); err != nil {
		return dialect.DeadGroups{}, err
	}
	groups, err := query(ctx, q, func(s scanner) (g dialect.DeadGroup, err error) {
		err = s.Scan(&g.LastError, &g.Count, dialect.ScanTime(&g.FirstDied), dialect.ScanTime(&g.LastDied))
		return g, err
	}, `SELECT coalesce(error, '') COLLATE "C" AS e, count(*), min(updated_at), max(updated_at) FROM `+tbl+` WHERE `+w+
		` GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT `+a.Add(p.Limit), a.Values...)
	out.Groups = groups
	return out, err
}

// Activity counts the most recent delivered and dead rows per minute of Unix time.
func (*Dialect) Activity(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ActivityParams) (dialect.ActivitySample, error) {
	out := dialect.ActivitySample{Delivered: map[int64]int64{}, Dead: map[int64]int64{}}
	if err := q.QueryRowContext(ctx, `SELECT `+now).Scan(&out.Now); err != nil {
		return out, err
	}
	out.Now = out.Now.UTC()
	for _, st := range []struct {
		state   int16
		minutes map[int64]int64
		sampled *int64
	}{{stateDelivered, out.Delivered, &out.SampledDelivered}, {stateDead, out.Dead, &out.SampledDead}} {
		a := newArgs()
		stmt := `SELECT floor(extract(epoch FROM updated_at) / 60)::bigint AS m, count(*) FROM (SELECT updated_at FROM ` + quote(t.Name()) +
			` WHERE state = ` + a.Add(st.state) + `::smallint AND updated_at >= ` + a.Add(out.Now) + `::timestamptz - ` + a.interval(p.Window) +
			` ORDER BY updated_at DESC LIMIT ` + a.Add(p.Limit) + `) s GROUP BY m`
		_, err := query(ctx, q, func(s scanner) (struct{}, error) {
			var m, n int64
			err := s.Scan(&m, &n)
			st.minutes[m] += n
			*st.sampled += n
			return struct{}{}, err
		}, stmt, a.Values...)
		if err != nil {
			return dialect.ActivitySample{}, err
		}
	}
	return out, nil
}

// GetByDedupeKey reads a row through the dedupe index.
func (*Dialect) GetByDedupeKey(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.DedupeKeyParams) (dialect.Record, error) {
	r, err := scanRecord(q.QueryRowContext(ctx, `SELECT `+selectCols+` FROM `+quote(t.Name())+
		` WHERE namespace = $1 AND topic = $2 AND dedupe_key = $3`, p.Namespace, p.Topic, p.DedupeKey))
	if err == sql.ErrNoRows {
		return dialect.Record{}, dialect.ErrNotFound
	}
	return r, err
}
