package main

import (
	"context"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox/outboxtest/exampletest"
	"github.com/outboxgo/outbox/outboxtest/testdb"
)

// An order that commits is delivered exactly once; one that rolls back after enqueueing its
// event leaves neither the order nor the event.
func TestPlaceOrder(t *testing.T) {
	for _, backend := range exampletest.Backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			raw := testdb.Open(t, backend)
			ob := exampletest.New(t, raw, backend)
			db := sqlx.NewDb(raw, exampletest.Drivers[backend])
			require.NoError(t, setUpShop(ctx, db, "book", 3))
			ob.Prove(t, exampletest.Shop{
				Place: func(id int64, n int) error {
					return placeOrder(ctx, db, ob.Store, Order{ID: id, SKU: "book", Quantity: n})
				},
				OutOfStock: ErrOutOfStock,
				Orders: func() (ids []int64, err error) {
					return ids, db.SelectContext(ctx, &ids, `SELECT id FROM orders`)
				},
			})
		})
	}
}
