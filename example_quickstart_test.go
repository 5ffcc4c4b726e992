package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

// The README's quick start, word for word but for the database file's directory: a business
// row and its event in one transaction on embedded SQLite, then a Publisher that delivers it.
func Example_quickStart() {
	dir, err := os.MkdirTemp("", "outbox-quickstart")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	ctx := context.Background()
	// Embedded SQLite, no server. SQLite needs WAL, a busy timeout and immediate transactions.
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	// Your table, and the outbox's (migrations.Up keeps a goose version table of its own).
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	if err := migrations.Up(ctx, db, "sqlite", migrations.Options{}); err != nil {
		log.Fatal(err)
	}
	store, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	if err != nil {
		log.Fatal(err)
	}

	// Producer: the event commits or rolls back with the business change.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() // a no-op once committed
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, status) VALUES (42, 'paid')
		ON CONFLICT (id) DO UPDATE SET status = 'paid'`); err != nil {
		log.Fatal(err)
	}
	res, err := store.Enqueue(ctx, tx, outbox.Message{
		Namespace: "shop",
		Topic:     "order.paid",
		DedupeKey: "order/42/paid", // optional: at most one row per key
		Payload:   json.RawMessage(`{"order_id":42,"status":"paid"}`),
	})
	if err != nil {
		log.Fatal(err) // a *outbox.ValidationError for bad input; nothing was written
	}
	if res.Duplicate {
		fmt.Println("already enqueued") // not an error: the transaction is still usable
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	// Publisher: claim, publish, ack / retry / dead-letter until ctx is cancelled. A service
	// runs it until shutdown; this one stops after its first delivery, or after 5 s.
	ctx, stop := context.WithTimeout(ctx, 5*time.Second)
	defer stop()
	pub, err := outbox.NewPublisher(store, outbox.PerMessage(func(ctx context.Context, d outbox.Delivery) error {
		fmt.Printf("published %s %s (attempt %d)\n", d.Topic, d.Payload, d.Attempt)
		stop()
		return nil // an error is retried with backoff; outbox.Permanent(err) dead-letters at once
	}), outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "shop"}}) // OnDead: a hook for dead letters
	if err != nil {
		log.Fatal(err)
	}
	if err := pub.Run(ctx); err != nil { // returns once the delivery is recorded
		log.Fatal(err)
	}
	// Output:
	// published order.paid {"order_id":42,"status":"paid"} (attempt 1)
}
