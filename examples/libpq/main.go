// Command libpq shows the outbox on PostgreSQL through the lib/pq driver
// (github.com/lib/pq): it creates the table, enqueues an event in the same transaction as a
// business row, and runs a Publisher that prints what it delivers until interrupted.
//
//	go run . -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"

	_ "github.com/lib/pq" // registers the "postgres" driver

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

func main() {
	dsn := flag.String("dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL connection URL")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *dsn); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, dsn string) error {
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := migrations.Up(ctx, db, "postgres", migrations.Options{}); err != nil {
		return err
	}
	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{})
	if err != nil {
		return err
	}

	// The business change and its event commit together, or not at all.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	// ... write the business rows on tx here ...
	if _, err := store.Enqueue(ctx, tx, outbox.Message{
		Namespace: "shop", Topic: "order.created", PartitionKey: "order-1",
		Payload: []byte(`{"order":1}`),
	}); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}

	pub, err := outbox.NewPublisher(store, outbox.PerMessage(func(_ context.Context, d outbox.Delivery) error {
		fmt.Printf("%s %s attempt %d: %s\n", d.ID, d.Topic, d.Attempt, d.Payload)
		return nil // publish to your broker here
	}), outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "shop"}})
	if err != nil {
		return err
	}
	fmt.Println("publishing; press Ctrl-C to stop")
	return pub.Run(ctx) // until Ctrl-C, then settles what is in flight
}
