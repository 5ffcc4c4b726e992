package outboxbinlog

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxgo/outbox"
)

// Options configure a [Publisher].
type Options struct {
	// Scope is what the Publisher serves, as a polling outbox.Publisher's Scope: Namespace
	// is required, and Topics and TenantID narrow it. Rows outside it are left alone: the
	// log Publisher of their own scope (with a Name of its own) or, once their leases run
	// out, polling delivers them.
	outbox.Scope
	// ConnString is how the binlog connection reaches the server: a go-sql-driver/mysql
	// DSN (user:password@tcp(host:port)/) of the server the Store's pool writes to. The
	// user needs REPLICATION SLAVE and REPLICATION CLIENT (MariaDB 10.5+: BINLOG MONITOR);
	// the database in it, if any, is ignored. Required.
	ConnString string
	// Name identifies the reader: its row in the position table and its lock. Default
	// "outbox_" followed by the table's name. Letters, digits and underscores, at most 48
	// bytes. Publishers of different scopes on one table need different names.
	Name string
	// ServerID is the replica id the binlog connection registers with; it must differ
	// from the server's own server_id and from every replica's. Default a number derived
	// from the database and Name, above 2^24, so that the standby that takes over from a
	// stopped reader reuses it and readers of other databases on the server do not.
	ServerID uint32
	// Ordered delivers the events of each partition key in order, as a polling
	// Publisher with PublisherOptions.Ordered does, and must be set alike on both: a row
	// is published only while no earlier row of its key is pending, processing or (unless
	// OrderedSkipDead) dead, and a batch holds at most one row of a key per Publish call,
	// the next only once the one before was delivered (a transport that keeps key order,
	// outbox.TransportKeyOrder, gets each key's rows together). A row that may not go yet is
	// handed back to polling (pending at once, its attempt given back), whose ordered claim
	// delivers it after the rows before it. It reads the table once per batch with keyed
	// rows: create the table with the ordered migration set (migrations.Options.Ordered),
	// whose order_key column and index serve that read.
	Ordered bool
	// OrderedSkipDead, with Ordered, stops a dead row from holding back its key.
	OrderedSkipDead bool
	// BatchSize bounds the messages of one Publish call. Default 100, at most
	// outbox.MaxBatch. One settle covers the transactions the reader has waiting, up to
	// eight such batches of rows, and always a transaction's rows together.
	BatchSize int
	// RetryPolicy judges failed deliveries, as a polling Publisher's does. Default
	// outbox.DefaultRetryPolicy() for each zero field; give both the same policy.
	RetryPolicy outbox.RetryPolicy
	// PositionInterval is how often, at most, the Publisher writes its binlog position:
	// with the settle of a batch once the interval has passed since the last write, or
	// alone when only other tables' transactions went by, and always when a session ends.
	// The stored position may lag the settled outcomes, never lead them: a reader that
	// crashed reads up to an interval of binlog again, skipping the rows an earlier
	// session settled (one read of their status per batch until it meets a row still
	// under its insert lease), so a longer interval costs a longer re-read at restart,
	// not duplicates. Default 10s: a write per 10 s is at most a tenth of a write per
	// event at one event a second, and a thousandth at 100 a second.
	PositionInterval time.Duration
	// HeartbeatInterval is the server's heartbeat period on the binlog connection (an
	// idle server still proves it is alive) and how often the Publisher checks its lock
	// and reads its lag. Default 5s.
	HeartbeatInterval time.Duration
	// ShutdownTimeout is how long a batch being published may go on once Run's context is
	// cancelled, so that a shutdown settles it rather than failing it; then the
	// transport's context is cancelled. Default outbox.DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// RetryDelay is the pause before the Publisher connects again after a lost
	// connection, or while another reader holds the lock (it stands by). Default 1s.
	RetryDelay time.Duration
	// Logger receives what the Publisher reports. Default slog.Default().
	Logger *slog.Logger
}

// ErrInvalid is matched by the errors of bad [Options].
var ErrInvalid = errors.New("outboxbinlog: invalid options")

var readerName = regexp.MustCompile(`^[A-Za-z0-9_]{1,48}$`)

func (o Options) withDefaults(store *outbox.Store) Options {
	if o.Name == "" {
		o.Name = "outbox_" + store.Table().Name()
		if len(o.Name) > 48 {
			o.Name = o.Name[:48]
		}
	}
	if o.BatchSize == 0 {
		o.BatchSize = 100
	}
	d := outbox.DefaultRetryPolicy()
	o.RetryPolicy.BaseDelay = cmp.Or(o.RetryPolicy.BaseDelay, d.BaseDelay)
	o.RetryPolicy.MaxDelay = cmp.Or(o.RetryPolicy.MaxDelay, d.MaxDelay)
	o.RetryPolicy.MaxAttempts = cmp.Or(o.RetryPolicy.MaxAttempts, d.MaxAttempts)
	o.PositionInterval = cmp.Or(o.PositionInterval, 10*time.Second)
	o.HeartbeatInterval = cmp.Or(o.HeartbeatInterval, 5*time.Second)
	o.ShutdownTimeout = cmp.Or(o.ShutdownTimeout, outbox.DefaultShutdownTimeout)
	o.RetryDelay = cmp.Or(o.RetryDelay, time.Second)
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
	case !readerName.MatchString(o.Name):
		return bad("Name %q: use letters, digits and underscores, at most 48 bytes", o.Name)
	case o.BatchSize < 1 || o.BatchSize > outbox.MaxBatch:
		return bad("BatchSize must be between 1 and %d, got %d", outbox.MaxBatch, o.BatchSize)
	case o.PositionInterval < 10*time.Millisecond:
		return bad("PositionInterval must be at least 10ms, got %s", o.PositionInterval)
	case o.HeartbeatInterval < 100*time.Millisecond:
		return bad("HeartbeatInterval must be at least 100ms, got %s", o.HeartbeatInterval)
	case o.OrderedSkipDead && !o.Ordered:
		return bad("OrderedSkipDead applies to ordered publishers only; set Ordered too")
	case o.ShutdownTimeout < 0:
		return bad("ShutdownTimeout is negative (%s)", o.ShutdownTimeout)
	case o.RetryDelay < 0:
		return bad("RetryDelay is negative (%s)", o.RetryDelay)
	case o.RetryPolicy.BaseDelay < 0 || o.RetryPolicy.MaxDelay < o.RetryPolicy.BaseDelay || o.RetryPolicy.MaxAttempts < 1:
		return bad("RetryPolicy needs 0 <= BaseDelay <= MaxDelay and MaxAttempts >= 1, got %+v", o.RetryPolicy)
	}
	if _, err := mysql.ParseDSN(o.ConnString); err != nil {
		return bad("ConnString: %v", err)
	}
	return nil
}
