package main

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/outboxtest/exampletest"
	"github.com/outboxgo/outbox/outboxtest/testdb"
	"github.com/outboxgo/outbox/pgxv5"
)

// An order that commits is delivered exactly once; one that rolls back after enqueueing its
// event leaves neither the order nor the event. The Store and its Publisher run on the
// service's pgx pool.
func TestPlaceOrder(t *testing.T) {
	ctx := context.Background()
	db := testdb.Postgres(t)
	pool, err := pgxpool.New(ctx, testdb.DSN(t, "postgres", db)) // the same schema
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	ob := exampletest.Open(t, db, "postgres", func(opts outbox.Options) (*outbox.Store, error) {
		return pgxv5.New(pool, opts)
	})
	require.NoError(t, setUpShop(ctx, pool, "book", 3))
	ob.Prove(t, exampletest.Shop{
		Place: func(id int64, n int) error {
			return placeOrder(ctx, pool, ob.Store, Order{ID: id, SKU: "book", Quantity: n})
		},
		OutOfStock: ErrOutOfStock,
		Orders: func() ([]int64, error) {
			rows, err := pool.Query(ctx, `SELECT id FROM orders ORDER BY id`)
			if err != nil {
				return nil, err
			}
			return pgx.CollectRows(rows, pgx.RowTo[int64])
		},
	})
}
