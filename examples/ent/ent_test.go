package main

import (
	"context"
	"database/sql"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox/examples/ent/ent/order"
	"github.com/outboxgo/outbox/outboxtest/exampletest"
	"github.com/outboxgo/outbox/outboxtest/testdb"
)

// schemaMu serialises the backends' ent migrations, which run side by side otherwise: ent's
// Schema.Create writes package-level state of the generated tables (a data race under the
// race detector when two run at once).
var schemaMu sync.Mutex

// An order that commits is delivered exactly once; one that rolls back after enqueueing its
// event leaves neither the order nor the event.
func TestPlaceOrder(t *testing.T) {
	for _, backend := range exampletest.Backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.Open(t, backend)
			if backend == "sqlite" { // ent's migration wants foreign keys on
				var err error
				db, err = sql.Open("sqlite", testdb.DSN(t, backend, db)+"&_pragma=foreign_keys(1)")
				require.NoError(t, err)
				t.Cleanup(func() { _ = db.Close() })
			}
			ob := exampletest.New(t, db, backend)
			shop, err := openShop(db, exampletest.Drivers[backend])
			require.NoError(t, err)
			schemaMu.Lock() // ent's migration writes package-level table state: one at a time
			err = shop.setUp(ctx, "book", 3)
			schemaMu.Unlock()
			require.NoError(t, err)
			ob.Prove(t, exampletest.Shop{
				Place: func(id int64, n int) error {
					return shop.placeOrder(ctx, ob.Store, OrderPlaced{ID: id, SKU: "book", Quantity: n})
				},
				OutOfStock: ErrOutOfStock,
				Orders: func() ([]int64, error) {
					return shop.client.Order.Query().Order(order.ByID()).IDs(ctx)
				},
			})
		})
	}
}
