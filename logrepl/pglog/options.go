package outboxpglog

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/outboxgo/outbox"
)

// Options configure a [Publisher].
type Options struct {
	// Scope is what the Publisher serves, as a polling outbox.Publisher's Scope: Namespace
	// is required, and Topics and TenantID narrow it. Rows outside it are left alone: the
	// log Publisher of their own scope (with a slot of its own) or, once their leases run
	// out, polling delivers them.
	outbox.Scope
	// ConnString is how the replication connection reaches the server: a URL or key=value
	// DSN for pgx, for the same database as the Store's pool. The role needs the
	// REPLICATION attribute; replication=database is added. Required.
	ConnString string
	// Slot is the logical replication slot. Default "outbox_" followed by the table's
	// schema and "_" (when it has one) and its name. Lowercase letters, digits and
	// underscores, at most 63 bytes. The Publisher creates it when it is missing.
	Slot string
	// Publication is the publication of the table's inserts. Default the slot's name. The
	// Publisher creates it (FOR TABLE ... WITH (publish = 'insert')) on the Store's pool
	// when it is missing, which needs the table's owner; an existing one is used as it is.
	Publication string
	// Ordered delivers the events of each partition key in order, as a polling
	// Publisher with PublisherOptions.Ordered does, and must be set alike on both: a row
	// is published only while no earlier row of its key is pending, processing or (unless
	// OrderedSkipDead) dead, and a batch holds at most one row of a key per Publish call,
	// the next only once the one before was delivered (a transport that keeps key order,
	// outbox.TransportKeyOrder, gets each key's rows together). A row that may not go yet is handed
	// back to polling (pending at once, its attempt given back), whose ordered claim
	// delivers it after the rows before it. It reads the table once per batch with keyed
	// rows: create the table with the ordered migration set (migrations.Options.Ordered),
	// whose index serves that read.
	Ordered bool
	// OrderedSkipDead, with Ordered, stops a dead row from holding back its key.
	OrderedSkipDead bool
	// BatchSize bounds the messages of one Publish call and one settle. Default 100, at
	// most outbox.MaxBatch.
	BatchSize int
	// RetryPolicy judges failed deliveries, as a polling Publisher's does. Default
	// outbox.DefaultRetryPolicy() for each zero field; give both the same policy.
	RetryPolicy outbox.RetryPolicy
	// StatusInterval is how often the Publisher tells the server the position it
	// confirmed (a standby status update), which also keeps the connection alive. Default
	// 10s; keep it below the server's wal_sender_timeout (60s by default).
	StatusInterval time.Duration
	// HeartbeatInterval is how often the Publisher writes a message to the log
	// (pg_logical_emit_message, no table written) and reads its slot's lag, so that a slot
	// whose table is idle in a busy database still advances and does not hold WAL back.
	// Default 30s; negative turns it off.
	HeartbeatInterval time.Duration
	// ShutdownTimeout is how long a batch being published may go on once Run's context is
	// cancelled, so that a shutdown settles it rather than failing it; then the
	// transport's context is cancelled. Default outbox.DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// RetryDelay is the pause before the Publisher connects again after a lost
	// connection, or while another reader holds the slot (it stands by). Default 1s.
	RetryDelay time.Duration
	// Logger receives what the Publisher reports. Default slog.Default().
	Logger *slog.Logger
}

// ErrInvalid is matched by the errors of bad [Options].
var ErrInvalid = errors.New("outboxpglog: invalid options")

var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

func (o Options) withDefaults(store *outbox.Store) Options {
	if o.Slot == "" {
		t := store.Table()
		o.Slot = "outbox_" + t.Name()
		if t.Schema() != "" {
			o.Slot = "outbox_" + t.Schema() + "_" + t.Name()
		}
		if len(o.Slot) > 63 {
			o.Slot = o.Slot[:63]
		}
	}
	if o.Publication == "" {
		o.Publication = o.Slot
	}
	if o.BatchSize == 0 {
		o.BatchSize = 100
	}
	d := outbox.DefaultRetryPolicy()
	o.RetryPolicy.BaseDelay = cmp.Or(o.RetryPolicy.BaseDelay, d.BaseDelay)
	o.RetryPolicy.MaxDelay = cmp.Or(o.RetryPolicy.MaxDelay, d.MaxDelay)
	o.RetryPolicy.MaxAttempts = cmp.Or(o.RetryPolicy.MaxAttempts, d.MaxAttempts)
	if o.StatusInterval == 0 {
		o.StatusInterval = 10 * time.Second
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = 30 * time.Second
	}
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = outbox.DefaultShutdownTimeout
	}
	if o.RetryDelay == 0 {
		o.RetryDelay = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

func (o Options) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
	}
	switch {
	case o.ConnString == "":
		return bad("ConnString is empty")
	case o.Namespace == "":
		return bad("Namespace is required")
	case !slotName.MatchString(o.Slot):
		return bad("Slot %q: use lowercase letters, digits and underscores, at most 63 bytes", o.Slot)
	case !slotName.MatchString(o.Publication):
		return bad("Publication %q: use lowercase letters, digits and underscores, at most 63 bytes", o.Publication)
	case o.BatchSize < 1 || o.BatchSize > outbox.MaxBatch:
		return bad("BatchSize must be between 1 and %d, got %d", outbox.MaxBatch, o.BatchSize)
	case o.StatusInterval < 10*time.Millisecond:
		return bad("StatusInterval must be at least 10ms, got %s", o.StatusInterval)
	case o.HeartbeatInterval > 0 && o.HeartbeatInterval < 10*time.Millisecond:
		return bad("HeartbeatInterval must be negative (off) or at least 10ms, got %s", o.HeartbeatInterval)
	case o.OrderedSkipDead && !o.Ordered:
		return bad("OrderedSkipDead applies to ordered publishers only; set Ordered too")
	case o.ShutdownTimeout < 0:
		return bad("ShutdownTimeout is negative (%s)", o.ShutdownTimeout)
	case o.RetryDelay < 0:
		return bad("RetryDelay is negative (%s)", o.RetryDelay)
	case o.RetryPolicy.BaseDelay < 0 || o.RetryPolicy.MaxDelay < o.RetryPolicy.BaseDelay || o.RetryPolicy.MaxAttempts < 1:
		return bad("RetryPolicy needs 0 <= BaseDelay <= MaxDelay and MaxAttempts >= 1, got %+v", o.RetryPolicy)
	}
	return nil
}
