package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

// openExampleDB opens a throwaway SQLite file with the settings the SQLite dialect documents.
func openExampleDB() (*sql.DB, func()) {
	dir, err := os.MkdirTemp("", "outbox-example")
	if err != nil {
		log.Fatal(err)
	}
	dsn := "file:" + filepath.Join(dir, "app.db") + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		log.Fatal(err)
	}
	return db, func() { db.Close(); os.RemoveAll(dir) }
}

// Write a business row and its event in one transaction, then claim and ack the event as
// a publisher would.
func Example() {
	ctx := context.Background()
	db, cleanup := openExampleDB()
	defer cleanup()
	if err := migrations.Up(ctx, db, "sqlite", migrations.Options{}); err != nil {
		log.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER)`); err != nil {
		log.Fatal(err)
	}
	store, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	if err != nil {
		log.Fatal(err)
	}

	// The order and its event commit together, or not at all.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, total) VALUES ('o-1', 4200)`); err != nil {
		log.Fatal(err)
	}
	res, err := store.Enqueue(ctx, tx, outbox.Message{
		Namespace: "shop",
		Topic:     "order.created",
		DedupeKey: "order/o-1/created",
		Payload:   json.RawMessage(`{"order_id":"o-1","total":4200}`),
	})
	if err != nil {
		log.Fatal(err)
	}
	again, err := store.Enqueue(ctx, tx, outbox.Message{
		Namespace: "shop", Topic: "order.created", DedupeKey: "order/o-1/created",
		Payload: json.RawMessage(`{"order_id":"o-1","total":4200}`),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("second enqueue was a duplicate:", again.Duplicate)

	// A publisher claims due rows under a lease, publishes them, then acks.
	recs, err := store.Claim(ctx, outbox.ClaimOptions{Limit: 10, Lease: 30 * time.Second, MaxAttempts: 5, WorkerID: "example"})
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range recs {
		fmt.Printf("claimed %s/%s attempt %d: %s (same id: %v)\n", r.Namespace, r.Topic, r.Attempts, r.Payload, r.ID == res.ID)
	}
	if err := store.Ack(ctx, recs[0].Lease()); err != nil {
		log.Fatal(err)
	}
	r, err := store.Get(ctx, res.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("status:", r.Status)
	// Output:
	// second enqueue was a duplicate: true
	// claimed shop/order.created attempt 1: {"order_id":"o-1","total":4200} (same id: true)
	// status: delivered
}

// Invalid input is refused before any SQL with an error that errors.Is can match.
func ExampleStore_Enqueue_validation() {
	ctx := context.Background()
	db, cleanup := openExampleDB()
	defer cleanup()
	store, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	if err != nil {
		log.Fatal(err)
	}
	tenant := [16]byte{1}
	_, err = store.EnqueueStandalone(ctx, outbox.Message{
		Namespace: "shop", Topic: "order.created",
		TenantID:  tenant,
		DedupeKey: "someone-else/order-1",
		Payload:   json.RawMessage(`{}`),
	})
	fmt.Println(err)
	var ve *outbox.ValidationError
	fmt.Println(errors.Is(err, outbox.ErrInvalid), errors.Is(err, outbox.ErrTenantMismatch), errors.As(err, &ve))
	// Output:
	// outbox: invalid dedupe_key: must begin with the tenant id "01000000-0000-0000-0000-000000000000/"
	// true true true
}
