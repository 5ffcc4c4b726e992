package main

import (
	"context"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox/internal/exampletest"
	"github.com/outboxgo/outbox/internal/testdb"
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

			require.NoError(t, placeOrder(ctx, db, ob.Store, Order{ID: 1, SKU: "book", Quantity: 2}))
			require.ErrorIs(t, placeOrder(ctx, db, ob.Store, Order{ID: 2, SKU: "book", Quantity: 2}), ErrOutOfStock)
			require.EqualValues(t, 2, ob.Enqueued(), "both orders enqueued their event")

			var ids []int64
			require.NoError(t, db.SelectContext(ctx, &ids, `SELECT id FROM orders`))
			require.Equal(t, []int64{1}, ids)
			ds := ob.Deliver(t)
			require.Len(t, ds, 1)
			require.JSONEq(t, `{"id":1,"sku":"book","quantity":2}`, string(ds[0].Payload))
		})
	}
}
