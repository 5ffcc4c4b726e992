package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/signal"

	_ "github.com/go-sql-driver/mysql" // registers the "mysql" driver

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

// The quick start on MySQL 8.0+ or MariaDB 10.6+ with go-sql-driver: create the tables,
// write an order and its event in one transaction, and run a Publisher until interrupted. It
// needs a running server, so it is compiled but not run by go test.
//
// interpolateParams=true sends each statement in one round trip instead of two (prepare,
// execute). Leave clientFoundRows at its default (false): the dialect counts affected rows
// to tell a new dedupe key from a duplicate. parseTime and loc do not matter.
func Example_mysql() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	db, err := sql.Open("mysql", "app:secret@tcp(127.0.0.1:3306)/app?interpolateParams=true")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	// Once per database: the outbox table and its dedupe table, outbox_events_dedupe.
	if err := migrations.Up(ctx, db, "mysql", migrations.Options{}); err != nil {
		log.Fatal(err)
	}
	store, err := outbox.New(db, outbox.MySQL(), outbox.Options{})
	if err != nil {
		log.Fatal(err)
	}
	// Fail fast on a setup problem (also what a readiness probe can call).
	if err := store.Check(ctx); err != nil {
		log.Fatal(err)
	}

	// The business change and its event commit together, or not at all.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() // a no-op after Commit
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, total_cents) VALUES (?, ?)`, "o-1", 4200); err != nil {
		log.Fatal(err)
	}
	res, err := store.Enqueue(ctx, tx, outbox.Message{
		Namespace: "shop",
		Topic:     "order.created",
		DedupeKey: "order/o-1/created", // a retried request enqueues nothing twice
		Payload:   json.RawMessage(`{"order_id":"o-1","total_cents":4200}`),
	})
	if err != nil {
		log.Fatal(err)
	}
	if res.Duplicate {
		fmt.Println("already enqueued") // the transaction is intact and can still commit
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	// An event that no business change goes with gets a transaction of its own.
	if _, err := store.EnqueueStandalone(ctx, outbox.Message{
		Namespace: "shop", Topic: "report.requested", Payload: json.RawMessage(`{"day":"2026-11-24"}`),
	}); err != nil {
		log.Fatal(err)
	}

	broker := outbox.PerMessage(func(ctx context.Context, d outbox.Delivery) error {
		fmt.Printf("publish %s %s attempt %d: %s\n", d.ID, d.Topic, d.Attempt, d.Payload)
		return nil // an error retries with backoff; outbox.Permanent(err) dead-letters at once
	})
	pub, err := outbox.NewPublisher(store, broker, outbox.PublisherOptions{
		Scope:       outbox.Scope{Namespace: "shop"},
		Concurrency: 2, // claim loops; SKIP LOCKED keeps them, and other publishers, apart
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := pub.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
