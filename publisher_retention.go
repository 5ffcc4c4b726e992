package outbox

import (
	"cmp"
	"math/rand/v2"
	"time"
)

// Defaults of [DefaultRetention], the settings River's job cleaner also uses.
const (
	DefaultRetentionDelivered = 24 * time.Hour
	DefaultRetentionDead      = 7 * 24 * time.Hour
	DefaultRetentionInterval  = time.Minute
)

// Retention makes a [Publisher] delete old rows as it runs, with [Store.Purge]'s batches:
// delivered rows settled longer ago than Delivered and dead rows that died longer ago than
// Dead (updated_at, on the database clock). A zero duration keeps that kind of row; the
// zero Retention keeps every row, and is the default.
//
// Retention is off by default because deleting rows changes what the table promises: a
// delivered row is what makes a [Message.DedupeKey] refuse a second enqueue, so delivered
// retention is also the dedupe window, and a library that started deleting on upgrade
// would shorten every user's window from forever to its default without a word. Dead rows
// are evidence an operator may still need. Turn it on with the window you want, or with
// [DefaultRetention] (24 hours of delivered rows, 7 days of dead ones): without retention,
// or a purge of your own ([Store.Purge], `outbox purge`), the table grows with every event.
//
// The purge covers the whole table, every namespace, whatever the publisher's scope: give
// every publisher of a table the same Retention, or enable it on one. Several publishers
// purging at once is safe: each batch skips the rows another is deleting (SQLite's
// writers take turns), so no row is deleted twice and no purger waits for another.
type Retention struct {
	// Delivered deletes delivered rows settled longer ago than this; zero keeps them.
	Delivered time.Duration
	// Dead deletes dead rows that died longer ago than this; zero keeps them.
	Dead time.Duration
	// Interval is the pause between purges, varied by up to a quarter either way so that
	// publishers started together do not purge together. The first purge comes one
	// interval after start. Default [DefaultRetentionInterval].
	Interval time.Duration
}

// DefaultRetention returns the retention River's cleaner defaults to: delivered rows for
// [DefaultRetentionDelivered], dead rows for [DefaultRetentionDead], purged every
// [DefaultRetentionInterval].
func DefaultRetention() Retention {
	return Retention{Delivered: DefaultRetentionDelivered, Dead: DefaultRetentionDead, Interval: DefaultRetentionInterval}
}

func (r Retention) enabled() bool { return r.Delivered > 0 || r.Dead > 0 }

// withDefaults returns r with the default interval when it has none.
func (r Retention) withDefaults() Retention {
	r.Interval = cmp.Or(r.Interval, DefaultRetentionInterval)
	return r
}

// validate checks settings whose defaults are applied (withDefaults).
func (r Retention) validate() error {
	switch {
	case r.Delivered < 0:
		return invalid("Retention.Delivered", "must not be negative, got %s", r.Delivered)
	case r.Dead < 0:
		return invalid("Retention.Dead", "must not be negative, got %s", r.Dead)
	case r.Interval < 0:
		return invalid("Retention.Interval", "must not be negative, got %s", r.Interval)
	}
	return nil
}

// check refuses retention on a store whose dialect cannot purge.
func (r Retention) check(s *Store) error {
	if !r.enabled() {
		return nil
	}
	if _, err := s.retention(); err != nil {
		return invalid("Retention", "is set, but %v", err)
	}
	return nil
}

// retentionLoop purges every Retention.Interval until Run's context ends.
func (r *run) retentionLoop() {
	ret := r.p.opts.Retention
	if !ret.enabled() {
		return
	}
	for {
		jitter := time.Duration(rand.Int64N(int64(ret.Interval)/2+1)) - ret.Interval/4
		if !sleep(r.ctx, ret.Interval+jitter) {
			return
		}
		r.purge(ret)
	}
}

// retentionShare is the most of its time the retention loop spends purging: after each
// batch it pauses retentionShare-1 times as long as the batch took. A backlog of old rows
// (retention just turned on) then costs the burn-down about that share of the database
// at worst: at half, a SQLite burn-down ran at 0.45 of its rate, since every batch holds
// the one write lock, at a tenth 0.88, at a twentieth 0.95 (BENCHMARKS.md, purge during
// burn-down).
const retentionShare = 20

// purge deletes what the retention allows, one batch at a time, pausing after each batch
// so that it takes at most 1/retentionShare of one connection's time. That still purges
// thousands of rows a second; a table that needs more runs [Store.Purge], which does not
// pause, from a job of its own.
func (r *run) purge(ret Retention) {
	p := r.p
	var res PurgeResult
	for _, kind := range res.kinds(ret.Delivered, ret.Dead) {
		for r.ctx.Err() == nil {
			start := time.Now()
			n, err := p.store.purgeBatch(r.ctx, kind.status, kind.older, DefaultPurgeBatch)
			if err != nil {
				if r.ctx.Err() == nil {
					p.errs.Add(1)
					p.log.Log(r.ctx, dbErrorLevel(err), "outbox publisher: retention purge failed", "err", err, "retry_in", ret.Interval)
				}
				return
			}
			*kind.count += n
			if n < DefaultPurgeBatch {
				break
			}
			sleep(r.ctx, (retentionShare-1)*time.Since(start))
		}
	}
	if res.Delivered > 0 || res.Dead > 0 {
		p.log.Info("outbox publisher: purged old rows", "delivered", res.Delivered, "dead", res.Dead)
	}
}
