package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

// DefaultTable is the inbox table used when [Options.Table] is empty.
const DefaultTable = "outbox_inbox"

// Bounds of the inputs, in bytes of UTF-8. They fit every built-in schema.
const (
	// MaxGroupBytes bounds a consumer group name.
	MaxGroupBytes = 128
	// MaxMessageIDBytes bounds a message id.
	MaxMessageIDBytes = 255
	// DefaultPurgeBatch is the batch size [Inbox.Purge] uses when given zero.
	DefaultPurgeBatch = 1000
	// MaxPurgeBatch bounds the rows one purge statement deletes.
	MaxPurgeBatch = 10000
)

// Options configure an [Inbox]. The zero value is valid.
type Options struct {
	// Table is the inbox table: lowercase letters, digits and underscores, starting with a
	// letter or underscore, at most [dialect.MaxTableBytes] bytes. Default [DefaultTable].
	Table string
	// Isolation is the isolation level of the transactions [Inbox.Process] begins. Default
	// [sql.LevelDefault], the database's own: READ COMMITTED on PostgreSQL, REPEATABLE READ on
	// MySQL and MariaDB, SERIALIZABLE on SQLite. Every level keeps the handler from running
	// twice. On PostgreSQL at REPEATABLE READ or SERIALIZABLE, a claim that waited for a
	// concurrent delivery of the same message fails with a serialization error (SQLSTATE
	// 40001); Process then begins again, as it does after a deadlock, and reports the
	// duplicate.
	Isolation sql.IsolationLevel
	// Observer, when set, watches every [Inbox.Process] call, for telemetry. Default none.
	Observer Observer
}

// Inbox records which messages each consumer group has processed, on one database. It is
// safe for concurrent use.
type Inbox struct {
	db        *sql.DB
	d         statements
	table     dialect.Table
	isolation sql.IsolationLevel
	obs       Observer
}

// New returns an Inbox on db for the dialect named dialectName: "postgres", "mysql" (MySQL 8.0+
// and MariaDB 10.6+) or "sqlite", the names [outbox.Dialect.Name] returns for the built-in
// dialects. Another name returns an error matching [errors.ErrUnsupported]; bad options a
// [*outbox.ValidationError]. The table must exist: create it with [MigrateUp].
func New(db *sql.DB, dialectName string, opts Options) (*Inbox, error) {
	if db == nil {
		return nil, invalid("db", "is nil")
	}
	render, ok := dialects[dialectName]
	if !ok {
		return nil, fmt.Errorf("inbox: no inbox for dialect %q (want postgres, mysql or sqlite): %w", dialectName, errors.ErrUnsupported)
	}
	name := opts.Table
	if name == "" {
		name = DefaultTable
	}
	t, err := dialect.NewTable(name)
	if err != nil {
		return nil, invalid("table", "%s", err)
	}
	if opts.Isolation < sql.LevelDefault || opts.Isolation > sql.LevelLinearizable {
		return nil, invalid("Isolation", "unknown isolation level %d", int(opts.Isolation))
	}
	return &Inbox{db: db, d: render(t), table: t, isolation: opts.Isolation, obs: opts.Observer}, nil
}

// Table returns the inbox table.
func (in *Inbox) Table() dialect.Table { return in.table }

// Handler processes one message on tx, the transaction that records it in the inbox. It
// must do all its database work on tx and must not commit or roll it back. An error rolls
// back the handler's writes with the inbox record.
type Handler func(ctx context.Context, tx *sql.Tx) error

// Result reports what [Inbox.Process] or [Inbox.Claim] did with one delivery.
type Result struct {
	// Duplicate is true when the group had processed the message already (its record
	// committed): the handler did not run and nothing was written.
	Duplicate bool
}

// Process handles one delivery of the message messageID to the consumer group group, at
// most once per group while the inbox keeps the message's record:
//
//  1. It begins a transaction on the inbox's pool and claims (group, messageID) first, with
//     an insert that skips an existing key without an error. A concurrent delivery of the
//     same message waits there for the first one's transaction.
//  2. When the key was already recorded, it rolls back and returns Result{Duplicate: true}
//     and a nil error; h does not run.
//  3. Otherwise it runs h on the same transaction and commits the handler's writes and the
//     record together. An error from h (returned as it is) or a panic in h rolls both back,
//     so a redelivery processes the message again; a commit that fails commits neither, or,
//     when the connection drops during the commit, both or neither.
//
// When the claim itself loses a deadlock or a serialization conflict (on MySQL and MariaDB,
// deliveries that waited for one that rolled back race for the key again, and InnoDB may
// pick all but one of them as deadlock victims), Process begins again, up to five times:
// the handler had not run.
//
// A message whose handler ran and whose commit was lost (a crash, a dropped connection) left
// nothing behind and is processed once when it is redelivered. The broker should be
// acknowledged after Process returns a nil error, duplicate or not. Invalid input returns a
// [*outbox.ValidationError] and touches nothing.
//
// With an [Observer] ([Options.Observer]), attach the broker message's headers to ctx with
// [WithMessage], so that the observer can link its span to the producer's trace.
func (in *Inbox) Process(ctx context.Context, group, messageID string, h Handler) (res Result, err error) {
	if err := validateKey(group, messageID); err != nil {
		return Result{}, err
	}
	if h == nil {
		return Result{}, invalid("handler", "is nil")
	}
	if in.obs != nil {
		d := Delivery{Group: group, MessageID: messageID}
		d.Message, _ = MessageFrom(ctx)
		octx, ok := in.startProcess(ctx, d)
		if ok {
			ctx = octx
			defer func() { in.endProcess(octx, d, res, err) }()
		}
	}
	for attempt := 1; ; attempt++ {
		res, again, err := in.process(ctx, group, messageID, h)
		if !again || attempt == maxClaimAttempts || ctx.Err() != nil {
			return res, err
		}
	}
}

// maxClaimAttempts bounds how often Process begins again after its claim lost a deadlock or
// a serialization conflict.
const maxClaimAttempts = 5

// process is one attempt of Process. again reports that its claim, the first statement of
// its transaction, lost a deadlock or a serialization conflict before the handler ran, so
// that Process may begin again.
func (in *Inbox) process(ctx context.Context, group, messageID string, h Handler) (res Result, again bool, err error) {
	tx, err := in.db.BeginTx(ctx, &sql.TxOptions{Isolation: in.isolation})
	if err != nil {
		return Result{}, false, fmt.Errorf("inbox: begin: %w", err)
	}
	// Rollback takes no context, so a cancelled ctx cannot keep it from running; after a
	// commit it is a no-op.
	defer func() { _ = tx.Rollback() }()
	claimed, err := in.d.claimKey(ctx, tx, group, messageID)
	if err != nil {
		return Result{}, serializationFailure(err), fmt.Errorf("inbox: claim: %w", err)
	}
	if !claimed {
		return Result{Duplicate: true}, false, nil
	}
	if err := h(ctx, tx); err != nil {
		return Result{}, false, err
	}
	if err := tx.Commit(); err != nil {
		return Result{}, false, fmt.Errorf("inbox: commit: %w", err)
	}
	return Result{}, false, nil
}

// serializationFailure reports whether err is a deadlock or a serialization failure: SQLSTATE
// 40001 (both on MySQL and MariaDB, error 1213; a serialization failure on PostgreSQL) or
// 40P01 (a PostgreSQL deadlock). pgx's errors have a SQLState method; the MySQL driver's
// carry the state in their message only, as "Error 1213 (40001): ...". The inbox imports no
// driver.
func serializationFailure(err error) bool {
	var s interface{ SQLState() string }
	if errors.As(err, &s) {
		st := s.SQLState()
		return st == "40001" || st == "40P01"
	}
	return strings.Contains(err.Error(), " (40001): ")
}

// Claim records (group, messageID) on tx, the caller's own transaction, for consumers that
// manage their transaction themselves. Call it before any other work of the delivery on tx:
// when it reports [Result.Duplicate], skip the work (the transaction stays usable; roll it
// back or commit it, nothing was written); otherwise do the work on tx and commit. If the
// work fails, roll tx back so that the record goes with it, or the message would count as
// processed. A concurrent delivery of the same message waits in Claim until tx ends.
//
// Claim never commits or rolls back. A deadlock or serialization error (SQLSTATE 40001 or
// 40P01; see [Inbox.Process]) leaves tx unusable: roll it back and try the delivery again.
// Invalid input returns a [*outbox.ValidationError] and writes nothing.
func (in *Inbox) Claim(ctx context.Context, tx outbox.Tx, group, messageID string) (Result, error) {
	if isNil(tx) {
		return Result{}, invalid("Tx", "is nil")
	}
	if err := validateKey(group, messageID); err != nil {
		return Result{}, err
	}
	claimed, err := in.d.claimKey(ctx, tx, group, messageID)
	if err != nil {
		return Result{}, fmt.Errorf("inbox: claim: %w", err)
	}
	return Result{Duplicate: !claimed}, nil
}

// Purge deletes the records of messages processed more than olderThan ago (by the database
// clock), at most batch rows per statement, each statement a short transaction of its own,
// until a batch comes back short. It returns how many rows it deleted, also when ctx ends or
// a statement fails part way. batch 0 means [DefaultPurgeBatch]. A statement chosen as a
// deadlock's victim (deliveries inserting beside the purge) runs again, up to five times.
//
// olderThan is the dedupe window: a message redelivered after its record was purged is
// processed again, so keep it longer than the broker may redeliver (its redelivery window,
// or ack wait times the maximum deliveries). It must be at least a microsecond.
func (in *Inbox) Purge(ctx context.Context, olderThan time.Duration, batch int) (int64, error) {
	if olderThan < time.Microsecond {
		return 0, invalid("olderThan", "must be at least 1µs, got %s", olderThan)
	}
	switch {
	case batch == 0:
		batch = DefaultPurgeBatch
	case batch < 0 || batch > MaxPurgeBatch:
		return 0, invalid("batch", "must be between 1 and %d, got %d", MaxPurgeBatch, batch)
	}
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, fmt.Errorf("inbox: purge: %w", err)
		}
		n, err := in.purgeOnce(ctx, olderThan, batch)
		total += n
		if err != nil {
			return total, fmt.Errorf("inbox: purge: %w", err)
		}
		if n < int64(batch) {
			return total, nil
		}
	}
}

// purgeOnce runs one purge statement, and runs it again, up to maxClaimAttempts times in
// all, when the database chose it as a deadlock's victim: on MySQL and MariaDB a purge's
// range locks can deadlock with the claims of deliveries inserting beside it. The statement is
// its own transaction, so a victim deleted nothing.
func (in *Inbox) purgeOnce(ctx context.Context, olderThan time.Duration, batch int) (int64, error) {
	for attempt := 1; ; attempt++ {
		n, err := in.d.purgeBatch(ctx, in.db, olderThan, batch)
		if err == nil || attempt == maxClaimAttempts || ctx.Err() != nil || !serializationFailure(err) {
			return n, err
		}
	}
}

// validateKey checks a group and a message id: 1 to their bound in bytes, valid UTF-8,
// no NUL byte (PostgreSQL's text cannot hold one).
func validateKey(group, messageID string) error {
	if err := checkText("group", group, MaxGroupBytes); err != nil {
		return err
	}
	return checkText("messageID", messageID, MaxMessageIDBytes)
}

func checkText(field, v string, maxBytes int) error {
	switch {
	case v == "" || len(v) > maxBytes:
		return invalid(field, "must be 1..%d bytes, got %d", maxBytes, len(v))
	case !utf8.ValidString(v):
		return invalid(field, "is not valid UTF-8")
	case strings.IndexByte(v, 0) >= 0:
		return invalid(field, "contains a NUL byte")
	}
	return nil
}

func invalid(field, format string, args ...any) *outbox.ValidationError {
	return &outbox.ValidationError{Index: -1, Field: field, Reason: fmt.Sprintf(format, args...)}
}

// isNil reports whether tx is nil or a typed nil pointer (a nil *sql.Tx in the interface).
func isNil(tx outbox.Tx) bool {
	if tx == nil {
		return true
	}
	v := reflect.ValueOf(tx)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
