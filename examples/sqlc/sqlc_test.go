package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox/examples/sqlc/shopdb"
	"github.com/outboxgo/outbox/outboxtest/exampletest"
	"github.com/outboxgo/outbox/outboxtest/testdb"
)

// An order that commits is delivered exactly once; one that rolls back after enqueueing its
// event leaves neither the order nor the event.
func TestPlaceOrder(t *testing.T) {
	ctx := context.Background()
	db := testdb.Postgres(t)
	ob := exampletest.New(t, db, "postgres")
	require.NoError(t, setUpShop(ctx, db, "book", 3))
	queries := shopdb.New(db)
	ob.Prove(t, exampletest.Shop{
		Place: func(id int64, n int) error {
			return placeOrder(ctx, db, queries, ob.Store, OrderPlaced{ID: id, SKU: "book", Quantity: int32(n)})
		},
		OutOfStock: ErrOutOfStock,
		Orders:     func() ([]int64, error) { return queries.ListOrderIDs(ctx) },
	})
}
