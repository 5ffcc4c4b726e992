package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite" // registers "sqlite"

	"github.com/outboxgo/outbox/inbox"
)

// A consumer whose broker delivers the same message twice charges the order once: the
// inbox records the message id in the transaction that writes the payment.
func Example() {
	dir, err := os.MkdirTemp("", "inbox-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "billing.db")+
		"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if err := inbox.MigrateUp(ctx, db, "sqlite", inbox.MigrateOptions{}); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE payments (order_id TEXT NOT NULL, cents INTEGER NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	in, err := inbox.New(db, "sqlite", inbox.Options{})
	if err != nil {
		log.Fatal(err)
	}

	// handle is the consumer's message handler; the broker calls it once per delivery.
	handle := func(messageID, orderID string, cents int) {
		res, err := in.Process(ctx, "billing", messageID, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO payments (order_id, cents) VALUES (?, ?)`, orderID, cents)
			return err
		})
		switch {
		case err != nil:
			fmt.Println("failed, leave it to redelivery:", err) // do not ack
		case res.Duplicate:
			fmt.Println("duplicate of", messageID, "skipped") // ack
		default:
			fmt.Println("charged", orderID) // ack
		}
	}
	handle("0193a0c4-7d1e-7c3a-9b1e-5f0d8a2b6c11", "order-42", 1999)
	handle("0193a0c4-7d1e-7c3a-9b1e-5f0d8a2b6c11", "order-42", 1999) // redelivered

	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM payments`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("payments:", n)

	// Retention is the dedupe window: keep records longer than the broker may redeliver.
	purged, err := in.Purge(ctx, 7*24*time.Hour, 0)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("purged:", purged)
	// Output:
	// charged order-42
	// duplicate of 0193a0c4-7d1e-7c3a-9b1e-5f0d8a2b6c11 skipped
	// payments: 1
	// purged: 0
}

// A consumer that manages its own transaction claims the message on it first.
func ExampleInbox_Claim() {
	dir, err := os.MkdirTemp("", "inbox-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "billing.db")+"?_pragma=busy_timeout(10000)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if err := inbox.MigrateUp(ctx, db, "sqlite", inbox.MigrateOptions{Table: "billing_inbox"}); err != nil {
		log.Fatal(err)
	}
	in, err := inbox.New(db, "sqlite", inbox.Options{Table: "billing_inbox"})
	if err != nil {
		log.Fatal(err)
	}

	for range 2 {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			log.Fatal(err)
		}
		res, err := in.Claim(ctx, tx, "billing", "msg-1")
		if err != nil {
			_ = tx.Rollback()
			log.Fatal(err)
		}
		if res.Duplicate {
			fmt.Println("already processed")
			_ = tx.Rollback()
			continue
		}
		// ... the delivery's work on tx; on failure roll back instead ...
		if err := tx.Commit(); err != nil {
			log.Fatal(err)
		}
		fmt.Println("processed")
	}
	// Output:
	// processed
	// already processed
}
