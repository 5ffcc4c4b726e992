package outboxnats_test

import (
	"context"
	"database/sql"
	"log"
	"os/signal"
	"syscall"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/transport/nats"
)

// A publisher that delivers the "shop" namespace's events to JetStream: topic
// "order.created" goes to subject "shop.order.created", which the stream SHOP captures.
// The example needs a NATS server with JetStream and a PostgreSQL database, so it is
// compiled but not run.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	nc, err := nats.Connect(nats.DefaultURL, nats.MaxReconnects(-1))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	// The stream is the broker's configuration, usually created by a deployment. Its
	// duplicate window (two minutes by default) drops redeliveries by Nats-Msg-Id.
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "SHOP", Subjects: []string{"shop.>"}}); err != nil {
		log.Fatal(err)
	}
	tr, err := outboxnats.New(js, outboxnats.Options{})
	if err != nil {
		log.Fatal(err)
	}

	db, err := sql.Open("pgx", "postgres://postgres@127.0.0.1:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{})
	if err != nil {
		log.Fatal(err)
	}
	pub, err := outbox.NewPublisher(store, tr, outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "shop"}})
	if err != nil {
		log.Fatal(err)
	}
	if err := pub.Run(ctx); err != nil { // until SIGINT or SIGTERM
		log.Fatal(err)
	}
}
