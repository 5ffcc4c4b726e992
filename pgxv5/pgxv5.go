// Package pgxv5 enqueues outbox messages on a pgx transaction: for services that use
// github.com/jackc/pgx/v5 natively (a pgxpool.Pool, pgx.Tx, or the code sqlc generates in
// its pgx/v5 mode), whose business writes never pass through database/sql.
//
// [Enqueue] and [EnqueueBatch] do on a [pgx.Tx] what outbox.Store.Enqueue and
// EnqueueBatch do on a *sql.Tx: validation, ids, the payload hash, the store's hooks,
// dedupe keys reported in outbox.Result.Duplicate with the transaction still usable, the
// wake-ups (PostgreSQL's NOTIFY, sent when the transaction commits, and the publishers of
// the same Store in this process), and batches. The statements are the PostgreSQL
// dialect's own, rendered by it for a [dialect.Runner] and run on the transaction; no
// other dialect renders them.
//
// Everything else (the [outbox.Publisher], claims, the operations of outbox.Store) runs on
// database/sql. pgx gives a *sql.DB over the same pool with stdlib.OpenDBFromPool, so one
// pool serves both; [New] builds the Store that way:
//
//	pool, err := pgxpool.New(ctx, dsn)
//	store, err := pgxv5.New(pool, outbox.Options{})
//	pub, err := outbox.NewPublisher(store, transport, outbox.PublisherOptions{})
//	...
//	tx, err := pool.Begin(ctx)
//	defer tx.Rollback(ctx)
//	_, err = queries.WithTx(tx).CreateOrder(ctx, params) // sqlc, or tx.Exec
//	_, err = pgxv5.Enqueue(ctx, store, tx, outbox.Message{...})
//	err = tx.Commit(ctx)
//
// A publisher listens for NOTIFY on a connection of the pool it holds while it runs, so
// size the pool one connection larger than the service needs.
package pgxv5

import (
	"context"
	"errors"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

// Tx is what Enqueue writes on: the caller's open pgx transaction. [pgx.Tx] satisfies it,
// as does any type with the methods sqlc's pgx/v5 code calls (Exec and Query) and a
// transaction's Commit and Rollback. Enqueue never commits or rolls back; they are part of
// Tx so that a pgxpool.Pool or a pgx.Conn, which have neither, cannot be passed by
// accident: an event enqueued beside the business transaction would commit even when the
// business change rolls back.
type Tx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// The interfaces pgx's transactions satisfy, checked at compile time.
var _ Tx = pgx.Tx(nil)

// New returns a Store on PostgreSQL whose pool is pool, through stdlib.OpenDBFromPool: its
// Publisher, claims and operations share the pool with the service's own pgx code. Closing
// Store.DB does not close pool.
func New(pool *pgxpool.Pool, opts outbox.Options) (*outbox.Store, error) {
	if pool == nil {
		return nil, &outbox.ValidationError{Index: -1, Field: "pool", Reason: "is nil"}
	}
	return outbox.New(stdlib.OpenDBFromPool(pool), outbox.Postgres(), opts)
}

// Enqueue writes m on tx, the caller's pgx transaction, as outbox.Store.Enqueue does on a
// *sql.Tx: the row commits or rolls back with the business change. Invalid input returns
// an *outbox.ValidationError and writes nothing; a duplicate dedupe key is reported in
// Result.Duplicate and leaves tx usable. s must have a dialect that renders its statements
// (outbox.Postgres does); another returns an error matching [errors.ErrUnsupported].
func Enqueue(ctx context.Context, s *outbox.Store, tx Tx, m outbox.Message) (outbox.Result, error) {
	rs, err := EnqueueBatch(ctx, s, tx, []outbox.Message{m})
	if err != nil {
		var ve *outbox.ValidationError
		if errors.As(err, &ve) {
			ve.Index = -1 // a single message is not message 0 of a batch
		}
		return outbox.Result{}, err
	}
	return rs[0], nil
}

// EnqueueBatch writes msgs on tx in as few statements as outbox.Store.EnqueueBatch does.
// Every message is validated before any SQL runs; one invalid message fails the whole call
// with an *outbox.ValidationError naming its index, and nothing is written.
func EnqueueBatch(ctx context.Context, s *outbox.Store, tx Tx, msgs []outbox.Message) ([]outbox.Result, error) {
	if s == nil {
		return nil, &outbox.ValidationError{Index: -1, Field: "Store", Reason: "is nil"}
	}
	if tx == nil {
		return nil, &outbox.ValidationError{Index: -1, Field: "Tx", Reason: "is nil"}
	}
	return s.EnqueueOn(ctx, runner{tx}, msgs)
}

// runner runs the dialect's statements on a pgx transaction.
type runner struct{ tx Tx }

func (r runner) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := r.tx.Exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

func (r runner) QueryIDs(ctx context.Context, query string, args ...any) ([]uuid.UUID, error) {
	rows, err := r.tx.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
}

var _ dialect.Runner = runner{}
