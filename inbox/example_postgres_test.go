package inbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"log"
	"os"

	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/inbox"
)

// orderPaid is the event the shipping service consumes.
type orderPaid struct {
	OrderID string `json:"order_id"`
}

// A shipping service on PostgreSQL consumes "order paid" events, delivered at least once by
// whatever transport carries them. In one transaction it records the message in its inbox,
// creates the shipment and enqueues its own "shipment created" event in its outbox: all of
// it happens once per message, or not at all. (Compiled, not run: it needs a server.)
func ExampleInbox_Process_postgres() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := inbox.MigrateUp(ctx, db, "postgres", inbox.MigrateOptions{}); err != nil {
		log.Fatal(err)
	}
	in, err := inbox.New(db, outbox.Postgres().Name(), inbox.Options{})
	if err != nil {
		log.Fatal(err)
	}
	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{})
	if err != nil {
		log.Fatal(err)
	}

	// consume handles one delivery; a nil error means the transport may acknowledge it.
	consume := func(ctx context.Context, messageID string, payload []byte) error {
		var ev orderPaid
		if err := json.Unmarshal(payload, &ev); err != nil {
			return errors.Join(errors.New("malformed event, dead-letter it"), err)
		}
		_, err := in.Process(ctx, "shipping", messageID, func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO shipments (order_id) VALUES ($1)`, ev.OrderID); err != nil {
				return err
			}
			_, err := store.Enqueue(ctx, tx, outbox.Message{
				Namespace: "shipping",
				Topic:     "shipment.created",
				Payload:   payload,
			})
			return err
		})
		return err // a duplicate is a nil error too: acknowledge it
	}

	// A record published by another service's outbox carries its row id as the message id.
	if err := consume(ctx, "01936f4e-2b7a-7d43-8f0a-3c5e9d1b2a40", []byte(`{"order_id":"order-42"}`)); err != nil {
		log.Print(err)
	}
}
