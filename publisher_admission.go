package outbox

// admission is what a claim loop asks before it claims: may it claim now, and how much.
// The circuit breaker admits only its probe while the destination is down
// (circuitAdmission, publisher_circuit.go); a [Relay] admits its stores' claims by a budget
// of slots that they share (slotAdmission, relay_slots.go). A Publisher of its own has the
// circuit's, or noAdmission when the breaker is disabled; a relay's store has both, asked
// in that order (admissions).
//
// Each claim loop has an admission of its own, which may count what the loop holds. The
// loop calls admit before each claim and claimed after it; ahead before a claim made while
// a batch is in the transport, and claimed after that one too; published once a batch is
// published; close when it stops. Its [settler] calls released whenever a claimed batch is
// settled, or joins another batch to be settled with it.
type admission interface {
	// admit waits until the loop may claim, and says how in t. Before it makes the loop
	// wait, it settles the batch s carries, so that no published batch waits with the
	// loop. ok false means nothing was admitted: the loop asks again, unless Run's
	// context ended.
	admit(s *settler, chasing bool) (t ticket, ok bool)
	// ahead reports whether the loop may claim its next batch while this one is in the
	// transport. s carries the batch to settle with that claim, if any.
	ahead(s *settler) bool
	// claimed reports the outcome of a claim admitted with t (the zero ticket for a claim
	// ahead): n rows, or err.
	claimed(t ticket, n int, err error)
	// published reports the outcomes of a batch claimed with t, once published.
	published(b *outcomes, t ticket)
	// released reports that a claimed batch was settled (or left to its lease), or joined
	// a batch that holds an admission of its own.
	released()
	// close gives back what the loop holds; it has stopped.
	close()
}

// ticket is what admission granted a claim.
type ticket struct {
	probe bool // the claim is the circuit breaker's probe: it claims probeSize rows
	woken bool // a wake-up came while the loop waited to be admitted
}

// noAdmission admits every claim: a Publisher of its own whose circuit breaker is disabled.
type noAdmission struct{}

func (noAdmission) admit(*settler, bool) (ticket, bool) { return ticket{}, true }
func (noAdmission) ahead(*settler) bool                 { return true }
func (noAdmission) claimed(ticket, int, error)          {}
func (noAdmission) published(*outcomes, ticket)         {}
func (noAdmission) released()                           {}
func (noAdmission) close()                              {}

// admissions asks each of its admissions in turn: a claim needs all of them.
type admissions []admission

func (as admissions) admit(s *settler, chasing bool) (ticket, bool) {
	var t ticket
	for _, a := range as {
		u, ok := a.admit(s, chasing)
		if !ok {
			return ticket{}, false
		}
		t.probe, t.woken = t.probe || u.probe, t.woken || u.woken
	}
	return t, true
}

func (as admissions) ahead(s *settler) bool {
	for _, a := range as {
		if !a.ahead(s) {
			return false
		}
	}
	return true
}

func (as admissions) claimed(t ticket, n int, err error) {
	for _, a := range as {
		a.claimed(t, n, err)
	}
}

func (as admissions) published(b *outcomes, t ticket) {
	for _, a := range as {
		a.published(b, t)
	}
}

func (as admissions) released() {
	for _, a := range as {
		a.released()
	}
}

func (as admissions) close() {
	for _, a := range as {
		a.close()
	}
}

// admission returns the admission of one claim loop, woken by w.
func (r *run) admission(w waker) admission {
	var as admissions
	if r.circ != nil {
		as = append(as, circuitAdmission{r: r})
	}
	if r.p.slots != nil {
		as = append(as, &slotAdmission{ctx: r.ctx, slots: *r.p.slots, w: w})
	}
	switch len(as) {
	case 0:
		return noAdmission{}
	case 1:
		return as[0]
	}
	return as
}
