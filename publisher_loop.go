package outbox

import (
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
)

// loop is one claim loop of a run. It claims a batch, publishes it, and settles its
// outcomes, over and over. It pipelines: the outcomes of a full batch are settled with the
// next claim, in one transaction where the dialect can ([settler]), so a backlog drains at
// one commit per batch; and while a full batch is in the transport the loop claims the next
// one, so the database's work overlaps the broker's. Before
// each claim it asks its [admission] (the circuit breaker, a relay's slots).
type loop struct {
	r       *run
	o       ClaimOptions
	adm     admission
	settler *settler
	pace    pacer
	// retries is when the rows this loop put back for a retry fall due: the idle pause ends
	// then, and the claim is due work for the admission.
	retries retryDue
	// claimAhead is false for an ordered publisher: a batch claimed while the one before
	// is in the transport holds its keys too, so a publisher would hold the heads of twice
	// as many keys, which the other publishers' claims then walk past (eight of them on one
	// SQLite file, claiming ahead, delivered too slowly under the race detector). It still
	// settles a full batch's outcomes with its next claim.
	claimAhead bool
	// turn counts the loop's claims, for continueTurns.
	turn int
}

// continueTurns: a loop that claims runs continues the keys its last batch delivered
// (ClaimOptions.Continue) on every claim but each continueTurns-th, which looks for heads
// first, so that a key no loop is continuing waits at most that many of a busy loop's
// batches.
const continueTurns = 4

// batch is a claimed batch, to publish.
type batch struct {
	recs []Record
	// lost marks the rows whose lease was lost before the publish began (the batch was
	// claimed while the one before it was published).
	lost   map[uuid.UUID]bool
	ticket ticket
}

func (r *run) claimLoop(w waker) {
	p := r.p
	adm := r.admission(w)
	_, withClaim := p.store.dialect.(dialect.SettleClaimer)
	l := &loop{
		r: r,
		o: ClaimOptions{Scope: p.opts.Scope, Limit: p.opts.BatchSize, Lease: p.opts.Lease, MaxAttempts: p.opts.Retry.MaxAttempts,
			WorkerID: p.opts.WorkerID, Ordered: p.opts.Ordered, OrderedSkipDead: p.opts.OrderedSkipDead, Runs: p.runs, RunShare: p.runShare()},
		adm:        adm,
		settler:    &settler{r: r, adm: adm, withClaim: withClaim},
		pace:       pacer{r: r, w: w, idleDelay: p.opts.PollInterval, errDelay: p.opts.PollInterval, chase: len(chaseDelays)},
		claimAhead: !p.opts.Ordered,
	}
	defer func() {
		l.settler.settle() // stopped with a batch published: settle it alone
		l.adm.close()
	}()
	var next batch // claimed ahead
	for {
		b := next
		if b.recs == nil {
			var ok bool
			if b, ok = l.claim(); !ok {
				return
			}
		}
		var ok bool
		if next, ok = l.publish(b); !ok {
			return // the shutdown deadline passed: the batches' rows keep their lease
		}
	}
}

// claim waits to be admitted and claims, until a claim brings rows. It returns false once
// Run's context ended, or when a claim failed because the work context ended. The claim
// runs on the work context, so that a shutdown cannot cut it off after the database leased
// rows but before the loop learned which; the rows it returns are published like any
// in-flight batch.
func (l *loop) claim() (batch, bool) {
	r := l.r
	for r.ctx.Err() == nil {
		t, ok := l.adm.admit(l.settler, l.pace.chasing() || l.retries.due())
		if !ok {
			continue
		}
		if t.woken {
			l.pace.woken()
		}
		o := l.o
		if o.Runs {
			l.turn++
			o.Continue = l.turn%continueTurns != 0
		}
		if t.probe {
			o.Limit = probeSize
		}
		began := time.Now()
		lost := map[uuid.UUID]bool{}
		recs, err := l.claimNow(o, lost)
		l.adm.claimed(t, len(recs), err)
		if err == nil {
			l.retries.claimed(began)
		}
		if err != nil {
			if r.work.Err() != nil {
				return batch{}, false
			}
			l.pace.failed(err)
			continue
		}
		l.pace.answered()
		switch {
		case len(recs) > 0:
			l.pace.busy()
			r.p.claimed.Add(int64(len(recs)))
			return batch{recs: recs, lost: lost, ticket: t}, true
		case !t.probe: // after an empty probe the circuit waits for the next one
			l.pace.idle(&l.retries)
		}
	}
	return batch{}, false
}

// publish publishes b and settles its outcomes, or carries them into the next claim. While
// b is in the transport it claims the next batch, which it returns, when that pays, or
// else keeps the batch it carries to settle with b's outcomes. It returns false when the
// shutdown deadline passed first.
func (l *loop) publish(b batch) (ahead batch, ok bool) {
	r, p := l.r, l.r.p
	full := len(b.recs) == p.opts.BatchSize
	published := make(chan *outcomes, 1)
	go func() { published <- r.publishBatch(b.recs, b.lost) }()

	ahead.lost = map[uuid.UUID]bool{}
	var aheadErr error
	if full && l.claimAhead && r.ctx.Err() == nil && l.adm.ahead(l.settler) {
		ahead.recs, aheadErr = l.claimNow(l.o, ahead.lost) // more is likely waiting
		l.adm.claimed(ticket{}, len(ahead.recs), aheadErr)
	} else {
		l.settler.keep(len(b.recs))
	}
	out := r.awaitPublish(published, ahead.recs, ahead.lost, l.settler.carried)
	if out == nil {
		return batch{}, false
	}
	l.retries.note(out)
	l.adm.published(out, b.ticket)
	l.settler.add(out)
	if len(ahead.recs) > 0 {
		p.claimed.Add(int64(len(ahead.recs)))
	} else {
		ahead.recs = nil
	}
	switch {
	case !full && !l.freed(out):
		l.settler.settle()
		l.pace.partial()
	case aheadErr != nil && r.work.Err() == nil:
		l.pace.failed(aheadErr) // the outcomes are settled with the next claim
	case !l.settler.withClaim && ahead.recs == nil:
		l.settler.settle() // nothing to settle them with
	}
	return ahead, true
}

// freed reports whether settling out makes rows claimable at once, so that the loop claims
// again without a pause (settling out with that claim): an ordered batch that delivered or
// buried a key's head frees the key's next row, and a retry without a delay is due now. A
// partial batch that freed nothing means the table had no more for this loop.
func (l *loop) freed(out *outcomes) bool {
	for i := range out.items {
		o := &out.items[i].out
		if out.lost[o.ID] || out.items[i].released { // a released row follows its key's failed one
			continue
		}
		switch {
		case o.Status == StatusPending && o.Delay <= 0:
			return true
		case l.o.Ordered && o.Status != StatusPending:
			return true
		}
	}
	return false
}

// claimNow claims with o, settling the batch the loop carries. A row's lease starts when
// the database runs the claim, so a claim that answered a third of the lease or more after
// the call (its commit waited on a synchronous standby, the disk or a lock; a wait for a
// pooled connection counts too) may bring rows whose lease ran out and that another worker
// claimed since: they are confirmed before they are published (confirmLate).
func (l *loop) claimNow(o ClaimOptions, lost map[uuid.UUID]bool) ([]Record, error) {
	began := time.Now()
	recs, err := l.settler.claim(o)
	if len(recs) > 0 && time.Since(began) >= l.r.p.opts.Lease/3 {
		l.r.confirmLate(recs, lost)
	}
	return recs, err
}

// pacer is a claim loop's pauses: the idle pause, which doubles while claims come back
// empty; the backoff after failed claims; and the chase of a wake-up (chaseDelays).
type pacer struct {
	r         *run
	w         waker
	idleDelay time.Duration // the next idle pause
	errDelay  time.Duration // the next pause after a failed claim
	chase     int           // position in chaseDelays; at the end when not chasing
}

func (c *pacer) chasing() bool { return c.chase < len(chaseDelays) }

// pause waits up to d, less while chasing a wake-up; a wake-up ends it early and starts a
// chase.
func (c *pacer) pause(d time.Duration) {
	if c.chasing() {
		d = min(d, chaseDelays[c.chase])
		c.chase++
	}
	if c.w.wait(c.r.ctx, d) {
		c.woken()
	}
}

// followPoll is the pause after a partial batch while nothing wakes the loop for rows that
// other processes commit: see partial.
const followPoll = 10 * time.Millisecond

// partial pauses after a partial batch. While a listener brings wake-ups from other
// processes, that is PollInterval, a safety net. Otherwise polling is how their rows are
// found, and a batch that found rows says more are on their way: the loop polls again after
// followPoll (or PollInterval, when shorter), and while claims then come back empty after
// pauses that double from there up to the idle cap. So a steady stream from another process
// is claimed within about followPoll, as by a loop that polls that often, at one claim per
// batch that brings rows; an idle loop polls as before. Under a producer at half the drain
// rate on MariaDB and SQLite, the pause of PollInterval after every partial batch was the
// whole of a p50 of 100-250 ms, where a 10 ms polling loop held 8-13 ms.
func (c *pacer) partial() {
	o := c.r.p.opts
	if c.r.hub.listening.Load() {
		c.pause(o.PollInterval)
		return
	}
	d := min(o.PollInterval, followPoll)
	c.idleDelay = min(2*d, c.r.idleCap())
	c.pause(d)
}

// woken starts a chase, and the idle pause over.
func (c *pacer) woken() { c.chase, c.idleDelay = 0, c.r.p.opts.PollInterval }

// idle pauses after an empty claim, until retries fall due at the latest, and doubles the
// next idle pause up to idleCap.
func (c *pacer) idle(retries *retryDue) {
	d := c.idleDelay
	c.idleDelay = min(d*2, c.r.idleCap())
	c.pause(retries.pause(d))
}

// busy starts the idle pause over: a claim brought rows.
func (c *pacer) busy() { c.idleDelay = c.r.p.opts.PollInterval }

// answered starts the error backoff over: a claim succeeded.
func (c *pacer) answered() { c.errDelay = c.r.p.opts.PollInterval }

// failed counts and logs a failed claim, waits the error backoff, and doubles it up to
// the cap (PublisherOptions.backoffMax).
func (c *pacer) failed(err error) {
	p := c.r.p
	p.errs.Add(1)
	p.log.Log(c.r.ctx, dbErrorLevel(err), msgClaimFailed, "err", err, "retry_in", c.errDelay)
	sleep(c.r.ctx, c.errDelay)
	c.errDelay = min(c.errDelay*2, p.opts.backoffMax())
}

// retryDue remembers when the rows that a claim loop put back for a retry fall due, so
// that the loop claims them then: its idle pause ends at that time, and in a Relay the
// claim is due work, not an idle probe that waits for the relay's probe pace (with many
// stores, a turn of the pace can be seconds away). Only the earliest and the latest
// times are kept: a claim at the earliest takes every row due by then, and one more
// claim at the latest finds the rest; rows due in between wait at most until then.
type retryDue struct {
	first, last time.Time
}

// note records the retries among the outcomes of a batch just published.
func (d *retryDue) note(out *outcomes) {
	now := time.Now()
	for i := range out.items {
		o := &out.items[i].out
		if o.Status != StatusPending || out.lost[o.ID] || out.items[i].released {
			continue
		}
		at := now.Add(o.Delay)
		if d.first.IsZero() || at.Before(d.first) {
			d.first = at
		}
		if at.After(d.last) {
			d.last = at
		}
	}
}

// due reports whether retries are due now.
func (d *retryDue) due() bool { return !d.first.IsZero() && !time.Now().Before(d.first) }

// pause shortens an idle pause to end when the next retries fall due.
func (d *retryDue) pause(p time.Duration) time.Duration {
	if d.first.IsZero() {
		return p
	}
	return max(0, min(p, time.Until(d.first)))
}

// claimed records a claim that began at began: it took every retry due by then.
func (d *retryDue) claimed(began time.Time) {
	switch {
	case d.first.IsZero() || began.Before(d.first):
	case began.Before(d.last):
		d.first = d.last
	default:
		d.first, d.last = time.Time{}, time.Time{}
	}
}
