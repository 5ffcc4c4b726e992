package outbox

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"time"
)

// RetryPolicy decides what happens to a failed delivery: retry after
//
//	delay = min(BaseDelay * 2^(attempts-1), MaxDelay)
//	next_attempt_at = now + uniform(delay/2, delay)   // equal jitter, clamped before jitter
//
// or dead-letter when the attempt limit is reached or the error is [Permanent]. An error
// marked [Unavailable] (the destination could not be reached) is never dead-lettered: the
// row is retried after the same delay and its attempt is given back.
type RetryPolicy struct {
	// BaseDelay is the first retry's delay before jitter. Default 1s.
	BaseDelay time.Duration
	// MaxDelay caps the delay before jitter. Default 5m.
	MaxDelay time.Duration
	// MaxAttempts is the total number of delivery attempts, the first included. Default 10.
	MaxAttempts int
}

// DefaultRetryPolicy returns the defaults used when a field is zero.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{BaseDelay: time.Second, MaxDelay: 5 * time.Minute, MaxAttempts: 10}
}

// withDefaults returns p with its zero fields set to those of [DefaultRetryPolicy].
func (p RetryPolicy) withDefaults() RetryPolicy {
	d := DefaultRetryPolicy()
	p.BaseDelay = cmp.Or(p.BaseDelay, d.BaseDelay)
	p.MaxDelay = cmp.Or(p.MaxDelay, d.MaxDelay)
	p.MaxAttempts = cmp.Or(p.MaxAttempts, d.MaxAttempts)
	return p
}

// validate checks a policy whose defaults are applied (withDefaults).
func (p RetryPolicy) validate() error {
	switch {
	case p.BaseDelay < 0:
		return invalid("BaseDelay", "must not be negative, got %s", p.BaseDelay)
	case p.MaxDelay < p.BaseDelay:
		return invalid("MaxDelay", "must be at least BaseDelay (%s), got %s", p.BaseDelay, p.MaxDelay)
	case p.MaxAttempts < 1:
		return invalid("MaxAttempts", "must be at least 1, got %d", p.MaxAttempts)
	}
	return nil
}

// Backoff returns the delay before jitter after the given attempt (1 for the first).
func (p RetryPolicy) Backoff(attempts int) time.Duration {
	d := max(p.BaseDelay, 0)
	for i := 1; i < attempts && d < p.MaxDelay; i++ {
		if d > p.MaxDelay/2 { // doubling would pass MaxDelay (or overflow): clamp
			return p.MaxDelay
		}
		d *= 2
	}
	return max(min(d, p.MaxDelay), 0)
}

// Jittered returns a delay drawn uniformly from [Backoff(attempts)/2, Backoff(attempts)].
func (p RetryPolicy) Jittered(attempts int) time.Duration {
	d := p.Backoff(attempts)
	half := d / 2
	if d-half <= 0 {
		return d
	}
	return half + rand.N(d-half+1)
}

// Outcome turns a failure into the row's next state under p.
//
// A [Permanent] error dead-letters the row. An [Unavailable] one (and not permanent: a
// message marked both is at fault itself) returns it to pending with
// [Outcome.RefundAttempt], whatever f.Attempts, so an outage never dead-letters a message
// and leaves its attempt count as it was before the claim; the delay is the one this
// attempt would have had (or the [RetryAfter] hint), so a message's own backoff neither
// grows nor resets during an outage. Any other error is retried until f.Attempts reaches
// MaxAttempts, and then dead-lettered.
func (p RetryPolicy) Outcome(f Failure) Outcome {
	msg := "unknown error"
	if f.Err != nil {
		msg = f.Err.Error()
	}
	o := Outcome{Lease: f.Lease, Error: msg}
	switch {
	case IsPermanent(f.Err):
		o.Status = StatusDead
	case IsUnavailable(f.Err):
		o.Status, o.RefundAttempt = StatusPending, true
		o.Delay = p.retryDelay(f)
	case f.Attempts >= p.MaxAttempts:
		o.Status = StatusDead
		o.Error = fmt.Sprintf("attempt limit reached (%d of %d): %s", f.Attempts, p.MaxAttempts, msg)
	default:
		o.Status = StatusPending
		o.Delay = p.retryDelay(f)
	}
	return o
}

// retryDelay is the [RetryAfter] hint of f's error, or the jittered backoff of its attempt.
func (p RetryPolicy) retryDelay(f Failure) time.Duration {
	if d, ok := RetryAfterDelay(f.Err); ok {
		return d
	}
	return p.Jittered(f.Attempts)
}
