package outbox_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/google/uuid"
	_ "modernc.org/sqlite"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

// A service in another language writes outbox rows with plain SQL in its own transaction,
// as docs/wire-format.md describes (here on SQLite); a Go Publisher delivers them.
func Example_foreignWriter() {
	dir, err := os.MkdirTemp("", "outbox-foreign")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := migrations.Up(ctx, db, "sqlite", migrations.Options{}); err != nil {
		log.Fatal(err)
	}

	// What the other service runs: the row, its payload's SHA-256, the database's clock in
	// whole milliseconds as Unix microseconds, and the dedupe clause.
	const now = `(CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)`
	insert := `INSERT INTO outbox_events (id, namespace, topic, dedupe_key, headers, payload, payload_hash,
		status, attempts, next_attempt_at, created_at, updated_at)
		VALUES (?, 'shop', 'order.paid', 'order/42/paid', '{"source":"billing-py"}', ?, ?, 'pending', 0, ` + now + `, ` + now + `, ` + now + `)
		ON CONFLICT (namespace, topic, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING`
	payload := `{"order_id":42,"status":"paid"}`
	hash := sha256.Sum256([]byte(payload))
	for range 2 { // the second is a duplicate: no row, no error
		id := uuid.Must(uuid.NewV7())
		res, err := db.ExecContext(ctx, insert, id[:], payload, hash[:])
		if err != nil {
			log.Fatal(err)
		}
		n, _ := res.RowsAffected()
		fmt.Println("rows inserted:", n)
	}

	store, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithTimeout(ctx, 10*time.Second) // a row the Publisher refuses ends the example, not the test run
	defer stop()
	pub, err := outbox.NewPublisher(store, outbox.PerMessage(func(ctx context.Context, d outbox.Delivery) error {
		fmt.Printf("published %s %s headers %v\n", d.Topic, d.Payload, d.Headers)
		stop()
		return nil
	}), outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "shop"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	if err := pub.Run(runCtx); err != nil {
		log.Fatal(err)
	}
	var status string
	if err := db.QueryRowContext(ctx, `SELECT status FROM outbox_events`).Scan(&status); err != nil {
		log.Fatal(err)
	}
	fmt.Println("status:", status)
	// Output:
	// rows inserted: 1
	// rows inserted: 0
	// published order.paid {"order_id":42,"status":"paid"} headers map[source:billing-py]
	// status: delivered
}
