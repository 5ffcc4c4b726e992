package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/outboxgo/outbox/outboxtest/exampletest"
	"github.com/outboxgo/outbox/outboxtest/testdb"
)

// An order that commits is delivered exactly once; one that rolls back after enqueueing its
// event leaves neither the order nor the event. With PrepareStmt too, where GORM wraps the
// transaction.
func TestPlaceOrder(t *testing.T) {
	for _, backend := range exampletest.Backends {
		for _, prepare := range []bool{false, true} {
			name := backend
			if prepare {
				name += "/PrepareStmt"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				raw := testdb.Open(t, backend)
				ob := exampletest.New(t, raw, backend)
				db, err := openGorm(raw, exampletest.Drivers[backend], prepare)
				require.NoError(t, err)
				require.NoError(t, setUpShop(ctx, db, "book", 3))
				require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
					_, wrapped := tx.Statement.ConnPool.(*gorm.PreparedStmtTX)
					require.Equal(t, prepare, wrapped, "PrepareStmt wraps the transaction")
					return nil
				}))
				ob.Prove(t, exampletest.Shop{
					Place: func(id int64, n int) error {
						return placeOrder(ctx, db, ob.Store, Order{ID: id, SKU: "book", Quantity: n})
					},
					OutOfStock: ErrOutOfStock,
					Orders: func() (ids []int64, err error) {
						return ids, db.Model(&Order{}).Pluck("id", &ids).Error
					},
				})
			})
		}
	}
}
