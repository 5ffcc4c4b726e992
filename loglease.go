package outbox

import (
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// This file holds the Store's side of delivery from the database's log
// ([Options.LogLease]): which rows the log's reader owns, and how it proves it.

// LogWorkerID is the worker id (locked_by) of the rows a Store with [Options.LogLease]
// inserts leased to the log's reader.
const LogWorkerID = "outbox-log"

// MinLogLease is the shortest [Options.LogLease]: a shorter lease would let polling take
// rows that the log's reader is about to deliver, delivering them twice.
const MinLogLease = time.Second

// logLeaseSpace is the name space of [LogLeaseToken]'s name-based UUIDs.
var logLeaseSpace = uuid.MustParse("0b2f6a0e-8a4c-5a3e-9d57-4c1a1f3c6b21")

// LogLeaseToken is the lease token of a row inserted leased to the log's reader: a
// name-based UUID of its id, so that a reader that sees the row's id in the log can settle
// it with [Store.Complete] under that lease. A claim that took the row over after its lease
// expired gave it a random token, so the reader's outcome is then refused as a lost lease,
// never applied twice.
func LogLeaseToken(id uuid.UUID) uuid.UUID { return uuid.NewSHA1(logLeaseSpace, id[:]) }

// LogLeaseOf returns the lease under which a row with id was inserted for the log's reader.
func LogLeaseOf(id uuid.UUID) Lease { return Lease{ID: id, Token: LogLeaseToken(id)} }

// insertLease is the lease a Store with Options.LogLease inserts the row with id under.
func (s *Store) insertLease(id uuid.UUID) dialect.InsertLease {
	return dialect.InsertLease{WorkerID: LogWorkerID, Token: LogLeaseToken(id), Duration: s.logLease}
}

// checkLogLease validates Options.LogLease for dialect d.
func checkLogLease(d Dialect, lease time.Duration) error {
	switch {
	case lease == 0:
		return nil
	case lease < MinLogLease:
		return invalid("LogLease", "must be 0 (off) or at least %s, got %s", MinLogLease, lease)
	}
	if li, ok := d.(sqlkit.LeasedInserter); !ok || !li.InsertsLeased() {
		e := invalid("LogLease", "the %s dialect cannot insert rows leased to a log reader; leave LogLease 0", d.Name())
		e.kind = errors.ErrUnsupported
		return e
	}
	return nil
}
