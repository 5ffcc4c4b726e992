package conformance

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

var checkTests = []test{
	{"ReadyTablePasses", testCheckReady},
	{"MissingTable", testCheckMissingTable},
	{"MissingColumn", testCheckMissingColumn},
	{"OtherServer", testCheckOtherServer},
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
