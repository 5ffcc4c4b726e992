package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

// checkerTests check [dialect.Checker]; each is skipped, saying so, for a dialect without it.
var checkerTests = []test{
	{"ReadyTablePasses", testCheckReady},
	{"MissingTable", testCheckMissingTable},
	{"MissingColumn", testCheckMissingColumn},
	{"OtherServer", testCheckOtherServer},
	{"FirstUseOtherServer", testFirstUseOtherServer},
	{"ExplainMissingTable", testExplainMissingTable},
	{"ExplainOtherError", testExplainOtherError},
	{"ServerCheckPassesOwnServer", testServerCheckOwn},
}

// requireChecker skips when the dialect cannot check its database.
func requireChecker(t *testing.T, h Harness) {
	t.Helper()
	if _, ok := h.Dialect.(dialect.Checker); !ok {
		t.Skipf("dialect %s does not implement dialect.Checker", h.Dialect.Name())
	}
}

// misconfigured requires err to be a CheckError that matches ErrMisconfigured.
func misconfigured(t *testing.T, err error, what string) {
	t.Helper()
	var ce *outbox.CheckError
	require.ErrorAs(t, err, &ce, "%s must be reported as an *outbox.CheckError", what)
	require.ErrorIs(t, err, outbox.ErrMisconfigured, what)
	require.NotEmpty(t, ce.Problem, "%s: the error says what is wrong", what)
	require.NotEmpty(t, ce.Fix, "%s: the error says what to do", what)
}

// A table made by Up and UpOrdered passes the check, on every call.
func testCheckReady(t *testing.T, h Harness) {
	requireChecker(t, h)
	e := setup(t, h)
	require.NoError(t, e.store.Check(e.ctx))
	require.NoError(t, e.store.Check(e.ctx), "a check that passed passes again")
}

// A table that was never created is reported, and so is one that Down dropped.
func testCheckMissingTable(t *testing.T, h Harness) {
	requireChecker(t, h)
	e := setup(t, h)
	s, err := outbox.New(e.db, h.Dialect, outbox.Options{Table: "conformance_never_created"})
	require.NoError(t, err)
	misconfigured(t, s.Check(e.ctx), "a missing table")
	require.NoError(t, h.down(e.ctx, e.db, e.table))
	misconfigured(t, e.store.Check(e.ctx), "a table that Down dropped")
}

// A table without one of the columns the dialect needs is reported.
func testCheckMissingColumn(t *testing.T, h Harness) {
	requireChecker(t, h)
	e := setup(t, h)
	require.NoError(t, h.dropColumn(e.ctx, e.db, e.table), "Harness.DropColumn")
	misconfigured(t, e.store.Check(e.ctx), "a missing column")
}

// A database of another kind is reported, never taken for the dialect's own.
func testCheckOtherServer(t *testing.T, h Harness) {
	requireChecker(t, h)
	if h.OtherServer == nil {
		t.Skipf("Harness.OtherServer is nil: no database of another kind for dialect %s", h.Dialect.Name())
	}
	ctx := h.context()
	db := h.OtherServer(t)
	s, err := outbox.New(db, h.Dialect, outbox.Options{})
	require.NoError(t, err)
	misconfigured(t, s.Check(ctx), "a database of another kind")
}

// The first enqueue on a pool of another kind of database fails with the dialect's
// first-use check ([dialect.Checker] rules 2 to 4), before any insert, and every later enqueue
// of the store with it; the caller's transaction is left usable.
func testFirstUseOtherServer(t *testing.T, h Harness) {
	requireChecker(t, h)
	if h.OtherServer == nil {
		t.Skipf("Harness.OtherServer is nil: no database of another kind for dialect %s", h.Dialect.Name())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := h.OtherServer(t)
	db.SetMaxOpenConns(1) // the check must run on the caller's transaction, not a second connection
	s, err := outbox.New(db, h.Dialect, outbox.Options{})
	require.NoError(t, err)
	for i := range 2 {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }() // a failed test must not keep the pool's one connection
		_, err = s.Enqueue(ctx, tx, msg(i))
		misconfigured(t, err, "an enqueue on a database of another kind")
		var one int
		require.NoError(t, tx.QueryRowContext(ctx, `SELECT 1`).Scan(&one),
			"the first-use check leaves the caller's transaction usable (enqueue %d)", i+1)
		require.NoError(t, tx.Rollback())
	}
}

// A statement on a table that does not exist fails with a [*outbox.CheckError] that names
// the table and says what to do ([dialect.Checker] rule 6), wrapping the driver's error:
// an enqueue and a claim alike.
func testExplainMissingTable(t *testing.T, h Harness) {
	requireChecker(t, h)
	e := setup(t, h)
	const table = "conformance_never_created"
	s, err := outbox.New(e.db, h.Dialect, outbox.Options{Table: table})
	require.NoError(t, err)
	explained := func(err error, what string) {
		t.Helper()
		misconfigured(t, err, what)
		var ce *outbox.CheckError
		require.ErrorAs(t, err, &ce)
		require.Contains(t, ce.Problem+" "+ce.Fix, table, "%s: the error names the table", what)
		require.Error(t, ce.Err, "%s: the driver's error is kept", what)
	}
	_, err = s.EnqueueStandalone(e.ctx, msg(1))
	explained(err, "an enqueue into a missing table")
	_, err = s.Claim(e.ctx, outbox.ClaimOptions{Limit: 1, Lease: time.Minute, MaxAttempts: 3, WorkerID: "conformance"})
	explained(err, "a claim from a missing table")
}

// An error the dialect knows nothing about is not explained: ExplainError returns nil.
func testExplainOtherError(t *testing.T, h Harness) {
	requireChecker(t, h)
	x := h.Dialect.(dialect.Checker)
	tbl, err := dialect.NewTable(outbox.DefaultTable)
	require.NoError(t, err)
	for _, size := range []int{0, 64 << 20} {
		require.NoError(t, x.ExplainError(errors.New("conformance: an error of no database"), dialect.ExplainParams{Table: tbl, PayloadBytes: size}))
	}
	require.NoError(t, x.ExplainError(context.Canceled, dialect.ExplainParams{Table: tbl}))
}

// The dialect's own database is never refused by its server check
// ([dialect.Checker] rule 5), whether the store sends wake-ups or not.
func testServerCheckOwn(t *testing.T, h Harness) {
	requireChecker(t, h)
	sc := h.Dialect.(dialect.Checker)
	e := setup(t, h)
	tbl, err := dialect.NewTable(e.table)
	require.NoError(t, err)
	for _, notify := range []bool{false, true} {
		err := sc.CheckServer(e.ctx, e.db, tbl, dialect.ServerParams{Notify: notify})
		require.NoError(t, err, "notify=%v", notify)
	}
}
