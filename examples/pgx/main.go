// Command pgx shows the outbox in a service that uses pgx natively (a pgxpool.Pool and
// pgx.Tx, no database/sql in its business code): an order and its event written in one pgx
// transaction, and a Publisher that prints what it delivers until interrupted. The glue is
// pgxv5.Enqueue, which takes the pgx.Tx, and pgxv5.New, which builds the Store over the same
// pool (the Publisher and the migrations use the *sql.DB that pgx's stdlib gives over it).
//
//	go run . -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
	"github.com/outboxgo/outbox/pgxv5"
)

func main() {
	dsn := flag.String("dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL connection URL")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *dsn); err != nil {
		log.Fatal(err)
	}
}

// Order is the business row, and the event's payload.
type Order struct {
	ID       int64  `json:"id"`
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

// ErrOutOfStock means an order asked for more than the stock holds; nothing was written.
var ErrOutOfStock = errors.New("out of stock")

// placeOrder writes the order and its event in one transaction: both commit, or neither.
func placeOrder(ctx context.Context, pool *pgxpool.Pool, store *outbox.Store, o Order) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // does nothing once committed

	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, sku, quantity) VALUES ($1, $2, $3)`, o.ID, o.SKU, o.Quantity); err != nil {
		return err
	}
	payload, err := json.Marshal(o)
	if err != nil {
		return err
	}
	if _, err := pgxv5.Enqueue(ctx, store, tx, outbox.Message{
		Namespace: "shop", Topic: "order.placed", PartitionKey: strconv.FormatInt(o.ID, 10), Payload: payload,
	}); err != nil {
		return err
	}
	// Taken last, the stock decides: without enough of it, the order and its event roll back.
	tag, err := tx.Exec(ctx, `UPDATE products SET stock = stock - $1 WHERE sku = $2 AND stock >= $1`, o.Quantity, o.SKU)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return ErrOutOfStock
	}
	return tx.Commit(ctx)
}

// setUpShop creates the shop's tables when missing and puts n units of sku in stock.
func setUpShop(ctx context.Context, pool *pgxpool.Pool, sku string, n int) error {
	_, err := pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS products (sku varchar(64) PRIMARY KEY, stock integer NOT NULL);
		CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, sku varchar(64) NOT NULL, quantity integer NOT NULL)`)
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `INSERT INTO products (sku, stock) VALUES ($1, $2)
		ON CONFLICT (sku) DO UPDATE SET stock = EXCLUDED.stock`, sku, n)
	return err
}

func run(ctx context.Context, dsn string) error {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The Store, its Publisher and the migrations run on a *sql.DB over pool.
	store, err := pgxv5.New(pool, outbox.Options{})
	if err != nil {
		return err
	}
	if err := migrations.Up(ctx, store.DB(), "postgres", migrations.Options{}); err != nil {
		return err
	}
	if err := setUpShop(ctx, pool, "book", 10); err != nil {
		return err
	}
	if err := placeOrder(ctx, pool, store, Order{ID: time.Now().UnixNano(), SKU: "book", Quantity: 1}); err != nil {
		return err
	}

	pub, err := outbox.NewPublisher(store, outbox.PerMessage(func(_ context.Context, d outbox.Delivery) error {
		fmt.Printf("%s %s attempt %d: %s\n", d.ID, d.Topic, d.Attempt, d.Payload)
		return nil // publish to your broker here
	}), outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "shop"}})
	if err != nil {
		return err
	}
	fmt.Println("publishing; press Ctrl-C to stop")
	return pub.Run(ctx) // until Ctrl-C, then settles what is in flight
}
