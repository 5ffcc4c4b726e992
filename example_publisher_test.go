package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

// A Publisher delivers committed events through a transport. Here the broker is busy for
// the first attempt of one event, which is retried, and refuses another for good, which is
// dead-lettered at once and reported to OnDead.
func ExamplePublisher() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "outbox-publisher-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := migrations.Up(ctx, db, "sqlite", migrations.Options{}); err != nil {
		log.Fatal(err)
	}
	store, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	if err != nil {
		log.Fatal(err)
	}

	// Three events, committed together (in a real service, with the business rows).
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	for _, topic := range []string{"order.created", "order.paid", "order.shipped"} {
		msg := outbox.Message{Namespace: "shop", Topic: topic, Payload: []byte(`{"order":1}`)}
		if _, err := store.Enqueue(ctx, tx, msg); err != nil {
			log.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	broker := outbox.PerMessage(func(ctx context.Context, d outbox.Delivery) error {
		switch {
		case d.Topic == "order.shipped":
			return outbox.Permanent(errors.New("no route for topic"))
		case d.Topic == "order.paid" && d.Attempt == 1:
			fmt.Printf("%s attempt %d: broker busy\n", d.Topic, d.Attempt)
			return errors.New("broker busy")
		}
		fmt.Printf("%s attempt %d: delivered %s\n", d.Topic, d.Attempt, d.Payload)
		if d.Topic == "order.paid" {
			stop() // the last event: shut down once it is recorded
		}
		return nil
	})
	pub, err := outbox.NewPublisher(store, broker, outbox.PublisherOptions{
		Scope:        outbox.Scope{Namespace: "shop"},
		PollInterval: 10 * time.Millisecond,
		Retry:        outbox.RetryPolicy{BaseDelay: 10 * time.Millisecond},
		Logger:       slog.New(slog.DiscardHandler),
		OnDead: func(_ context.Context, dl outbox.DeadLetter) {
			fmt.Printf("dead letter: %s after %d attempt(s): %s\n", dl.Topic, dl.Attempt, dl.Reason)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	// Run returns after the in-flight batch is settled.
	if err := pub.Run(runCtx); err != nil {
		log.Fatal(err)
	}

	s := pub.Stats()
	fmt.Printf("claimed %d, delivered %d, retried %d, dead %d\n", s.Claimed, s.Delivered, s.Retried, s.Dead)
	rows, err := db.QueryContext(ctx, `SELECT status, COUNT(*) FROM outbox_events GROUP BY status ORDER BY status`)
	if err != nil {
		log.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var status string
		var n int
		if err := rows.Scan(&status, &n); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: %d\n", status, n)
	}
	// Output:
	// order.created attempt 1: delivered {"order":1}
	// order.paid attempt 1: broker busy
	// dead letter: order.shipped after 1 attempt(s): permanent: no route for topic
	// order.paid attempt 2: delivered {"order":1}
	// claimed 4, delivered 2, retried 1, dead 1
	// dead: 1
	// delivered: 2
}
