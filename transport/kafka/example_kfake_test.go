package outboxkafka_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	_ "modernc.org/sqlite"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
	"github.com/outboxgo/outbox/transport/kafka"
)

// The whole path without a Kafka server or a database server: franz-go's in-process
// cluster (github.com/twmb/franz-go/pkg/kfake, a test helper that speaks the Kafka
// protocol on local ports), an outbox on an SQLite file, a publisher delivering to the
// cluster, and a consumer reading the records back. To try it against a real cluster,
// give NewClient its seed brokers instead of the fake cluster's addresses.
func Example_inProcessCluster() {
	ctx := context.Background()

	// An in-process Kafka cluster with the topic the publisher routes to:
	// <namespace>.<topic>.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "shop.order.created"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()

	// The outbox, on an SQLite file opened with the settings the SQLite dialect needs.
	dir, err := os.MkdirTemp("", "outbox-kafka-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+
		"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate")
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

	// Two events, committed in one transaction.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	for i, order := range []string{"order-1", "order-2"} {
		payload, _ := json.Marshal(map[string]any{"order_id": order, "amount_cents": 1000 * (i + 1)})
		if _, err := store.Enqueue(ctx, tx, outbox.Message{
			Namespace: "shop", Topic: "order.created", PartitionKey: order, Payload: payload,
		}); err != nil {
			log.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	// The publisher: the transport produces to the cluster with the client NewClient builds.
	producer, err := outboxkafka.NewClient(cluster.ListenAddrs())
	if err != nil {
		log.Fatal(err)
	}
	defer producer.Close()
	tr, err := outboxkafka.New(producer, outboxkafka.Options{})
	if err != nil {
		log.Fatal(err)
	}
	pub, err := outbox.NewPublisher(store, tr, outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "shop"}})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- pub.Run(runCtx) }()

	// A consumer of the topic, from its first record, until it has read both.
	consumer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...),
		kgo.ConsumeTopics("shop.order.created"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		log.Fatal(err)
	}
	defer consumer.Close()
	for n := 0; n < 2; {
		fetches := consumer.PollFetches(ctx)
		if err := fetches.Err(); err != nil {
			log.Fatal(err)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			n++
			fmt.Printf("%s key=%s %s\n", r.Topic, r.Key, r.Value)
		})
	}

	// Stopping the publisher waits for its batch to be recorded as delivered.
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	st, err := store.Stats(ctx, outbox.Scope{Namespace: "shop"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("delivered:", st.Delivered, "pending:", st.Pending)
	// Output:
	// shop.order.created key=order-1 {"amount_cents":1000,"order_id":"order-1"}
	// shop.order.created key=order-2 {"amount_cents":2000,"order_id":"order-2"}
	// delivered: 2 pending: 0
}
