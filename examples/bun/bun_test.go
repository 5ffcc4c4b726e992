package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/uptrace/bun"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/outboxtest/exampletest"
	"github.com/outboxgo/outbox/outboxtest/testdb"
)

// An order that commits is delivered exactly once; one that rolls back after enqueueing its
// event leaves neither the order nor the event. Passing the bun.Tx instead of tx.Tx fails
// at once, saying so.
func TestPlaceOrder(t *testing.T) {
	for _, backend := range exampletest.Backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			raw := testdb.Open(t, backend)
			ob := exampletest.New(t, raw, backend)
			db, err := openBun(raw, exampletest.Drivers[backend])
			require.NoError(t, err)
			require.NoError(t, setUpShop(ctx, db, "book", 3))
			// The bun.Tx itself is refused before any SQL runs, with the fix, and its
			// transaction stays usable.
			require.NoError(t, db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
				_, err := ob.Enqueue(ctx, tx, outbox.Message{Namespace: exampletest.Namespace, Topic: "t", Payload: []byte(`{}`)})
				var ce *outbox.CheckError
				require.ErrorAs(t, err, &ce)
				require.Contains(t, ce.Fix, "tx.Tx")
				_, err = tx.NewSelect().Model((*Order)(nil)).Count(ctx)
				return err
			}))
			require.Zero(t, ob.Enqueued())
			ob.Prove(t, exampletest.Shop{
				Place: func(id int64, n int) error {
					return placeOrder(ctx, db, ob.Store, Order{ID: id, SKU: "book", Quantity: n})
				},
				OutOfStock: ErrOutOfStock,
				Orders: func() (ids []int64, err error) {
					return ids, db.NewSelect().Model((*Order)(nil)).Column("id").Scan(ctx, &ids)
				},
			})
		})
	}
}
