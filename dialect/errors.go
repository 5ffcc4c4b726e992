package dialect

import (
	"errors"
	"strings"
)

// The sentinel errors a dialect returns or wraps. Package outbox re-exports them under the
// same names, so that its users match them with [errors.Is] without importing this package.
var (
	// ErrNotFound means no row has the requested id (or dedupe key). [Dialect.Get] and
	// [Admin.GetByDedupeKey] return it, unwrapped or wrapped.
	ErrNotFound = errors.New("outbox: not found")

	// ErrIntegrity marks a row that is no longer as it was enqueued: its payload does not
	// match the SHA-256 taken at enqueue, or its headers do not decode. The row was changed
	// behind the library's back. [Record.Integrity] reports it; the engine's Publisher
	// dead-letters such a row at once and never hands it to a transport.
	ErrIntegrity = errors.New("outbox: integrity check failed")

	// ErrMisconfigured marks a database that answers but is not set up for the outbox as the
	// store is configured: the table is missing or incomplete, the dialect does not match
	// the server, or SQLite is opened without the settings concurrent writers need. Retrying
	// does not help; the [*CheckError] that matches it says what to change.
	ErrMisconfigured = errors.New("outbox: misconfigured")

	// ErrRetryTransaction marks a database error after which the whole transaction must run
	// again from its start: the server rolled it back to resolve a conflict with another
	// transaction (a deadlock, or a certification conflict between the nodes of a cluster
	// such as Galera). On a transaction the library runs itself, the dialect has retried
	// already and the retries ran out; on a caller's transaction nothing was retried.
	ErrRetryTransaction = errors.New("outbox: transaction rolled back by a conflict; run it again")
)

// CheckError is a setup problem found by a check ([Checker.Check],
// [OrderedClaimer.CheckOrdered], the engine's Store.Check), or met by an operation (a
// missing table), with what to do about it. It matches [ErrMisconfigured].
type CheckError struct {
	// Problem says what is wrong.
	Problem string
	// Fix says what to do.
	Fix string
	// Err is the database error behind the problem, if there was one.
	Err error
}

func (e *CheckError) Error() string {
	sep := ": "
	if strings.HasPrefix(e.Fix, "\n") {
		sep = ":" // a fix of several lines begins on a line of its own
	}
	msg := "outbox: " + e.Problem + sep + e.Fix
	if e.Err != nil {
		msg += " (" + e.Err.Error() + ")"
	}
	return msg
}

// Unwrap returns the database error behind the problem.
func (e *CheckError) Unwrap() error { return e.Err }

// Is reports whether target is [ErrMisconfigured].
func (e *CheckError) Is(target error) bool { return target == ErrMisconfigured }
