package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/migrations"
)

// backend is one database server (or file) under test: how to get a fresh database on it,
// how to count its commits, and the hand-written SQL of the raw baselines.
type backend interface {
	name() string
	// dialect is the library's dialect for the backend.
	dialect() outbox.Dialect
	// setup reaches the server, creates a fresh database with the outbox table (by
	// migrations.Up, so library and raw write the identical table) and the business table.
	// An error means the backend is skipped.
	setup(ctx context.Context) error
	// teardown drops what setup created.
	teardown()
	describe(ctx context.Context) serverInfo
	// admin is a small pool on the bench database for setup work outside measured windows.
	admin() *sql.DB
	// childDSN is the driver name and DSN of the bench database, for a child process.
	childDSN() (driver, dsn string)
	// pool opens a new pool on the bench database whose connections count transactions.
	pool(maxConns int) (*sql.DB, *txCounter, error)
	// reset empties table and the business table.
	reset(ctx context.Context, table string) error
	// maintain refreshes statistics and reclaims dead rows after a bulk change (VACUUM
	// ANALYZE, ANALYZE TABLE), so that library and raw runs start from the same state.
	maintain(ctx context.Context, table string) error
	// countStart begins a measured window: it makes sure nothing else runs on the bench
	// database and reads the server's counters. The returned function, called after the run
	// with the run's pool, closes that pool and returns the commits of the window.
	countStart(ctx context.Context) (func(ctx context.Context, db *sql.DB, c *txCounter) (commitCount, error), error)
	// raw returns the hand-written SQL for table.
	raw(table string) rawOps
	// loadRetained bulk-loads n delivered rows into table, server-side where possible.
	loadRetained(ctx context.Context, table string, n int) error
	// loadPending bulk-loads n pending rows into table, server-side where possible, due
	// from due on, spread evenly over spread (0: all at due).
	loadPending(ctx context.Context, table string, n int, due time.Time, spread time.Duration) error
	// dropIndex drops one secondary index of the library's table (after migrate): "dedupe"
	// or "retention". An index the backend does not have on the outbox table returns
	// errors.ErrUnsupported.
	dropIndex(ctx context.Context, table, index string) error
	// createLean creates table in the lean shape of the table-cost scenario (tablecost.go)
	// and returns its hand-written SQL.
	createLean(ctx context.Context, table string) (relay, error)
}

// relay is the hand-written SQL of one table's hot path: what a producer and a relay loop
// send. The library's table has it (rawOps), and so has the lean table of the table-cost
// scenario.
type relay interface {
	// insertOne inserts one outbox row, as a careful hand-written producer would.
	insertOne(ctx context.Context, tx *sql.Tx, r *rawRow) error
	// insertForms names the multi-row insert forms: hand-written ones, the fastest of which
	// is the baseline of batch enqueue, and diagnostic ones (the library's statement shape
	// written by hand) that split a gap into SQL cost and client cost.
	insertForms() []insertForm
	insertMany(ctx context.Context, q dialect.DBTX, form string, rows []rawRow) error
	// claim leases up to limit pending rows in one statement (one short transaction on
	// MySQL) and reads what a transport needs.
	claim(ctx context.Context, db *sql.DB, limit int, worker string) (rawClaim, error)
	// ack marks claimed rows delivered with one statement; ids are in the form claim
	// returns.
	ack(ctx context.Context, db *sql.DB, ids []any) error
}

// rawOps is the hand-written SQL of the baselines for one table of the library's shape.
type rawOps interface {
	relay
	// insertBusiness inserts the i-th business row (also used by library runs).
	insertBusiness(ctx context.Context, tx *sql.Tx, i int) error
	// ackGuarded is ack with the library's safety: only rows still processing under the
	// claim's token change, and it reports how many did. It is what a library fast path for
	// a batch of one outcome and one token could send.
	ackGuarded(ctx context.Context, db *sql.DB, ids []any, token uuid.UUID) (int, error)
	// claimFull is claim returning every column a publisher needs (fullColumns), with
	// each payload checked against its hash: the guarded raw loop's claim (guarded.go).
	claimFull(ctx context.Context, db *sql.DB, limit int, worker string) (rawClaim, error)
	// idArg converts a library id to the form claim returns; leaseOf the reverse.
	idArg(id uuid.UUID) any
	leaseOf(id any, token uuid.UUID) outbox.Lease
}

// insertForm is one multi-row INSERT form.
type insertForm struct {
	name       string
	diagnostic bool
}

// rawClaim is what one raw claim returned.
type rawClaim struct {
	ids   []any
	token uuid.UUID
	msgs  []rawMsg
}

// claimAck is one step of the raw relay: claim, a no-op publish, one batched ack.
func claimAck(ctx context.Context, r relay, db *sql.DB, limit int, worker string) (int, error) {
	c, err := r.claim(ctx, db, limit, worker)
	if err != nil || len(c.ids) == 0 {
		return 0, err
	}
	return len(c.ids), r.ack(ctx, db, c.ids)
}

// claimPublishAck is claimAck with a publish that takes publish between the claim and the
// ack, as a hand-written relay's call to its broker.
func claimPublishAck(ctx context.Context, r relay, db *sql.DB, limit int, worker string, publish time.Duration) (int, error) {
	c, err := r.claim(ctx, db, limit, worker)
	if err != nil || len(c.ids) == 0 {
		return 0, err
	}
	time.Sleep(publish)
	return len(c.ids), r.ack(ctx, db, c.ids)
}

// bestForms returns the names of the non-diagnostic forms.
func bestForms(r relay) []string {
	var out []string
	for _, f := range r.insertForms() {
		if !f.diagnostic {
			out = append(out, f.name)
		}
	}
	return out
}

// serverInfo describes a database server and its durability settings.
type serverInfo struct {
	Version    string            `json:"version"`
	Settings   map[string]string `json:"settings"`
	Durability string            `json:"durability"`
	Connection string            `json:"connection"`
}

func newBackend(name, pgDSN, myDSN string) (backend, error) {
	switch name {
	case "postgres":
		return &pgBackend{dsn: pgDSN}, nil
	case "mysql":
		return &myBackend{dsn: myDSN}, nil
	case "sqlite":
		return &liteBackend{}, nil
	}
	return nil, fmt.Errorf("unknown backend %q (postgres, mysql, sqlite)", name)
}

func randomName() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return "outbox_bench_" + hex.EncodeToString(b)
}

// migrate creates table with the library's own migrations, without the ordered set: the
// table every user gets.
func migrate(ctx context.Context, db *sql.DB, dialect, table string) error {
	return migrations.Up(ctx, db, dialect, migrations.Options{Table: table})
}

// migrateOrdered creates table with the library's own migrations and the ordered set (the
// order index), as a user of ordered publishers migrates it.
func migrateOrdered(ctx context.Context, db *sql.DB, dialect, table string) error {
	return migrations.Up(ctx, db, dialect, migrations.Options{Table: table, Ordered: true})
}

// countStatus returns how many of table's rows are delivered, and how many there are.
func countStatus(ctx context.Context, db *sql.DB, table string) (delivered, total int64, err error) {
	var d sql.NullInt64
	err = db.QueryRowContext(ctx, "SELECT SUM(CASE WHEN status = 'delivered' THEN 1 ELSE 0 END), COUNT(*) FROM "+table).Scan(&d, &total)
	return d.Int64, total, err
}
