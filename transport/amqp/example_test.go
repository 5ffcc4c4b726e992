package outboxamqp_test

import (
	"context"
	"database/sql"
	"log"
	"os/signal"
	"syscall"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/transport/amqp"
)

// A publisher delivers the "shop" namespace's events to RabbitMQ: each event goes to the
// "shop" topic exchange with its topic as routing key, and consumers bind their queues to
// the topics they want ("order.*"). The example is compiled, not run: it needs a broker and
// a database.
func Example() {
	db, err := sql.Open("pgx", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{})
	if err != nil {
		log.Fatal(err)
	}

	tr, err := outboxamqp.New(outboxamqp.Options{
		URL: "amqp://guest:guest@127.0.0.1:5672/",
		// Route everything to one exchange, keyed "<namespace>.<topic>".
		Route: func(d *outbox.Delivery) (string, string, error) {
			return "events", d.Namespace + "." + d.Topic, nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()

	pub, err := outbox.NewPublisher(store, tr, outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "shop"}})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := pub.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
