package pgxv5_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
	"github.com/outboxgo/outbox/pgxv5"
)

// A service on pgx alone: the order and its event are written on one pgx transaction, and
// the Publisher runs on the same pool (stdlib.OpenDBFromPool, inside pgxv5.New).
func Example() {
	ctx := context.Background()
	dsn, drop := exampleDSN() // your DSN; here a schema of its own on the test server
	defer drop()

	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgxv5.New(pool, outbox.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.DB().Close() // the pool stays open

	// Once per database (or from your own goose migrations: see migrations.Versions).
	if err := migrations.Up(ctx, store.DB(), "postgres", migrations.Options{}); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, total_cents bigint)`); err != nil {
		log.Fatal(err)
	}

	// The business change and its event commit together, or not at all.
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) // a no-op after Commit
	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, total_cents) VALUES ($1, $2)`, "o-1", 4200); err != nil {
		log.Fatal(err)
	}
	if _, err := pgxv5.Enqueue(ctx, store, tx, outbox.Message{
		Namespace: "shop",
		Topic:     "order.created",
		DedupeKey: "order/o-1/created", // enqueue at most once per order
		Payload:   json.RawMessage(`{"order_id":"o-1","total_cents":4200}`),
	}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}

	// The Publisher delivers committed events; replace the function with your broker's
	// client. Here it stops after the first delivery.
	runCtx, stop := context.WithCancel(ctx)
	broker := outbox.PerMessage(func(ctx context.Context, d outbox.Delivery) error {
		fmt.Printf("publish %s: %s\n", d.Topic, d.Payload)
		stop()
		return nil
	})
	pub, err := outbox.NewPublisher(store, broker, outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "shop"}})
	if err != nil {
		log.Fatal(err)
	}
	if err := pub.Run(runCtx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// publish order.created: {"order_id":"o-1","total_cents":4200}
}
