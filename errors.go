package outbox

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
)

// Sentinel errors. Match them with [errors.Is]; the typed errors below wrap them.
var (
	// ErrInvalid marks bad input: a message, an option or a table name the library refuses.
	// Nothing was written. Every [*ValidationError] matches it.
	ErrInvalid = errors.New("outbox: invalid input")

	// ErrTenantMismatch marks a message whose dedupe key does not begin with its tenant id in
	// canonical lowercase form followed by "/". It also matches [ErrInvalid].
	ErrTenantMismatch = errors.New("outbox: dedupe key does not belong to tenant")

	// ErrLeaseLost means a row is no longer held by the claim that tried to ack, nack or
	// extend it: its lease expired and another worker reclaimed it, or it was settled
	// already. The row was not changed. A publisher logs this and does not nack.
	ErrLeaseLost = errors.New("outbox: lease lost")

	// ErrNotFound means no row has the requested id ([Store.Get]) or dedupe key
	// ([Store.GetByDedupeKey]).
	ErrNotFound = dialect.ErrNotFound

	// ErrIntegrity marks a row that is no longer as it was enqueued: its payload does not
	// match the SHA-256 taken at enqueue, or its headers do not decode. The row was changed
	// behind the library's back. [Record.Integrity] reports it; a [Publisher] dead-letters
	// such a row at once and never hands it to the [Transport], and [DeadLetter.Err]
	// matches it.
	ErrIntegrity = dialect.ErrIntegrity

	// ErrRetryTransaction marks an error after which the caller's whole business
	// transaction must be rolled back and run again from its start: the database rolled it
	// back to resolve a conflict with another transaction (MySQL and MariaDB error 1213: a
	// deadlock, or on a Galera cluster a certification conflict between nodes).
	// [Store.Enqueue] and [Store.EnqueueBatch] wrap it when the database answers so; the
	// same conflict can also surface at the caller's own Commit, where the driver's error is
	// returned as it is (with go-sql-driver/mysql, a *mysql.MySQLError whose Number is 1213).
	// docs/deployment.md says what to do on a cluster.
	ErrRetryTransaction = dialect.ErrRetryTransaction
)

// ValidationError describes one refused input. It matches [ErrInvalid], and
// [ErrTenantMismatch] when that is the reason.
type ValidationError struct {
	// Index is the position of the message in a batch, or -1 outside a batch.
	Index int
	// Field names what was wrong ("topic", "payload", "table", "BatchSize", ...).
	Field string
	// Reason says why, for people.
	Reason string
	kind   error
}

func (e *ValidationError) Error() string {
	var b strings.Builder
	b.WriteString("outbox: invalid ")
	b.WriteString(e.Field)
	if e.Index >= 0 {
		fmt.Fprintf(&b, " (message %d)", e.Index)
	}
	b.WriteString(": ")
	b.WriteString(e.Reason)
	return b.String()
}

// Is reports whether target is [ErrInvalid] or the error's specific kind.
func (e *ValidationError) Is(target error) bool {
	return target == ErrInvalid || (e.kind != nil && target == e.kind)
}

func invalid(field, format string, args ...any) *ValidationError {
	return &ValidationError{Index: -1, Field: field, Reason: fmt.Sprintf(format, args...)}
}

// LeaseLostError lists the rows whose lease was lost during an ack, nack or extend. The
// other rows of the same call were applied. It matches [ErrLeaseLost].
type LeaseLostError struct {
	IDs []uuid.UUID
}

func (e *LeaseLostError) Error() string {
	return fmt.Sprintf("outbox: lease lost on %d row(s), first %s", len(e.IDs), e.IDs[0])
}

// Is reports whether target is [ErrLeaseLost].
func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }

// Permanent marks a publish error as not worth retrying: the row goes to dead at once.
func Permanent(err error) error {
	if err == nil {
		err = errors.New("permanent failure")
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// IsPermanent reports whether err, or an error it wraps, was marked with [Permanent].
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// Unavailable marks a publish error as an outage of the destination: the broker or endpoint
// could not be reached (connection refused, reset or closed, a dial or I/O timeout, a
// cluster without a leader). The message itself is not at fault. A [Publisher] spends no
// attempt on it: the message goes back to pending with its attempt count unchanged and is
// never dead-lettered for it, however long the outage lasts, and a batch that comes back
// all Unavailable opens the publisher's circuit breaker. A destination that answers is not
// down, though: a message that fails Unavailable while other messages of its batch are
// delivered (an endpoint that refuses that one event with 503) keeps its attempt there, and
// spends one on every such failure when retried alone while the circuit stays closed. Transports
// classify their clients' outage errors with it; a [Transport] of your own may too.
func Unavailable(err error) error {
	if err == nil {
		err = errors.New("destination unavailable")
	}
	return &unavailableError{err}
}

type unavailableError struct{ err error }

func (e *unavailableError) Error() string { return "unavailable: " + e.err.Error() }
func (e *unavailableError) Unwrap() error { return e.err }

// IsUnavailable reports whether err, or an error it wraps, was marked with [Unavailable].
func IsUnavailable(err error) bool {
	var u *unavailableError
	return errors.As(err, &u)
}

// RetryAfter marks a publish error with the delay after which to try again (a broker's
// back-pressure hint, an HTTP Retry-After). The delay replaces the backoff of the retry
// policy for that attempt; the attempt limit still applies. A negative d counts as zero.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		err = errors.New("retry requested")
	}
	return &retryAfterError{err: err, after: max(d, 0)}
}

type retryAfterError struct {
	err   error
	after time.Duration
}

func (e *retryAfterError) Error() string {
	return fmt.Sprintf("%v (retry after %s)", e.err, e.after)
}
func (e *retryAfterError) Unwrap() error { return e.err }

// RetryAfterDelay returns the delay attached by [RetryAfter], if any.
func RetryAfterDelay(err error) (time.Duration, bool) {
	var r *retryAfterError
	if errors.As(err, &r) {
		return r.after, true
	}
	return 0, false
}
