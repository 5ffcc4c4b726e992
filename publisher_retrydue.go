package outbox

import "time"

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
		if o.Status != StatusPending || out.lost[o.ID] {
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
