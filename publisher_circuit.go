package outbox

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// circuitAdmission is the circuit breaker (circuit.go) as a claim loop's admission: while
// the destination is down it admits nothing but the probe, and it hears of every
// published batch.
type circuitAdmission struct{ r *run }

// probeSize is the number of messages a probe claims. One: the probe asks whether the
// destination answers, and one message answers that as well as a hundred, while it costs
// the database the least (one row leased, one settled) and, if the destination accepted
// it but the reply was lost, at most one duplicate.
const probeSize = 1

// admit lets the loop claim while the circuit is closed, and claim the probe when the
// circuit is open and the probe is due. Otherwise it settles the batch s carries and waits
// until the next probe is due, the circuit changes, or Run's context ends. Wake-ups are not
// listened to here, so that no enqueue, NOTIFY or [Publisher.Wake] makes the loop claim
// while the destination is down; one that arrives meanwhile stays pending in the loop's
// waker.
func (a circuitAdmission) admit(s *settler, _ bool) (ticket, bool) {
	pm := a.r.circ.allow()
	if pm.claim {
		return ticket{probe: pm.probe}, true
	}
	s.settle()
	t := time.NewTimer(pm.wait)
	defer t.Stop()
	select {
	case <-a.r.ctx.Done():
	case <-pm.changed:
	case <-t.C:
	}
	return ticket{}, false
}

// ahead lets a loop claim ahead only while the circuit is closed.
func (a circuitAdmission) ahead(*settler) bool { return a.r.circ.closed() }

// claimed ends a probe whose claim failed or found nothing: the destination was not asked.
func (a circuitAdmission) claimed(t ticket, n int, err error) {
	if t.probe && (err != nil || n == 0) {
		a.r.circ.probeVoid()
	}
}

// published reports a published batch to the circuit, and the transition it caused.
// A batch that published nothing (every row lost its lease or failed its hash check) says
// nothing about the destination.
func (a circuitAdmission) published(b *outcomes, t ticket) {
	r := a.r
	if b.published == 0 {
		if t.probe {
			r.circ.probeVoid()
		}
		return
	}
	tr := r.circ.afterBatch(b.unavailable == b.published, t.probe, b.began)
	switch {
	case tr.opened:
		r.p.circuitOpens.Add(1)
		r.circuitChanged(true, tr, b.unavailableErr)
	case tr.closed:
		r.circuitChanged(false, tr, nil)
	}
}

func (circuitAdmission) released() {}
func (circuitAdmission) close()    {}

// circuitChanged is called once each time the circuit opens (open true: a batch came back
// all Unavailable, cause being its first error) or closes again (a batch got through). It
// logs one Warn when it opens and one Info when it closes, never a line per batch or probe.
// This is the one place that hears of the circuit's changes of state: hooks that observe
// them belong here.
func (r *run) circuitChanged(open bool, t transition, cause error) {
	p := r.p
	r.observeCircuit(open)
	if open {
		r.refused.clear()
		p.log.Warn("outbox publisher: destination unavailable; circuit open, claiming stopped until a probe gets through"+
			" (messages keep their attempts)",
			"err", cause, "probe_in", t.probeIn.Round(time.Millisecond),
			"probe_min", p.opts.Circuit.ProbeMin, "probe_max", p.opts.Circuit.ProbeMax)
		return
	}
	p.log.Info("outbox publisher: destination reachable again; circuit closed, claiming resumed",
		"open_for", t.openFor.Round(time.Millisecond))
}

// logUnavailable logs the messages of a settled batch that failed Unavailable and got
// their attempt back. A batch that failed whole is the circuit's business, which logs once
// when it opens, so it is logged at Debug; a batch where only some failed so (one Kafka
// partition without a leader, say) is logged at Warn like any failed delivery, as is every
// one when the circuit is disabled.
func (r *run) logUnavailable(b *outcomes, its []*settlement) {
	if len(its) == 0 {
		return
	}
	p := r.p
	ids := make([]uuid.UUID, len(its))
	for i, it := range its {
		ids[i] = it.out.ID
	}
	first := its[0]
	msg := "outbox publisher: destination unavailable; will retry without spending an attempt"
	attrs := []any{"count", len(its), "id", first.out.ID, "topic", first.rec.Topic, "retry_in", first.out.Delay,
		"err", first.cause, idsAttr(ids)}
	if r.circ != nil && !b.partly { // a destination partly down (a Kafka partition without a leader) is logged like any failure
		p.log.Debug(msg, attrs...)
		return
	}
	p.log.Warn(msg, attrs...)
}

// chargeUnavailable makes a message that failed [Unavailable] spend its attempt when its
// destination is known to answer and has refused it before: the message failed so in an
// earlier batch whose other messages were delivered (r.refused remembers it), and now fails
// so again, with the circuit closed, in a batch that delivered nothing and whose every
// unavailable message is such a one (retried alone, say). Beside delivered messages a
// refusal is only noted, never charged: an outage that begins or ends in the middle of a
// batch looks just like it. What refuses it then is not an outage but
// something about the message (an endpoint that refuses one event with 503 for good, say);
// were its attempts given back, it would be retried forever at no cost, and, retried alone,
// would open the circuit for everything else. It is judged by the retry policy like any
// failure instead, and dead-lettered at the attempt limit. Opening the circuit forgets every
// remembered message. Only the messages still given back
// count as unavailable for the circuit, so a batch of refused messages alone does not open
// it. Any other batch whose every message failed Unavailable keeps its attempts: that is the
// outage the circuit breaker handles. So does a failure whose cause says the destination did
// not answer at all ([IsUnreachable]: a refused dial, a cut connection): only a destination
// that answers can refuse a message, and a broker that flaps cuts batches in the middle.
func (r *run) chargeUnavailable(b *outcomes) {
	if b.unavailable == 0 && r.refused.n.Load() == 0 {
		return
	}
	delivered := slices.ContainsFunc(b.items, func(it settlement) bool { return it.out.Status == StatusDelivered })
	if !delivered && (b.unavailable == 0 || !r.circ.closed() || slices.ContainsFunc(b.items, func(it settlement) bool {
		return it.out.RefundAttempt && !it.released && (IsUnreachable(it.cause) || !r.refused.has(it.out.ID))
	})) {
		return
	}
	for i := range b.items {
		it := &b.items[i]
		switch {
		case it.released: // untried: nothing refused it
		case it.out.Status == StatusDelivered:
			r.refused.forget(it.out.ID)
		case !it.out.RefundAttempt, IsUnreachable(it.cause):
		case delivered:
			r.refused.add(it.out.ID) // refused while the destination answered: noted, not charged
		default:
			it.out = r.p.opts.Retry.outcome(Failure{Lease: it.out.Lease, Attempts: it.rec.Attempts, Err: it.cause}, false)
			b.unavailable--
			if it.out.Status == StatusDead {
				it.cause = fmt.Errorf("%w: %w", ErrAttemptLimit, it.cause)
				r.refused.forget(it.out.ID)
			}
		}
	}
}

// refusedSet holds the ids of messages that failed [Unavailable] while another message of
// their batch was delivered, so that their later unavailable failures spend attempts too.
// It is bounded: past refusedMax ids, new ones are not remembered (they spend an attempt
// only when they share a batch with a delivered message again). A restarted publisher
// starts empty. A message leaves it when it is delivered or dead-lettered by this publisher.
type refusedSet struct {
	n   atomic.Int64 // len(ids), read without the lock
	mu  sync.Mutex
	ids map[uuid.UUID]struct{}
}

const refusedMax = 4096

func (s *refusedSet) has(id uuid.UUID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.ids[id]
	return ok
}

func (s *refusedSet) add(id uuid.UUID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ids == nil {
		s.ids = map[uuid.UUID]struct{}{}
	}
	if len(s.ids) < refusedMax {
		s.ids[id] = struct{}{}
		s.n.Store(int64(len(s.ids)))
	}
}

func (s *refusedSet) clear() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids = nil
	s.n.Store(0)
}

func (s *refusedSet) forget(id uuid.UUID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.ids, id)
	s.n.Store(int64(len(s.ids)))
}
