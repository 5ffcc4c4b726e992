// Package conformance proves an [outbox.Dialect] against the rules of the outbox: the same
// suite runs for the built-in dialects and for anyone's own. Call [Run] from a test:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conformance.Harness{
//			Dialect: mydialect.New(),
//			OpenDB:  func(t testing.TB) *sql.DB { return openFreshDatabase(t) },
//		})
//	}
//
// The suite checks behaviour through the public API of package outbox, in one section per
// interface of the dialect contract (package dialect): the eight areas of [dialect.Dialect],
// then one section per optional ability, named after it. Each section below names every
// test it runs (a test of this package keeps the list complete); a failing test is reported
// as Section/Test, with its section's number.
//
//  1. Enqueue ([dialect.Dialect] rule 3): a rolled-back transaction leaves no row, a
//     committed one exactly one with the fields as given and the payload byte for byte;
//     every combination of the optional fields, alone and in mixed batches; batches;
//     delayed delivery; Store.EnqueueStandalone; Get of a missing id; rows inserted
//     leased to a log reader (outbox.Options.LogLease), where the dialect can. Tests:
//     RollbackLeavesNoRow, CommitLeavesExactlyOne, PayloadByteExact, Batch,
//     OptionalFieldCombinations, DelayedDelivery, Standalone, GetNotFound, InsertLeased.
//  2. Validation: bad input returns an error matching [outbox.ErrInvalid] and writes
//     nothing. Tests: BadMessages, BadBatchWritesNothing, BadTableName, BadOptions.
//  3. Dedupe: one row per (namespace, topic, dedupe key), also under racing producers whose
//     transactions stay usable; a rolled-back winner leaves the key free; keys compare byte
//     for byte. Tests: SecondIsAlreadyEnqueued, RacingProducers, RolledBackWinnerFreesKey,
//     RacingProducersWinnerRollsBack, ScopedByNamespaceAndTopic, BytewiseKeys,
//     WithinOneBatch.
//  4. Claim (rules 4, 7, 11, 12): due order (next_attempt_at, then id), also where the ids'
//     order differs (Dialect.Claim itself, not only the Store), delayed and retried rows after
//     those due before them, the claimed fields and their UTC times, scope filters, the
//     attempt limit, burying exhausted rows, damaged rows that fail only themselves. Tests:
//     Order, OrderIsNotIDOrder, DueOrder, Fields, Scope,
//     EmptyIsNotAnError, AttemptLimitExcludes, BuryExhausted, BuryExpiredExhausted,
//     BuryRespectsScope, ExpiredLeaseAtLimitIsNotReclaimed, DamagedRowsFailOnlyThemselves.
//  5. Settle (rules 5 and 10): ack, nack with jittered backoff inside its bounds,
//     retry-after, permanent errors, the attempt limit, terminal states that never move,
//     updated_at advancing, also for changes within one tick of the database clock, and
//     the attempt an unavailable destination gives back. Tests: Ack,
//     AckReportsOnlyLostRows, NackBackoffWithinJitterBounds, NackRetryAfter, NackPermanent,
//     AttemptLimitLeadsToDead, MixedBatchInOneCall, TerminalStatesNeverMove,
//     UpdatedAtAdvances, UpdatedAtAdvancesWithinATick, UnavailableRefundsAttempt,
//     UnavailableNeverDies.
//  6. Lease (rule 6): an expired lease is reclaimed, the stale holder's ack/nack/extend
//     fail with [outbox.ErrLeaseLost] and change nothing; extension keeps a row. Tests:
//     ExpiredLeaseIsReclaimed, ExpiredButUnclaimedCanStillAck, ExtendKeepsTheRow.
//  7. Concurrency (rules 4 and 9): many claimers never share a row; claims racing enqueues
//     lose nothing; every call works on a pool of one connection. Tests: NoDoubleClaim,
//     ClaimsRacingEnqueues, OneConnectionPool.
//  8. Migrations: up, down, up with a custom table name, through [Harness.Up],
//     [Harness.UpOrdered] and [Harness.Down]. Tests: UpDownUpWithCustomTable.
//  9. Checker ([dialect.Checker]): a ready table passes; a missing table, a missing column
//     and a database of another kind are each reported as an [*outbox.CheckError], also by
//     the first enqueue, which leaves the caller's transaction usable; a missing table's
//     error names it and says what to do; other errors are not explained; the dialect's own
//     server passes its server check. Tests: ReadyTablePasses, MissingTable, MissingColumn,
//     OtherServer, FirstUseOtherServer, ExplainMissingTable, ExplainOtherError,
//     ServerCheckPassesOwnServer.
//  10. Admin ([dialect.Admin]): stats by state and topic, the oldest pending and undelivered
//     ages (a delayed row never claimed has none), a delivered sample smaller than the
//     delivered rows (its window and the dialect's estimate of them), the dead-letter list
//     and its pages and filters, replay (only dead rows change, idempotent, the row is
//     delivered again), discard; dead rows grouped by last error and by cause, the error
//     filters, replay and discard by error, delivered and dead rows per minute, the lookup
//     by dedupe key; purge never touches pending or processing rows, frees dedupe keys,
//     runs in batches, and purgers may run at once. Tests: StatsCounts,
//     StatsOldestPendingAge, StatsDeliveredSample, ListDeadPages, ListDeadFilters,
//     ReplayOnlyDeadRows, ReplayedRowIsDelivered, ReplayWhere, DiscardOnlyDeadRows,
//     Validation, DeadGroups, DeadCauses, ErrorFilters, ReplayAndDiscardWhereByError,
//     Activity, GetByDedupeKey, InspectValidation, PurgeNeverTouchesLiveRows,
//     PurgeInBatches, PurgeConcurrently.
//  11. Notifier ([dialect.Notifier]): a listener reports ready, a committed enqueue wakes
//     it with its namespace, a rolled-back one wakes nobody, several in one transaction
//     wake it only at commit; signals stay within their table and database; Listen returns
//     when its context ends and closes its connection, never giving it back to the pool; a
//     publisher that polls once a minute delivers within seconds an event enqueued through
//     another pool, and one enqueued by another process (the test binary run again, with
//     [Harness.DSN]); with [Harness.ListenDB], the listeners and the section's publishers
//     listen on the pool it returns. Skipped, saying so, for a driver that cannot listen. Tests:
//     CommitWakes, RollbackWakesNobody, BatchWakesAfterCommit, OtherTableWakesNobody,
//     OtherDatabaseWakesNobody, ListenReturnsOnCancel, ListenClosesItsConnection,
//     PublisherWokenAcrossPools, PublisherWokenAcrossProcesses.
//  12. OrderedClaimer ([dialect.OrderedClaimer]): ordered claims per partition key take
//     only each key's head; a retried or dead head holds its key back (dead: unless
//     skipped), a replayed one is delivered first; blocked keys are reported; eight
//     publishers with failures deliver every key in enqueue order, one message of a key at
//     a time; on a table made by [Harness.Up] without [Harness.UpOrdered], ordered claims,
//     BlockedKeys and ordered publishers fail with an [outbox.CheckError] (with the
//     built-in migrations: one that says to apply the ordered set), and work once UpOrdered
//     ran. With [outbox.ClaimOptions.Runs] (skipped for a dialect that claims heads only),
//     a key's waiting rows come back with its head, in sequence, within Limit across the
//     keys, stopping at a row in flight, a dead row (passed over with OrderedSkipDead) and
//     a row not due; a hot key fills what cold keys leave of the batch; with RunShare a
//     claim takes its share of the keys, never none of a lone key (skipped for a dialect
//     that ignores it); concurrent claimers never hold rows of one key at once; settling a
//     run and claiming in one call returns the key's next run; with Continue (skipped for
//     a dialect that ignores it) that call takes the delivered keys' next runs before an
//     older head of another key, never continues a key with a row put back or a lease
//     lost, and, when the continued runs leave the batch short, takes other keys' heads
//     without the continued rows again. Tests:
//     HeadOnly, RetryHoldsKey, DeadHeadBlocks, SkipDead, HeadsBeyondBacklog, Publishers,
//     NeedsOrderedMigrations, RunsInSequence, RunsLimit, RunsFillBatch, RunsShare,
//     RunsStopAtInFlight, RunsStopAtDead, RunsStopAtNotDue, RunsConcurrent,
//     RunsSettleAndClaim, RunsContinue, RunsContinueOnlyDelivered, RunsContinueNotLost,
//     RunsContinueThenHeads.
//  13. SettleClaimer ([dialect.SettleClaimer]): outcomes recorded and the next rows
//     claimed in one call, lost leases reported, settled rows never claimed again by the
//     same call, an ordered claim seeing the keys the outcomes released, the attempt an
//     unavailable destination gives back, a retry claimed again in the same call with
//     updated_at advanced past the settle. Tests: SettlesAndClaimsNext, MixedOutcomes,
//     ExpiredLeaseNotReclaimed, NothingLeftToClaim, OrderedSeesReleasedKeys,
//     UnavailableRefundsAttempt, RetryClaimedAgainAdvances.
//
// A section of an ability (9 to 13) is skipped, saying so, for a dialect without the
// ability, and a test that needs a method the dialect reports as unsupported
// ([errors.ErrUnsupported]) or a [Harness] hook that is not set is skipped, saying so:
// run the suite with -v and read the skips.
//
// The suite reads and damages the table only through the [Harness] hooks, whose defaults
// fit the built-in schemas. Timing uses short leases and polling with deadlines, never
// fixed sleeps.
package conformance

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/migrations"
)

// Harness describes the dialect under test and how to get databases for it. Only Dialect
// and OpenDB are required. The hooks that touch the table directly (Up, UpOrdered, Down,
// Count, Corrupt, DropColumn) default to the built-in schema of the dialect named by
// Dialect.Name() (the migrations package); a dialect with a schema of its own sets them
// all, so that the suite asks the dialect's author, never guesses column names, types or
// placeholders.
type Harness struct {
	// Dialect is the adapter under test.
	Dialect outbox.Dialect
	// OpenDB returns a fresh, empty database (or schema) isolated from every other call,
	// and arranges its cleanup with t.Cleanup. Tests call it in parallel.
	OpenDB func(t testing.TB) *sql.DB
	// Up creates the outbox table named table with everything the dialect needs except
	// what only ordered claims need (the base migration set). Running it again is a no-op.
	// Default: migrations.Up for Dialect.Name().
	Up func(ctx context.Context, db *sql.DB, table string) error
	// UpOrdered adds to a table made by Up what ordered claims need (the ordered migration
	// set; the built-in dialects: the order index), so that [dialect.OrderedClaimer.CheckOrdered]
	// passes. The suite runs it after Up for every test, and checks that ordered claims
	// refuse a table that has had only Up. Required with Up when the dialect implements
	// [dialect.OrderedClaimer]; default: migrations.Up with migrations.Options.Ordered.
	UpOrdered func(ctx context.Context, db *sql.DB, table string) error
	// Down drops the outbox table named table and whatever Up and UpOrdered made for it.
	// Default: migrations.Down.
	Down func(ctx context.Context, db *sql.DB, table string) error
	// Count returns how many rows the table holds, only those of status when status is not
	// "". Default: SELECT COUNT(*), with status stored as its text.
	Count func(ctx context.Context, db *sql.DB, table string, status outbox.Status) (int, error)
	// Corrupt damages one stored value of the row id, as a hand edit of the table would:
	// column is "payload" (a valid JSON payload other than the one enqueued, so that it no
	// longer matches its hash) or "headers" (a value that the dialect cannot decode into
	// [outbox.Headers], such as the JSON object {"retries":3}). Default: an UPDATE of the
	// built-in schema.
	Corrupt func(ctx context.Context, db *sql.DB, table string, id uuid.UUID, column string) error
	// DropColumn removes from the table one column that the dialect needs, as an older or
	// half-applied migration would leave it, so that the suite can check that
	// [dialect.Checker] reports it. Default: ALTER TABLE ... DROP COLUMN replays.
	DropColumn func(ctx context.Context, db *sql.DB, table string) error
	// OtherServer returns a fresh database of another kind than the dialect is written for
	// (MySQL or SQLite for a PostgreSQL dialect, say), through any driver, and arranges its
	// cleanup, so that the suite can check that [dialect.Checker] refuses it. A file of
	// SQLite (modernc.org/sqlite needs no server) does. Nil skips that one check.
	OtherServer func(t testing.TB) *sql.DB
	// Reopen, when set, returns another pool on the database of db, one that OpenDB
	// returned, as a second process would open it, and arranges its cleanup. Tests that
	// model publishers in separate processes use it; without it they share db.
	Reopen func(t testing.TB, db *sql.DB) *sql.DB
	// DSN, when set, returns the driver name and the data source name with which
	// sql.Open, in another process, opens the database of db, one that OpenDB returned.
	// The Notifier section's cross-process test runs the test binary again as a producer
	// with them: the binary must register the driver (import it), as the test's own
	// process does. Without DSN that test is skipped, saying so.
	DSN func(t testing.TB, db *sql.DB) (driverName, dataSourceName string)

	// ListenDB, when set, returns the pool that listeners for db, one that OpenDB or Reopen
	// returned, take their connection from: a pool straight to the database server when db
	// goes through a transaction-pooling proxy, where LISTEN hears nothing. The Notifier
	// section passes it to Listen, and to its publishers as outbox.Options.ListenDB. Default
	// db itself.
	ListenDB func(t testing.TB, db *sql.DB) *sql.DB
	// ctx is the context of one test's calls, set by Run: it ends at the test's deadline.
	ctx context.Context
}

// context returns the context of the test's calls.
func (h *Harness) context() context.Context {
	if h.ctx == nil {
		return context.Background()
	}
	return h.ctx
}

// listenDB returns the pool that listeners for db use (see ListenDB).
func (h *Harness) listenDB(t testing.TB, db *sql.DB) *sql.DB {
	if h.ListenDB == nil {
		return db
	}
	return h.ListenDB(t, db)
}

// upBase creates the table without what ordered claims need.
func (h *Harness) upBase(ctx context.Context, db *sql.DB, table string) error {
	if h.Up != nil {
		return h.Up(ctx, db, table)
	}
	return migrations.Up(ctx, db, h.Dialect.Name(), migrations.Options{Table: table})
}

// upOrdered adds what ordered claims need to a table made by upBase.
func (h *Harness) upOrdered(ctx context.Context, db *sql.DB, table string) error {
	if h.UpOrdered != nil {
		return h.UpOrdered(ctx, db, table)
	}
	if h.Up != nil {
		return nil // Run refused an OrderedClaimer without UpOrdered
	}
	return migrations.Up(ctx, db, h.Dialect.Name(), migrations.Options{Table: table, Ordered: true})
}

// up creates the table with everything the dialect's abilities need.
func (h *Harness) up(ctx context.Context, db *sql.DB, table string) error {
	if err := h.upBase(ctx, db, table); err != nil {
		return err
	}
	return h.upOrdered(ctx, db, table)
}

func (h *Harness) down(ctx context.Context, db *sql.DB, table string) error {
	if h.Down != nil {
		return h.Down(ctx, db, table)
	}
	return migrations.Down(ctx, db, h.Dialect.Name(), migrations.Options{Table: table})
}

func (h *Harness) countRows(ctx context.Context, db *sql.DB, table string, status outbox.Status) (int, error) {
	if h.Count != nil {
		return h.Count(ctx, db, table, status)
	}
	q := `SELECT COUNT(*) FROM ` + table
	if status != "" {
		// A literal, not a placeholder: placeholder syntax differs between databases and
		// the value is one of four constants.
		q += ` WHERE status = '` + string(status) + `'`
	}
	var n int
	err := db.QueryRowContext(ctx, q).Scan(&n)
	return n, err
}

func (h *Harness) corrupt(ctx context.Context, db *sql.DB, table string, id uuid.UUID, column string) error {
	if h.Corrupt != nil {
		return h.Corrupt(ctx, db, table, id, column)
	}
	// The built-in schemas store ids as uuid (PostgreSQL) or 16 bytes (MySQL, SQLite);
	// literals keep the statement free of placeholder syntax.
	idLit := "X'" + hex.EncodeToString(id[:]) + "'"
	if h.Dialect.Name() == "postgres" {
		idLit = "'" + id.String() + "'"
	}
	var set string
	switch column {
	case "headers":
		set = `headers = '{"retries":3}'`
	case "payload":
		set = `payload = '{"n":666}'`
	default:
		return fmt.Errorf("conformance: cannot corrupt column %q", column)
	}
	_, err := db.ExecContext(ctx, `UPDATE `+table+` SET `+set+` WHERE id = `+idLit)
	return err
}

func (h *Harness) dropColumn(ctx context.Context, db *sql.DB, table string) error {
	if h.DropColumn != nil {
		return h.DropColumn(ctx, db, table)
	}
	_, err := db.ExecContext(ctx, `ALTER TABLE `+table+` DROP COLUMN replays`)
	return err
}

// Run runs the whole suite. Subtests run in parallel, each on its own database.
//
// Every test runs under a deadline (three minutes; nine for Ordered/Publishers): the
// context of its calls ends there, and a test still running then fails with a message that
// names it and its section of the list above. A test that does not return even once its
// context has ended (a call that ignores its context) stops the test binary 30 seconds
// later, with the same message, so that a dialect that hangs fails in bounded time instead
// of at go test's own timeout.
func Run(t *testing.T, h Harness) {
	if h.Dialect == nil || h.OpenDB == nil {
		t.Fatal("conformance: Harness needs Dialect and OpenDB")
	}
	if _, ok := h.Dialect.(dialect.OrderedClaimer); ok && h.Up != nil && h.UpOrdered == nil {
		t.Fatal("conformance: the dialect implements dialect.OrderedClaimer and Harness.Up is set: set Harness.UpOrdered too")
	}
	for _, a := range areas {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			for _, tc := range a.tests {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					limit := cmp.Or(deadlines[a.name+"/"+tc.name], testDeadline)
					ctx, stop := watch(t, fmt.Sprintf("%s/%s (section %d, %s)", a.name, tc.name, a.section, a.name), limit)
					defer stop()
					h := h
					h.ctx = ctx
					tc.run(t, h)
				})
			}
		})
	}
}

// areas are the sections of the suite, in the order Run starts them (the slowest first),
// each with its number in the package comment's list.
var areas = []struct {
	name    string
	section int
	tests   []test
}{
	{"Enqueue", 1, enqueueTests},
	{"Validation", 2, validationTests},
	{"Dedupe", 3, dedupeTests},
	{"Claim", 4, claimTests},
	{"Settle", 5, settleTests},
	{"SettleClaimer", 13, settleClaimTests},
	{"Lease", 6, leaseTests},
	{"Concurrency", 7, concurrencyTests},
	{"OrderedClaimer", 12, orderedTests},
	{"Migrations", 8, migrationTests},
	{"Checker", 9, checkerTests},
	{"Admin", 10, adminTests},
	{"Notifier", 11, notifyTests},
}

// testDeadline is how long one conformance test may run, from when it starts (after
// waiting for its turn among the parallel tests) until it returns. The slowest tests of a
// built-in dialect take seconds, and about a minute under the race detector.
const testDeadline = 3 * time.Minute

// grace is how long a test may go on after its deadline, its context ended, before Run
// stops the test binary.
const grace = 30 * time.Second

// watch returns the context of one test's calls, which ends after limit, and a stop
// function that the test defers. A test still running at the deadline fails, naming what;
// one still running grace later panics, which ends the test binary with the same words.
func watch(t *testing.T, what string, limit time.Duration) (context.Context, func()) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	var (
		mu       sync.Mutex
		finished bool
	)
	done := make(chan struct{})
	go func() {
		timer := time.NewTimer(limit)
		defer timer.Stop()
		select {
		case <-done:
			return
		case <-timer.C:
		}
		msg := fmt.Sprintf("conformance: %s did not finish within its deadline of %s: the dialect hangs "+
			"(a claim that waits on locks it never gets, a call that ignores its context, a row never delivered)", what, limit)
		mu.Lock()
		if !finished {
			t.Error(msg) // t.Error, not t.Fatal: this is not the test's goroutine
		}
		mu.Unlock()
		select {
		case <-done:
		case <-time.After(grace):
			panic(msg + fmt.Sprintf("; it did not return within %s of its context ending either", grace))
		}
	}()
	return ctx, func() {
		mu.Lock()
		finished = true
		mu.Unlock()
		close(done)
		cancel()
	}
}

type test struct {
	name string
	run  func(t *testing.T, h Harness)
}

// deadlines are the tests that may run longer than testDeadline, by area/name.
var deadlines = map[string]time.Duration{
	"OrderedClaimer/Publishers": orderedDeadline + time.Minute,
}

// env is what one test works with: a fresh database with the outbox table, and a store.
type env struct {
	ctx   context.Context
	db    *sql.DB
	store *outbox.Store
	table string
	h     Harness
}

// setup opens a fresh database, migrates the table and returns a store on it.
func setup(t *testing.T, h Harness, opts ...outbox.Options) *env {
	t.Helper()
	ctx := h.context()
	var o outbox.Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.Table == "" {
		o.Table = outbox.DefaultTable
	}
	db := h.OpenDB(t)
	require.NoError(t, h.up(ctx, db, o.Table), "migrate up")
	s, err := outbox.New(db, h.Dialect, o)
	require.NoError(t, err)
	return &env{ctx: ctx, db: db, store: s, table: o.Table, h: h}
}

// msg returns a valid message whose payload records i.
func msg(i int) outbox.Message {
	return outbox.Message{
		Namespace: "orders",
		Topic:     "order.created",
		Payload:   json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)),
	}
}

// enqueue commits msgs in one transaction and returns their results.
func (e *env) enqueue(t *testing.T, msgs ...outbox.Message) []outbox.Result {
	t.Helper()
	tx, err := e.db.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	res, err := e.store.EnqueueBatch(e.ctx, tx, msgs)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	return res
}

// enqueueN commits n messages, one transaction each, and returns their ids in order.
func (e *env) enqueueN(t *testing.T, n int) []uuid.UUID {
	t.Helper()
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = e.enqueue(t, msg(i))[0].ID
	}
	return ids
}

// count returns the number of rows, optionally with the given status.
func (e *env) count(t *testing.T, status ...outbox.Status) int {
	t.Helper()
	var st outbox.Status
	if len(status) == 1 {
		st = status[0]
	}
	n, err := e.h.countRows(e.ctx, e.db, e.table, st)
	require.NoError(t, err, "Harness.Count")
	return n
}

// get reads a row and fails the test if it is missing.
func (e *env) get(t *testing.T, id uuid.UUID) outbox.Record {
	t.Helper()
	r, err := e.store.Get(e.ctx, id)
	require.NoError(t, err)
	return r
}

// claimOpts are the claim options most tests use.
func claimOpts(limit int, lease time.Duration) outbox.ClaimOptions {
	return outbox.ClaimOptions{Limit: limit, Lease: lease, MaxAttempts: 5, WorkerID: "worker-a"}
}

func (e *env) claim(t *testing.T, o outbox.ClaimOptions) []outbox.Record {
	t.Helper()
	recs, err := e.store.Claim(e.ctx, o)
	require.NoError(t, err)
	return recs
}

func ids(recs []outbox.Record) []uuid.UUID {
	out := make([]uuid.UUID, len(recs))
	for i, r := range recs {
		out[i] = r.ID
	}
	return out
}

// eventually polls cond every 20ms until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
