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
// The suite checks behaviour through the public API of package outbox, split by area:
//
//  1. Enqueue: a rolled-back transaction leaves no row, a committed one exactly one with
//     the fields as given and the payload byte for byte; every combination of the optional
//     fields, alone and in mixed batches; batches; delayed delivery.
//  2. Validation: bad input returns an error matching [outbox.ErrInvalid] and writes nothing.
//  3. Dedupe: one row per (namespace, topic, dedupe key), also under racing producers whose
//     transactions stay usable; a rolled-back winner leaves the key free.
//  4. Claim: (created_at, id) order, the claimed fields, scope filters, due times, the
//     attempt limit and burying exhausted rows.
//  5. Settle: ack, nack with jittered backoff inside its bounds, retry-after, permanent
//     errors, the attempt limit, terminal states that never move, updated_at advancing.
//     SettleAndClaim ([outbox.SettleClaimer]): outcomes recorded and the next rows claimed
//     in one call, lost leases reported, settled rows never claimed again by the same call,
//     an ordered claim seeing the keys the outcomes released. Skipped, saying so, for a
//     dialect without the ability.
//  6. Leases: an expired lease is reclaimed, the stale holder's ack/nack/extend fail with
//     [outbox.ErrLeaseLost] and change nothing; extension keeps a row.
//  7. Concurrency: many claimers never share a row; claims racing enqueues lose nothing.
//  8. Migrations: up, down, up with a custom table name.
//  9. Admin ([outbox.AdminDialect]): stats by state and topic, the dead-letter list and its
//     pages and filters, replay (only dead rows change, idempotent, the row is delivered
//     again), discard. Skipped, saying so, for a dialect without the ability.
//  10. Inspect ([outbox.InspectDialect]): dead rows grouped by last error, the error
//     filters of the dead-letter list, replay and discard of a group, delivered and dead
//     rows per minute, the lookup by dedupe key. Skipped, saying so, for a dialect without
//     the ability.
//  11. Retention ([outbox.RetentionDialect]): purge never touches pending or processing
//     rows, frees dedupe keys, runs in batches, and purgers may run at once. Skipped, saying
//     so, for a dialect without the ability.
//  12. Ordered: ordered claims per partition key take only each key's head; a retried or
//     dead head holds its key back (dead: unless skipped), a replayed one is delivered
//     first; blocked keys are reported; eight publishers with failures deliver every key in
//     enqueue order, one message of a key at a time; on a table made by the migrations
//     package without its ordered set, ordered claims, BlockedKeys and ordered publishers
//     fail with an [outbox.CheckError] that says to apply it, and work once it is applied.
//     Skipped for a dialect without [outbox.OrderedClaimer].
//
// The suite reads row counts with plain SELECT COUNT(*) on the table, so the table must be
// an ordinary table of that name. Timing uses short leases and polling with deadlines,
// never fixed sleeps.
package conformance

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

// Harness describes the dialect under test and how to get databases for it.
type Harness struct {
	// Dialect is the adapter under test.
	Dialect outbox.Dialect
	// OpenDB returns a fresh, empty database (or schema) isolated from every other call,
	// and arranges its cleanup with t.Cleanup. Tests call it in parallel.
	OpenDB func(t testing.TB) *sql.DB
	// Up creates the outbox table named table, with everything the dialect's abilities
	// need: for a dialect that implements [outbox.OrderedClaimer], what ordered claims need
	// too (the built-in dialects: the order index), or the Ordered section fails with the
	// [*outbox.CheckError] of [outbox.OrderedClaimer.CheckOrdered]. Default: the
	// migrations package for Dialect.Name(), with migrations.Options.Ordered.
	Up func(ctx context.Context, db *sql.DB, table string) error
	// Down drops the outbox table named table. Default: the migrations package.
	Down func(ctx context.Context, db *sql.DB, table string) error
	// Reopen, when set, returns another pool on the database of db, one that OpenDB
	// returned, as a second process would open it, and arranges its cleanup. Tests that
	// model publishers in separate processes use it; without it they share db.
	Reopen func(t testing.TB, db *sql.DB) *sql.DB
}

func (h *Harness) up(ctx context.Context, db *sql.DB, table string) error {
	if h.Up != nil {
		return h.Up(ctx, db, table)
	}
	return migrations.Up(ctx, db, h.Dialect.Name(), migrations.Options{Table: table, Ordered: true})
}

func (h *Harness) down(ctx context.Context, db *sql.DB, table string) error {
	if h.Down != nil {
		return h.Down(ctx, db, table)
	}
	return migrations.Down(ctx, db, h.Dialect.Name(), migrations.Options{Table: table})
}

// Run runs the whole suite. Subtests run in parallel, each on its own database.
func Run(t *testing.T, h Harness) {
	if h.Dialect == nil || h.OpenDB == nil {
		t.Fatal("conformance: Harness needs Dialect and OpenDB")
	}
	areas := []struct {
		name  string
		tests []test
	}{
		{"Enqueue", enqueueTests},
		{"Validation", validationTests},
		{"Dedupe", dedupeTests},
		{"Claim", claimTests},
		{"Settle", settleTests},
		{"SettleAndClaim", settleClaimTests},
		{"Lease", leaseTests},
		{"Concurrency", concurrencyTests},
		{"Ordered", orderedTests},
		{"Migrations", migrationTests},
		{"Admin", adminTests},
		{"Inspect", inspectTests},
		{"Retention", retentionTests},
	}
	for _, a := range areas {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			for _, tc := range a.tests {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					tc.run(t, h)
				})
			}
		})
	}
}

type test struct {
	name string
	run  func(t *testing.T, h Harness)
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
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
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
	q := `SELECT COUNT(*) FROM ` + e.table
	var args []any
	if len(status) == 1 {
		// A literal, not a placeholder: placeholder syntax differs between databases and
		// the value is one of four constants.
		q += ` WHERE status = '` + string(status[0]) + `'`
	}
	var n int
	require.NoError(t, e.db.QueryRowContext(e.ctx, q, args...).Scan(&n))
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
