package outboxredis_test

import (
	"context"
	"database/sql"
	"log"
	"os/signal"
	"syscall"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/transport/redis"
)

// A publisher that appends the "shop" namespace's events to Redis streams: topic
// "order.created" goes to the stream "shop:order.created", trimmed to about a million
// entries. The example needs a Redis server and a PostgreSQL database, so it is compiled
// but not run.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	tr, err := outboxredis.New(rdb, outboxredis.Options{MaxLen: 1_000_000})
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
