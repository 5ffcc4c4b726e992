package outboxkafka_test

import (
	"context"
	"database/sql"
	"log"
	"os/signal"
	"syscall"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/transport/kafka"
)

// A publisher that delivers the "shop" namespace's events to Kafka: topic "order.created"
// goes to the Kafka topic "shop.order.created", keyed by the partition key. The example
// needs a Kafka cluster and a PostgreSQL database, so it is compiled but not run.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	// An idempotent producer with a record delivery timeout; pass kgo options for TLS,
	// SASL or a partitioner after the seeds.
	client, err := outboxkafka.NewClient([]string{"127.0.0.1:9092"})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	tr, err := outboxkafka.New(client, outboxkafka.Options{})
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
