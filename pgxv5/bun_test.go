package pgxv5_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"

	"github.com/outboxgo/outbox"
)

// A bun.Tx satisfies outbox.Tx but formats each query itself, so the dialect's $1 would
// reach PostgreSQL without its argument. Store.Enqueue refuses it before any SQL runs, with
// an error that names the fix, and the transaction goes on; the *sql.Tx it embeds works.
func TestBunTxNamesTheFix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, outbox.Options{})
	store, err := outbox.New(e.db, outbox.Postgres(), outbox.Options{})
	require.NoError(t, err)
	bdb := bun.NewDB(e.db, pgdialect.New())

	tx, err := bdb.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	_, err = store.Enqueue(ctx, tx, msg("shop", 1))
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "pass tx.Tx")
	_, err = store.EnqueueBatch(ctx, &tx, []outbox.Message{msg("shop", 1)})
	require.ErrorContains(t, err, "pass tx.Tx", "a *bun.Tx too")

	_, err = tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES (?)`, 1)
	require.NoError(t, err, "the transaction is usable")
	res, err := store.Enqueue(ctx, tx.Tx, msg("shop", 1))
	require.NoError(t, err, "the embedded *sql.Tx works")
	require.NoError(t, tx.Commit())
	require.Equal(t, 1, e.count(t, "id = $1", res.ID))
}

// rewriting is a wrapper of the kind bun.Tx is, unknown to the library: it embeds a *sql.Tx
// and formats queries itself, sending them without their arguments.
type rewriting struct{ *sql.Tx }

func (w rewriting) ExecContext(ctx context.Context, query string, _ ...any) (sql.Result, error) {
	return w.Tx.ExecContext(ctx, query)
}

// Another wrapper that drops the arguments is caught by PostgreSQL's answer (SQLSTATE
// 42P02), which is turned into an error that says what to pass instead.
func TestRewritingWrapperNamesTheFix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, outbox.Options{})
	store, err := outbox.New(e.db, outbox.Postgres(), outbox.Options{})
	require.NoError(t, err)
	tx, err := e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	_, err = store.Enqueue(ctx, rewriting{tx}, msg("shop", 1))
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "pass the *sql.Tx it wraps")
	require.ErrorContains(t, err, "42P02", "the server's error is kept")
}
