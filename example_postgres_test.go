package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/signal"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

// The quick start on PostgreSQL with the pgx driver: create the table, write an order and its
// event in one transaction, and run a Publisher until interrupted. It needs a running server,
// so it is compiled but not run by go test. lib/pq (driver "postgres", v1.11.0 or newer) works
// the same way.
func Example_postgres() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	db, err := sql.Open("pgx", "postgres://app@127.0.0.1:5432/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	// Once per database (or from your own goose migrations: see migrations.Versions).
	if err := migrations.Up(ctx, db, "postgres", migrations.Options{}); err != nil {
		log.Fatal(err)
	}
	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{})
	if err != nil {
		log.Fatal(err)
	}

	// The business change and its event commit together, or not at all.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() // a no-op after Commit
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, total_cents) VALUES ($1, $2)`, "o-1", 4200); err != nil {
		log.Fatal(err)
	}
	if _, err := store.Enqueue(ctx, tx, outbox.Message{
		Namespace:    "shop",
		Topic:        "order.created",
		DedupeKey:    "order/o-1/created", // enqueue at most once per order
		PartitionKey: "o-1",
		Headers:      outbox.Headers{"content-type": "application/json"},
		Payload:      json.RawMessage(`{"order_id":"o-1","total_cents":4200}`),
	}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	// The Publisher delivers committed events at least once; any number of them may serve
	// one table. Replace the function with a call to your broker.
	broker := outbox.PerMessage(func(ctx context.Context, d outbox.Delivery) error {
		fmt.Printf("publish %s %s attempt %d: %s\n", d.ID, d.Topic, d.Attempt, d.Payload)
		return nil // an error retries with backoff; outbox.Permanent(err) dead-letters at once
	})
	pub, err := outbox.NewPublisher(store, broker, outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "shop"}})
	if err != nil {
		log.Fatal(err)
	}
	// Run checks the table and the dialect first, then publishes until ctx ends.
	if err := pub.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
