package outbox

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// Field bounds, in bytes of UTF-8. They fit every built-in schema (MySQL's index key limit
// is the tightest) and are checked before any SQL runs.
const (
	MaxNamespaceBytes    = 128
	MaxTopicBytes        = 255
	MaxDedupeKeyBytes    = 255
	MaxPartitionKeyBytes = 255
	MaxWorkerIDBytes     = 128
	MaxHeadersBytes      = 64 << 10 // encoded JSON
	MaxLastErrorBytes    = 1024     // longer errors are truncated, not refused
	// DefaultMaxPayloadBytes is the payload bound when [Options.MaxPayloadBytes] is zero.
	DefaultMaxPayloadBytes = 1 << 20
	// MaxBatch bounds one claim and one Complete call, which are single statements.
	MaxBatch = 1000
	// MaxScopeTopics bounds [Scope.Topics]: each topic is a bound parameter of the claim.
	MaxScopeTopics = 1000
)

// DefaultTable is the table name used when [Options.Table] is empty.
const DefaultTable = "outbox_events"

// Options configure a [Store]. The zero value is valid.
type Options struct {
	// Table is the outbox table: lowercase letters, digits and underscores, starting with a
	// letter or underscore, at most 48 bytes (room for the index names derived from it).
	// Default [DefaultTable].
	Table string
	// Schema places the table in a named schema, by the same rules as Table (at most 63
	// bytes): every statement names the table by schema and name, whatever the connection's
	// search_path, and wake-ups have a channel of their own per schema. Default none: the
	// table is found where the connection finds unqualified names. Only dialects with the
	// built-in PostgreSQL dialect accepts one; others refuse it at New.
	Schema string
	// MaxPayloadBytes bounds a message payload. Default [DefaultMaxPayloadBytes]; at most 1 GiB.
	// Keep it below what the server accepts in one statement: MySQL refuses packets over
	// max_allowed_packet (16 MiB by default on MariaDB, 64 MiB on MySQL 8) and drops the
	// connection, with the caller's transaction (Enqueue's error then names max_allowed_packet);
	// PostgreSQL caps a value near 1 GiB.
	MaxPayloadBytes int
	// DisableNotify turns off the wake-ups that cross processes, on dialects that have
	// them ([dialect.Notifier]: PostgreSQL's NOTIFY): enqueues send no signal, and publishers on
	// this store do not listen. Publishers then find rows from other processes by polling.
	// Wake-ups within the process stay on. The publishers of one pool and table share one
	// listener, which keeps one connection of the pool; it does not start where it would take
	// the pool's last connection (db.SetMaxOpenConns(1), say), and says so once unless this
	// is set.
	DisableNotify bool
	// ListenDB is a pool straight to the database server, past a transaction-pooling proxy
	// (PgBouncer with pool_mode=transaction, say), for the one connection of the wake-up
	// listener of the Store's publishers. Default the Store's pool. A listener behind
	// transaction pooling hears nothing, since the proxy lends its server connection to
	// other clients between statements: it notices (its own probe never comes back), says
	// so once, and leaves the publishers polling. With ListenDB set, signals still go out
	// through the Store's pool, on the callers' transactions, and the listener's connection
	// is not counted against the Store's pool. The publishers of one pool and table share
	// one listener, on the ListenDB of the first of them to start.
	ListenDB *sql.DB
	// Hooks watch the store's enqueues (and may add headers, such as a trace context).
	// Default none. See [StoreHooks].
	Hooks StoreHooks
	// LogLease, when positive, hands each message enqueued without a delay to a publisher
	// that reads the database's log (module logrepl/pglog for PostgreSQL, logrepl/mysqlbinlog
	// for MySQL and MariaDB) instead of to
	// polling: the row is inserted already leased to [LogWorkerID] for LogLease, under the
	// token [LogLeaseToken] derives from its id. Polling publishers pass over it while the
	// lease lives, and reclaim it as any expired lease once it ran out, so a log publisher
	// that is down or behind by more than LogLease is replaced by polling with nothing lost.
	// Delayed messages are inserted pending and polled, as without it. Default 0: off. At
	// least [MinLogLease]; keep it well above the log publisher's lag (a minute is a good
	// start). The PostgreSQL and MySQL dialects can; others (SQLite, which has no log to
	// read) refuse it at New with an error matching errors.ErrUnsupported.
	LogLease time.Duration
}

// Store is the outbox on one database. It is safe for concurrent use; make one per pool and
// table and keep it. Its methods serve three audiences:
//
//   - the application: [Store.Enqueue], [Store.EnqueueBatch], [Store.EnqueueOn] and
//     [Store.EnqueueStandalone] write messages, on the caller's transaction for all but the
//     last; a [Publisher] (or a [Relay]) delivers them.
//   - the operator: [Store.Check], [Store.Stats], [Store.Activity], [Store.ListDead],
//     [Store.DeadGroups], [Store.DeadCauses], [Store.Replay], [Store.ReplayWhere],
//     [Store.ReplayCause], [Store.Discard], [Store.DiscardWhere], [Store.DiscardCause],
//     [Store.Purge], [Store.BlockedKeys], [Store.Get] and [Store.GetByDedupeKey]; the outbox
//     command and the web view call the same methods.
//   - the lease protocol, a low-level API that a Publisher runs for you, for relays and tools
//     of one's own: [Store.Claim], [Store.Extend], [Store.Ack], [Store.Nack],
//     [Store.Complete], [Store.CompleteTx], [Store.CompleteAndClaim], [Store.Bury] and
//     [Store.BuryExpired].
type Store struct {
	db         *sql.DB
	dialect    Dialect
	table      dialect.Table
	maxPayload int
	notifier   dialect.Notifier // nil when the dialect has none or DisableNotify is set
	listenDB   *sql.DB          // the listener's pool: Options.ListenDB, or nil for db
	signalled  signalLimiter
	hooks      StoreHooks
	logLease   time.Duration // Options.LogLease
	// orderedReady records that the dialect's CheckOrdered passed (checkOrdered).
	orderedReady atomic.Bool
	// first is the verdict of the check at the first enqueue (checkFirstUse).
	first firstUse
}

// New returns a Store for db. db is used for claims, acks and reads; Enqueue writes on
// whatever transaction the caller passes.
func New(db *sql.DB, d Dialect, opts Options) (*Store, error) {
	if db == nil {
		return nil, invalid("db", "is nil")
	}
	if d == nil {
		return nil, invalid("dialect", "is nil")
	}
	name := opts.Table
	if name == "" {
		name = DefaultTable
	}
	t, err := dialect.NewTable(name)
	if err != nil {
		return nil, invalid("table", "%s", err)
	}
	if opts.Schema != "" {
		if sd, ok := d.(sqlkit.Schemer); !ok || !sd.SupportsSchema() {
			e := invalid("Schema", "the %s dialect cannot place the table in a schema; leave Schema empty", d.Name())
			e.kind = errors.ErrUnsupported
			return nil, e
		}
		if t, err = dialect.NewTableIn(opts.Schema, name); err != nil {
			return nil, invalid("Schema", "%s", err)
		}
	}
	maxPayload := opts.MaxPayloadBytes
	switch {
	case maxPayload == 0:
		maxPayload = DefaultMaxPayloadBytes
	case maxPayload < 0 || maxPayload > 1<<30:
		return nil, invalid("MaxPayloadBytes", "must be between 1 and 1 GiB, got %d", maxPayload)
	}
	if b, ok := d.(sqlkit.PoolBinder); ok {
		d = b.BindPool(db) // per-pool state, such as prepared statements, lives with the Store
	}
	if err := checkLogLease(d, opts.LogLease); err != nil {
		return nil, err
	}
	s := &Store{db: db, dialect: d, table: t, maxPayload: maxPayload, hooks: opts.Hooks, listenDB: opts.ListenDB, logLease: opts.LogLease}
	if n, ok := d.(dialect.Notifier); ok && !opts.DisableNotify {
		s.notifier = n
	}
	return s, nil
}

// DB returns the database the store claims from.
func (s *Store) DB() *sql.DB { return s.db }

// Dialect returns the store's dialect. A built-in dialect that keeps state per pool (SQLite's
// prepared statements, and which scopes have a backlog) is the store's own copy, bound to
// [Store.DB].
func (s *Store) Dialect() Dialect { return s.dialect }

// Table returns the store's table.
func (s *Store) Table() dialect.Table { return s.table }

// Message is one event to enqueue.
type Message struct {
	// Namespace and Topic route the message; both are required (1..128 and 1..255 bytes).
	Namespace string
	Topic     string
	// TenantID optionally scopes the message to a tenant; uuid.Nil means none. When both
	// TenantID and DedupeKey are set, DedupeKey must begin with TenantID.String() + "/".
	TenantID uuid.UUID
	// DedupeKey makes enqueue idempotent: at most one row exists per (Namespace, Topic,
	// DedupeKey). Empty means none. A key protects only as long as its row exists: once the
	// row is deleted ([Store.Purge], a [Publisher]'s [Retention], [Store.Discard]), the same
	// key can be enqueued again. Retention of delivered rows is therefore the dedupe window;
	// keep delivered rows at least as long as producers may retry.
	DedupeKey string
	// PartitionKey names the entity the event belongs to (an order id, say). It is stored
	// and passed to the transport, which may use it as the broker's key (a Kafka record
	// key, for instance). A [Publisher] with [PublisherOptions.Ordered] delivers the events
	// of one namespace and partition key one at a time, in enqueue order ((created_at, id)
	// at insert), across all its publishers and through retries; without it, retries and
	// concurrent claims can deliver a key's events out of order. Producers writing one key
	// from concurrent transactions must serialise on the entity themselves (docs/ordering.md).
	// Empty means none: such events are never held back.
	PartitionKey string
	// Headers carry metadata such as trace context and content type.
	Headers Headers
	// Payload is the complete event as JSON (valid UTF-8). It is stored and delivered byte
	// for byte; consumers should not need to query back.
	Payload json.RawMessage
	// Delay postpones the first delivery: next_attempt_at = now + Delay on the database
	// clock, so every host agrees. Zero delivers as soon as possible.
	Delay time.Duration
}

// Result reports what Enqueue did with one message.
type Result struct {
	// ID is the new row's id (a time-ordered UUIDv7), or uuid.Nil when Duplicate.
	ID uuid.UUID
	// Duplicate is true when a row with the same namespace, topic and dedupe key already
	// existed: nothing was inserted, and the caller's transaction is intact.
	Duplicate bool
}

// Tx is what Enqueue writes on: the caller's open transaction. [*sql.Tx] satisfies it, and
// so does a wrapper that embeds one and passes queries and arguments on unchanged (sqlx.Tx
// does: its ExecContext is the embedded *sql.Tx's). A wrapper that formats queries itself
// does not work, though it satisfies Tx: bun.Tx replaces placeholders with literals and
// sends the dialect's $1 without its argument. Enqueue refuses a bun.Tx before any SQL
// runs, and names the fix for other wrappers when PostgreSQL reports a missing parameter:
// pass the *sql.Tx the wrapper embeds (tx.Tx for bun.Tx), the same transaction. With GORM,
// pass the *sql.Tx under its transaction (tx.Statement.ConnPool); with pgx's own
// transactions, use package github.com/outboxgo/outbox/pgxv5. Enqueue never calls Commit or
// Rollback; they are part of Tx so that a [*sql.DB], which has neither, cannot be passed by
// accident: an event enqueued on the pool beside a business transaction would commit even
// when the business change rolls back. To enqueue without a business transaction, use
// [Store.EnqueueStandalone].
type Tx interface {
	dialect.DBTX
	Commit() error
	Rollback() error
}

// Enqueue writes m on tx, the caller's transaction: the row commits or rolls back with the
// business change, and Enqueue never commits or rolls back itself. Invalid input returns a
// [*ValidationError] and writes nothing; a duplicate dedupe key is reported in
// [Result.Duplicate] and leaves tx usable. The first enqueue of a Store with a built-in
// dialect checks, on tx, that the dialect matches the database and that SQLite runs with
// WAL and a busy timeout; a mismatch returns the [*CheckError] that [Store.Check] gives,
// writes nothing and leaves tx usable, on every later enqueue too.
func (s *Store) Enqueue(ctx context.Context, tx Tx, m Message) (Result, error) {
	if isNil(tx) {
		return Result{}, invalid("Tx", "is nil")
	}
	if err := checkTx(tx); err != nil {
		return Result{}, err
	}
	rs, err := s.enqueue(ctx, writeTarget{q: tx}, []Message{m}, -1)
	if err != nil {
		return Result{}, err
	}
	return rs[0], nil
}

// EnqueueBatch writes msgs on tx in as few statements as the database's placeholder limits
// allow. Every message is validated before any SQL runs; one invalid message fails the
// whole call with a [*ValidationError] naming its index, and nothing is written.
func (s *Store) EnqueueBatch(ctx context.Context, tx Tx, msgs []Message) ([]Result, error) {
	if isNil(tx) {
		return nil, invalid("Tx", "is nil")
	}
	if err := checkTx(tx); err != nil {
		return nil, err
	}
	if len(msgs) == 0 {
		return nil, nil
	}
	return s.enqueue(ctx, writeTarget{q: tx}, msgs, 0)
}

// EnqueueStandalone writes msgs in a short transaction of its own on the store's pool and
// commits it before returning: all of them or none. Use it for events that no business
// change goes with (a scheduled reminder, a re-sent notification). When the event announces
// a change your code writes, enqueue it with [Store.Enqueue] in that change's transaction
// instead, or a rolled-back change would still publish its event.
func (s *Store) EnqueueStandalone(ctx context.Context, msgs ...Message) ([]Result, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("outbox: enqueue: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	first := 0
	if len(msgs) == 1 {
		first = -1 // a single message is not "message 0 of a batch" in errors
	}
	res, err := s.enqueue(ctx, writeTarget{q: tx}, msgs, first)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("outbox: enqueue: commit: %w", err)
	}
	return res, nil
}

// EnqueueOn writes msgs as [Store.EnqueueBatch] does (validation, ids, hooks, dedupe keys
// reported in [Result.Duplicate], wake-ups), with statements that r runs on the caller's
// transaction: for a transaction that database/sql does not manage. It is what driver
// adapters build on (package github.com/outboxgo/outbox/pgxv5 enqueues on a pgx.Tx with
// it); application code calls those, or [Store.Enqueue]. The dialect renders the
// statements (only the built-in PostgreSQL dialect renders them); with another
// dialect EnqueueOn returns an error matching [errors.ErrUnsupported] and writes nothing.
//
// r must run on an open transaction of the store's database, which EnqueueOn cannot check:
// an adapter should take a transaction type, as [Tx] does. The first-use check of
// [Store.Enqueue] does not run here: it reads the pool's driver and the caller's
// database/sql transaction, and the rendering ability stands in for it.
func (s *Store) EnqueueOn(ctx context.Context, r dialect.Runner, msgs []Message) ([]Result, error) {
	if isNil(r) {
		return nil, invalid("Runner", "is nil")
	}
	rd, ok := s.dialect.(sqlkit.Renderer)
	if !ok {
		return nil, fmt.Errorf("outbox: enqueue: the %s dialect does not render its statements (only the built-in PostgreSQL dialect does), so it enqueues only on a database/sql transaction: %w", s.dialect.Name(), errors.ErrUnsupported)
	}
	if len(msgs) == 0 {
		return nil, nil
	}
	return s.enqueue(ctx, writeTarget{r: r, rd: rd}, msgs, 0)
}

// writeTarget is where an enqueue writes: the caller's database/sql transaction q, run by
// the dialect, or (EnqueueOn) a Runner r of another driver's transaction, which runs the
// statements the dialect renders with rd.
type writeTarget struct {
	q  dialect.DBTX
	r  dialect.Runner
	rd sqlkit.Renderer
}

func (w writeTarget) insert(ctx context.Context, s *Store, rows []dialect.Row) ([]bool, error) {
	if w.r == nil {
		return s.dialect.Insert(ctx, w.q, s.table, rows)
	}
	stmts, err := w.rd.RenderInsert(s.table, rows)
	if err != nil {
		return nil, err
	}
	return sqlkit.RunInsert(ctx, w.r, stmts, rows)
}

func (w writeTarget) signal(ctx context.Context, s *Store, namespace string) error {
	if w.r == nil {
		return s.notifier.Signal(ctx, w.q, s.table, namespace)
	}
	st, ok := w.rd.RenderSignal(s.table, namespace)
	if !ok {
		return nil
	}
	_, err := w.r.Exec(ctx, st.Query, st.Args...)
	return err
}

func (s *Store) enqueue(ctx context.Context, w writeTarget, msgs []Message, firstIndex int) (res []Result, err error) {
	if s.hooks.Enqueue != nil {
		var state []enqueueHooked
		msgs, state = s.startEnqueueHooks(ctx, msgs)
		defer func() { s.endEnqueueHooks(msgs, state, res, err) }()
	}
	rows := make([]dialect.Row, len(msgs))
	for i := range msgs {
		if err := s.validate(&msgs[i]); err != nil {
			if firstIndex >= 0 {
				err.Index = firstIndex + i
			}
			return nil, err
		}
		id, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("outbox: new id: %w", err)
		}
		m := &msgs[i]
		sum := sha256.Sum256(m.Payload)
		rows[i] = dialect.Row{
			ID: id, Namespace: m.Namespace, Topic: m.Topic, TenantID: m.TenantID,
			DedupeKey: m.DedupeKey, PartitionKey: m.PartitionKey, Headers: m.Headers,
			Payload: m.Payload, PayloadHash: sum[:], Delay: m.Delay,
		}
		if s.logLease > 0 && m.Delay == 0 {
			rows[i].Lease = s.insertLease(id)
		}
	}
	if w.q != nil {
		if err := s.checkFirstUse(ctx, w.q); err != nil {
			return nil, err
		}
	}
	inserted, err := w.insert(ctx, s, rows)
	if err != nil {
		size := 0
		for i := range rows {
			size += len(rows[i].Payload)
		}
		if e := placeholderError(w.q, err); w.q != nil && e != nil {
			return nil, e
		}
		return nil, s.explain("enqueue", err, size)
	}
	if len(inserted) != len(rows) {
		return nil, fmt.Errorf("outbox: enqueue: dialect %s reported %d results for %d rows", s.dialect.Name(), len(inserted), len(rows))
	}
	res = make([]Result, len(rows))
	var woken []string // namespaces with new rows, to wake their publishers
	for i, ok := range inserted {
		if ok {
			res[i].ID = rows[i].ID
			// A row leased to the log's reader gives polling publishers nothing to claim.
			if rows[i].Lease.Duration == 0 && !slices.Contains(woken, rows[i].Namespace) {
				woken = append(woken, rows[i].Namespace)
			}
		} else {
			res[i].Duplicate = true
		}
	}
	for _, ns := range woken {
		if s.notifier != nil && s.signalled.allow(ns) {
			if err := w.signal(ctx, s, ns); err != nil {
				return nil, s.sqlError("enqueue: signal", err)
			}
		}
		// Publishers in this process are woken now, before the caller commits: they chase
		// the commit with a few quick claims (chaseDelays).
		if h := hubFor(s.db, s.table); h != nil {
			h.signal(ns)
		}
	}
	return res, nil
}

// validate checks one message before any SQL runs.
func (s *Store) validate(m *Message) *ValidationError {
	if err := checkText("namespace", m.Namespace, 1, MaxNamespaceBytes); err != nil {
		return err
	}
	if err := checkText("topic", m.Topic, 1, MaxTopicBytes); err != nil {
		return err
	}
	if err := checkText("dedupe_key", m.DedupeKey, 0, MaxDedupeKeyBytes); err != nil {
		return err
	}
	if err := checkText("partition_key", m.PartitionKey, 0, MaxPartitionKeyBytes); err != nil {
		return err
	}
	if m.TenantID != uuid.Nil && m.DedupeKey != "" {
		prefix := m.TenantID.String() + "/"
		if !strings.HasPrefix(m.DedupeKey, prefix) {
			e := invalid("dedupe_key", "must begin with the tenant id %q", prefix)
			e.kind = ErrTenantMismatch
			return e
		}
	}
	if len(m.Headers) > 0 {
		size := 2
		for k, v := range m.Headers {
			if err := checkText("headers", k, 1, MaxHeadersBytes); err != nil {
				err.Reason = "key: " + err.Reason
				return err
			}
			if err := checkText("headers", v, 0, MaxHeadersBytes); err != nil {
				err.Reason = fmt.Sprintf("value of %q: %s", k, err.Reason)
				return err
			}
			size += len(k) + len(v) + 6
		}
		// The raw size is a lower bound of the JSON; escapes (\u003c for "<") can make
		// it up to six times larger, so measure the encoding when it could be too big.
		if size > MaxHeadersBytes/6 {
			if b, _ := json.Marshal(map[string]string(m.Headers)); len(b) > MaxHeadersBytes {
				return invalid("headers", "encode to %d bytes, more than the limit of %d", len(b), MaxHeadersBytes)
			}
		}
	}
	switch {
	case len(m.Payload) == 0:
		return invalid("payload", "is empty")
	case len(m.Payload) > s.maxPayload:
		return invalid("payload", "is %d bytes, more than the limit of %d (Options.MaxPayloadBytes)", len(m.Payload), s.maxPayload)
	case !validJSON(m.Payload): // one pass for both; tell which failed
		if !utf8.Valid(m.Payload) {
			return invalid("payload", "is not valid UTF-8")
		}
		return invalid("payload", "is not valid JSON")
	}
	if m.Delay < 0 {
		return invalid("delay", "is negative (%s)", m.Delay)
	}
	return nil
}

// checkText bounds a string field and rejects what no database stores faithfully.
func checkText(field, v string, minLen, maxLen int) *ValidationError {
	switch {
	case len(v) < minLen:
		return invalid(field, "is required")
	case len(v) > maxLen:
		return invalid(field, "is %d bytes, more than the limit of %d", len(v), maxLen)
	case !utf8.ValidString(v):
		return invalid(field, "is not valid UTF-8")
	case strings.IndexByte(v, 0) >= 0:
		return invalid(field, "contains a NUL byte")
	}
	return nil
}

// ClaimOptions configure one [Store.Claim].
type ClaimOptions struct {
	// Scope restricts the claim to a namespace, topics and a tenant. Zero fields match all.
	Scope
	// Limit is the most rows to claim, 1..[MaxBatch].
	Limit int
	// Lease is how long the rows stay reserved for this worker (at least 1ms).
	Lease time.Duration
	// MaxAttempts excludes rows that have been attempted this often (at least 1).
	MaxAttempts int
	// WorkerID is recorded in locked_by (1..128 bytes).
	WorkerID string
	// Ordered claims in order per partition key: a row with a partition key is claimed only
	// when no earlier row (by created_at, id) of its namespace and key is pending, processing
	// or dead, so one row per key is in flight at a time, and a row waiting for a retry holds
	// back the rows after it. Rows without a partition key are claimed as usual. It needs a
	// dialect that implements [dialect.OrderedClaimer]; with another, Claim returns an error
	// matching [errors.ErrUnsupported]. It also needs the table's order index (the ordered
	// migration set): the first ordered claim of a [Store] checks for it and returns a
	// [*CheckError] without it, and so does every one after, until the check passes. See
	// [PublisherOptions.Ordered].
	Ordered bool
	// OrderedSkipDead, with Ordered, lets the rows after a dead row of their key be claimed:
	// a dead row no longer holds its key back. By default it does, until it is replayed or
	// discarded.
	OrderedSkipDead bool
	// Runs, with Ordered, claims with each key's head the rows of its key that follow it, in
	// sequence, while each can be claimed (pending, due, below MaxAttempts, in Scope),
	// stopping at the first that cannot, within Limit: a key's waiting rows come back
	// together, in (created_at, id) order. No other claim takes them meanwhile. Deliver them
	// in that order and stop at a key's first failure: a row after it must go back without
	// being delivered. A [Publisher] sets it for a [Transport] that keeps key order
	// ([TransportKeyOrder]). A dialect may ignore it and claim heads only.
	Runs bool
	// RunShare, with Runs, is how many claim loops share the keys: a claim takes the heads
	// of at most RunShare-th of the keys whose heads it finds, rounded up, and fills the
	// batch with their runs, leaving the other keys to the other loops, so that a few keys'
	// backlog keeps every loop busy instead of one. 0 or 1: every key it finds. A
	// [Publisher] sets its Concurrency. A dialect may ignore it.
	RunShare int
	// Continue, with Runs, is for [Store.CompleteAndClaim]: before it looks for heads, the
	// claim takes the runs that follow the keys the outcomes delivered (every outcome of the
	// key delivered and applied), from each key's last delivered row, and looks for other
	// keys' heads only when those runs leave the batch short. It spares the search for heads
	// while a loop's own keys keep it busy; since that keeps other keys' heads waiting, a
	// [Publisher] sets it on three claims of a loop in four. It presumes that the outcomes
	// settle every row the caller holds of each such key, as a Publisher settles a batch's
	// rows together: a row of the key held and settled later would be overtaken. A dialect
	// may ignore it.
	Continue bool
}

func (o *ClaimOptions) validate() error {
	if err := validateScope(o.Scope); err != nil {
		return err
	}
	if o.OrderedSkipDead && !o.Ordered {
		return invalid("OrderedSkipDead", "applies to ordered claims only; set Ordered too")
	}
	if o.Runs && !o.Ordered {
		return invalid("Runs", "applies to ordered claims only; set Ordered too")
	}
	switch {
	case o.RunShare < 0:
		return invalid("RunShare", "must be 0 or more, got %d", o.RunShare)
	case o.RunShare > 0 && !o.Runs:
		return invalid("RunShare", "applies to claims with runs only; set Runs too")
	case o.Continue && !o.Runs:
		return invalid("Continue", "applies to claims with runs only; set Runs too")
	}
	switch {
	case o.Limit < 1 || o.Limit > MaxBatch:
		return invalid("Limit", "must be between 1 and %d, got %d", MaxBatch, o.Limit)
	case o.Lease < time.Millisecond:
		return invalid("Lease", "must be at least 1ms, got %s", o.Lease)
	case o.MaxAttempts < 1:
		return invalid("MaxAttempts", "must be at least 1, got %d", o.MaxAttempts)
	}
	if err := checkText("WorkerID", o.WorkerID, 1, MaxWorkerIDBytes); err != nil {
		return err
	}
	return nil
}

func validateScope(sc Scope) error {
	if err := checkText("Namespace", sc.Namespace, 0, MaxNamespaceBytes); err != nil {
		return err
	}
	if len(sc.Topics) > MaxScopeTopics {
		return invalid("Topics", "lists %d topics, more than the limit of %d", len(sc.Topics), MaxScopeTopics)
	}
	for _, t := range sc.Topics {
		if err := checkText("Topics", t, 1, MaxTopicBytes); err != nil {
			return err
		}
	}
	return nil
}

// Claim leases up to o.Limit due rows in its own short transaction and returns them in
// (created_at, id) order. Each returned [Record] carries the lease token that Ack, Nack and
// Extend must present. An empty result is not an error.
//
// When ctx ends while the claim runs, the database may have committed it after all (the
// transaction's end and the cancellation race, on every database): its rows then stay
// leased, unreturned, until the lease expires, as after a crash, and are claimed again. A
// [Publisher] claims on a context that ends only at its shutdown deadline for this reason.
func (s *Store) Claim(ctx context.Context, o ClaimOptions) ([]Record, error) {
	p, err := s.claimParams(ctx, o)
	if err != nil {
		return nil, err
	}
	recs, err := s.dialect.Claim(ctx, s.db, s.table, p)
	if err != nil {
		return nil, s.sqlError("claim", err)
	}
	return recs, nil // in claim order: the dialect returns them so (its checklist's rule 4)
}

// claimParams validates o and turns it into the dialect's arguments, with a fresh token.
// An ordered claim needs the ordered ability and, until its check passed once, the
// dialect's check of the table (checkOrdered).
func (s *Store) claimParams(ctx context.Context, o ClaimOptions) (dialect.ClaimParams, error) {
	if err := o.validate(); err != nil {
		return dialect.ClaimParams{}, err
	}
	if o.Ordered {
		oc, err := s.orderedClaimer()
		if err != nil {
			return dialect.ClaimParams{}, err
		}
		if err := s.checkOrdered(ctx, oc); err != nil {
			return dialect.ClaimParams{}, err
		}
	}
	return dialect.ClaimParams{
		Scope: o.Scope, Limit: o.Limit, Lease: o.Lease, MaxAttempts: o.MaxAttempts,
		WorkerID: o.WorkerID, Token: uuid.New(), Ordered: o.Ordered, OrderedSkipDead: o.OrderedSkipDead,
		Runs: o.Runs, RunShare: o.RunShare, Continue: o.Continue,
	}, nil
}

// Ack marks claimed rows delivered. Rows whose lease was lost are left unchanged and
// reported by a [*LeaseLostError]; the others are acked all the same.
func (s *Store) Ack(ctx context.Context, leases ...Lease) error {
	out := make([]Outcome, len(leases))
	for i, l := range leases {
		out[i] = Outcome{Lease: l, Status: StatusDelivered}
	}
	return s.Complete(ctx, out...)
}

// Failure is a failed delivery of one claimed row, for [Store.Nack].
type Failure struct {
	Lease
	// Attempts is the row's attempt count as claimed ([Record.Attempts]).
	Attempts int
	// Err is why it failed. Wrap it with [Permanent] to dead-letter at once, with
	// [RetryAfter] to choose the delay, or with [Unavailable] when the destination could
	// not be reached, to give the attempt back.
	Err error
}

// Nack records failed deliveries: each row goes back to pending with next_attempt_at set by
// policy, or to dead when its error is permanent or it reached policy.MaxAttempts. A failure
// marked [Unavailable] goes back to pending with the claim's attempt given back, whatever
// the attempt count (see [RetryPolicy.Outcome]). Lost leases are reported as by [Store.Ack].
func (s *Store) Nack(ctx context.Context, policy RetryPolicy, failures ...Failure) error {
	policy = policy.withDefaults()
	if err := policy.validate(); err != nil {
		return err
	}
	out := make([]Outcome, len(failures))
	for i, f := range failures {
		out[i] = policy.Outcome(f)
	}
	return s.Complete(ctx, out...)
}

// Complete applies outcomes in one statement per [MaxBatch] rows. It is the primitive under
// Ack and Nack; a publisher settles a mixed batch with it in a single round trip. A call that
// names a row under two different leases is refused with a [*ValidationError]: a row
// claimed again has a new lease, and only the latest can hold.
func (s *Store) Complete(ctx context.Context, outcomes ...Outcome) error {
	outcomes, err := checkOutcomes(outcomes)
	if err != nil {
		return err
	}
	var lost []uuid.UUID
	for chunk := range slices.Chunk(outcomes, MaxBatch) {
		l, err := s.dialect.Complete(ctx, s.db, s.table, chunk)
		if err != nil {
			return s.sqlError("complete", err)
		}
		lost = append(lost, l...)
	}
	if len(lost) > 0 {
		return &LeaseLostError{IDs: lost}
	}
	return nil
}

// CompleteTx applies outcomes as [Store.Complete] does, on tx, the caller's transaction,
// which it never commits or rolls back: a reader of the database's log commits its
// position in the same transaction as the outcomes it covers, so that a crash can never
// separate them. On MySQL a deadlock is not retried here; roll back and try again.
func (s *Store) CompleteTx(ctx context.Context, tx Tx, outcomes ...Outcome) error {
	if tx == nil {
		return invalid("tx", "is nil")
	}
	outcomes, err := checkOutcomes(outcomes)
	if err != nil {
		return err
	}
	var lost []uuid.UUID
	for chunk := range slices.Chunk(outcomes, MaxBatch) {
		l, err := s.dialect.Complete(ctx, tx, s.table, chunk)
		if err != nil {
			return s.sqlError("complete", err)
		}
		lost = append(lost, l...)
	}
	if len(lost) > 0 {
		return &LeaseLostError{IDs: lost}
	}
	return nil
}

// checkOutcomes validates outcomes and returns a copy with every error bounded to
// MaxLastErrorBytes; the caller's slice stays as it was.
func checkOutcomes(outcomes []Outcome) ([]Outcome, error) {
	if err := checkDistinct(len(outcomes), func(i int) Lease { return outcomes[i].Lease }); err != nil {
		return nil, err
	}
	outcomes = slices.Clone(outcomes)
	for i := range outcomes {
		o := &outcomes[i]
		switch o.Status {
		case StatusDelivered, StatusDead:
			if o.RefundAttempt {
				return nil, invalid("RefundAttempt", "applies to pending outcomes only, got %q", o.Status)
			}
		case StatusPending:
			if o.Delay < 0 {
				return nil, invalid("Delay", "is negative (%s)", o.Delay)
			}
		default:
			return nil, invalid("Status", "outcome must be delivered, pending or dead, got %q", o.Status)
		}
		o.Error = truncateUTF8(o.Error, MaxLastErrorBytes)
	}
	return outcomes, nil
}

// checkDistinct refuses n leases (lease(i) is the i-th) that name a row under two
// different tokens. A dialect reports lost leases by row, so when one of them holds (the
// row was claimed again, and only its latest lease can hold) the stale one would pass for
// applied. The same lease repeated is one row, applied once. Leases of one claim, the
// common settle, share a token and need no map.
func checkDistinct(n int, lease func(i int) Lease) error {
	if n < 2 {
		return nil
	}
	first := lease(0).Token
	i := 1
	for i < n && lease(i).Token == first {
		i++
	}
	if i == n {
		return nil
	}
	tokens := make(map[uuid.UUID]uuid.UUID, n)
	for i := range n {
		l := lease(i)
		if t, seen := tokens[l.ID]; seen && t != l.Token {
			return invalid("leases", "name row %s under two leases; settle or renew each row under its latest lease only", l.ID)
		}
		tokens[l.ID] = l.Token
	}
	return nil
}

// Extend renews the leases for another d, measured from now on the database clock. Rows
// whose lease was lost are reported by a [*LeaseLostError]; the others are extended. A row
// named under two leases is refused, as by [Store.Complete].
func (s *Store) Extend(ctx context.Context, d time.Duration, leases ...Lease) error {
	if d < time.Millisecond {
		return invalid("Lease", "must be at least 1ms, got %s", d)
	}
	if err := checkDistinct(len(leases), func(i int) Lease { return leases[i] }); err != nil {
		return err
	}
	var lost []uuid.UUID
	for chunk := range slices.Chunk(leases, MaxBatch) {
		l, err := s.dialect.Extend(ctx, s.db, s.table, dialect.ExtendParams{Leases: chunk, Lease: d})
		if err != nil {
			return s.sqlError("extend", err)
		}
		lost = append(lost, l...)
	}
	if len(lost) > 0 {
		return &LeaseLostError{IDs: lost}
	}
	return nil
}

// Bury dead-letters up to limit rows in scope that reached maxAttempts and that no live
// lease protects (a worker crashed during the last attempt, or the limit was lowered), and
// returns their ids. Claims never pick such rows; a [Publisher] buries them. Pending rows
// at the limit exist only after the limit was lowered (or while publishers with different
// limits share a table), but finding them walks the whole pending backlog;
// [Store.BuryExpired] is the cheaper sweep to repeat.
func (s *Store) Bury(ctx context.Context, scope Scope, maxAttempts, limit int) ([]uuid.UUID, error) {
	return s.bury(ctx, scope, maxAttempts, limit, false)
}

// BuryExpired is [Store.Bury] for processing rows only: those whose worker crashed during
// the last attempt and whose lease has run out, the exhausted rows that appear while the
// attempt limit stays the same. A [Publisher] sweeps with it every
// [PublisherOptions.SweepInterval], and with Bury at its first sweep (one interval after
// start) and every 60th. On MySQL and MariaDB, whose claim index leads with status, it
// reads only the rows in flight (0.7 ms against 120 ms for Bury with 100 000 pending rows);
// on PostgreSQL and SQLite the partial claim index holds pending and processing rows
// together, so it walks the backlog as Bury does (about 25 ms per 100 000 pending rows). A partial index on processing rows would make it cheap there too, at the
// price of one more index entry written by every claim; it is not in the migrations.
func (s *Store) BuryExpired(ctx context.Context, scope Scope, maxAttempts, limit int) ([]uuid.UUID, error) {
	return s.bury(ctx, scope, maxAttempts, limit, true)
}

func (s *Store) bury(ctx context.Context, scope Scope, maxAttempts, limit int, expiredOnly bool) ([]uuid.UUID, error) {
	if err := validateScope(scope); err != nil {
		return nil, err
	}
	if maxAttempts < 1 {
		return nil, invalid("MaxAttempts", "must be at least 1, got %d", maxAttempts)
	}
	if limit < 1 || limit > MaxBatch {
		return nil, invalid("Limit", "must be between 1 and %d, got %d", MaxBatch, limit)
	}
	ids, err := s.dialect.Bury(ctx, s.db, s.table, dialect.BuryParams{
		Scope: scope, MaxAttempts: maxAttempts, Limit: limit, Token: uuid.New(), ExpiredOnly: expiredOnly,
		Reason: fmt.Sprintf("attempt limit reached (%d attempts)", maxAttempts),
	})
	if err != nil {
		return nil, s.sqlError("bury", err)
	}
	return ids, nil
}

// Get reads one row by id, or returns [ErrNotFound].
func (s *Store) Get(ctx context.Context, id uuid.UUID) (Record, error) {
	r, err := s.dialect.Get(ctx, s.db, s.table, id)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return Record{}, err
		}
		return Record{}, fmt.Errorf("outbox: get: %w", err)
	}
	return r, nil
}

// sqlError wraps an error of the dialect's statement for op: see explain.
func (s *Store) sqlError(op string, err error) error { return s.explain(op, err, 0) }

// explain wraps an error of the dialect's statement for op, which carried payload bytes
// of payload, with what the dialect's [dialect.Checker] makes of it: a [*CheckError]
// (a missing table says to migrate) as it is, another explanation after op. An error the
// dialect cannot explain names the dialect, since a dialect that does not match the
// database fails with syntax errors that would not say so.
func (s *Store) explain(op string, err error, payload int) error {
	if x, ok := s.dialect.(dialect.Checker); ok {
		if e := x.ExplainError(err, dialect.ExplainParams{Table: s.table, PayloadBytes: payload}); e != nil {
			var ce *CheckError
			if errors.As(e, &ce) {
				return e
			}
			return fmt.Errorf("outbox: %s: %w", op, e)
		}
	}
	return fmt.Errorf("outbox: %s (%s dialect): %w", op, s.dialect.Name(), err)
}

// isNil reports whether v is nil or a nil pointer in an interface (a nil *sql.Tx), which
// would panic on first use.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// truncateUTF8 cuts s to at most n bytes without splitting a rune, and drops NUL bytes
// that some databases refuse in text.
func truncateUTF8(s string, n int) string {
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "")
	}
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// CompleteAndClaim records outcomes, as [Store.Complete] does, and claims the next batch, as
// [Store.Claim] does, in one transaction, so that a relay of one's own pays one commit per
// batch instead of two. A [Publisher] does this by itself after every full batch.
//
// It returns the claimed records, in (created_at, id) order, and the ids of outcomes whose
// lease was lost (left unchanged, as Complete reports with a [*LeaseLostError]). On an error
// nothing was claimed for the caller and the outcomes may or may not have been recorded
// (the transaction's end can race a lost connection, as for any write): settle them again
// with Complete, and count a lost lease on a row that already carries the outcome as
// settled. At most [MaxBatch] outcomes. A dialect without the ability ([dialect.SettleClaimer])
// returns an error matching [errors.ErrUnsupported]; call Complete, then Claim.
func (s *Store) CompleteAndClaim(ctx context.Context, outcomes []Outcome, o ClaimOptions) (claimed []Record, lost []uuid.UUID, err error) {
	sc, ok := s.dialect.(dialect.SettleClaimer)
	if !ok {
		return nil, nil, fmt.Errorf("outbox: dialect %s cannot settle and claim in one transaction: %w", s.dialect.Name(), errors.ErrUnsupported)
	}
	if len(outcomes) > MaxBatch {
		return nil, nil, invalid("outcomes", "are %d, more than the limit of %d", len(outcomes), MaxBatch)
	}
	outcomes, err = checkOutcomes(outcomes)
	if err != nil {
		return nil, nil, err
	}
	p, err := s.claimParams(ctx, o)
	if err != nil {
		return nil, nil, err
	}
	if len(outcomes) == 0 {
		claimed, err = s.dialect.Claim(ctx, s.db, s.table, p)
	} else {
		claimed, lost, err = sc.CompleteAndClaim(ctx, s.db, s.table, outcomes, p)
	}
	if err != nil {
		return nil, nil, s.sqlError("complete and claim", err)
	}
	return claimed, lost, nil
}
