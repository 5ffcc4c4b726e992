// Command sqlx shows the outbox with sqlx (github.com/jmoiron/sqlx): an order and its event
// written in one sqlx transaction, and a Publisher that prints what it delivers until
// interrupted. No glue is needed: a *sqlx.Tx embeds the *sql.Tx and passes placeholders to
// the driver unchanged, so it is an outbox.Tx as it is.
//
//	go run . -driver pgx -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//	go run . -driver mysql -dsn 'root@tcp(127.0.0.1:3306)/test'
//	go run . -driver sqlite -dsn 'file:shop.db?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate'
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

	_ "github.com/go-sql-driver/mysql" // registers "mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite" // registers "sqlite"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

func main() {
	driver := flag.String("driver", "pgx", "database/sql driver: pgx, mysql or sqlite")
	dsn := flag.String("dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "data source name")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *driver, *dsn); err != nil {
		log.Fatal(err)
	}
}

// Order is the business row.
type Order struct {
	ID       int64  `db:"id" json:"id"`
	SKU      string `db:"sku" json:"sku"`
	Quantity int    `db:"quantity" json:"quantity"`
}

// ErrOutOfStock means an order asked for more than the stock holds; nothing was written.
var ErrOutOfStock = errors.New("out of stock")

// placeOrder writes the order and its event in one transaction: both commit, or neither.
func placeOrder(ctx context.Context, db *sqlx.DB, store *outbox.Store, o Order) error {
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }() // does nothing once committed

	if _, err := tx.NamedExecContext(ctx, `INSERT INTO orders (id, sku, quantity) VALUES (:id, :sku, :quantity)`, o); err != nil {
		return err
	}
	payload, err := json.Marshal(o)
	if err != nil {
		return err
	}
	// The *sqlx.Tx itself: it is an outbox.Tx.
	if _, err := store.Enqueue(ctx, tx, outbox.Message{
		Namespace: "shop", Topic: "order.placed", PartitionKey: strconv.FormatInt(o.ID, 10), Payload: payload,
	}); err != nil {
		return err
	}
	// Taken last, the stock decides: without enough of it, the order and its event roll back.
	res, err := tx.ExecContext(ctx, tx.Rebind(`UPDATE products SET stock = stock - ? WHERE sku = ? AND stock >= ?`), o.Quantity, o.SKU, o.Quantity)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n == 0 {
		return ErrOutOfStock
	}
	return tx.Commit()
}

// setUpShop creates the shop's tables when missing and puts n units of sku in stock.
func setUpShop(ctx context.Context, db *sqlx.DB, sku string, n int) error {
	for _, ddl := range []string{
		`CREATE TABLE IF NOT EXISTS products (sku VARCHAR(64) PRIMARY KEY, stock INTEGER NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS orders (id BIGINT PRIMARY KEY, sku VARCHAR(64) NOT NULL, quantity INTEGER NOT NULL)`,
	} {
		if _, err := db.ExecContext(ctx, ddl); err != nil {
			return err
		}
	}
	if _, err := db.ExecContext(ctx, db.Rebind(`DELETE FROM products WHERE sku = ?`), sku); err != nil {
		return err
	}
	_, err := db.ExecContext(ctx, db.Rebind(`INSERT INTO products (sku, stock) VALUES (?, ?)`), sku, n)
	return err
}

func run(ctx context.Context, driver, dsn string) error {
	db, err := sqlx.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	dialect, ok := map[string]outbox.Dialect{"pgx": outbox.Postgres(), "mysql": outbox.MySQL(), "sqlite": outbox.SQLite()}[driver]
	if !ok {
		return fmt.Errorf("unknown driver %q: pgx, mysql or sqlite", driver)
	}
	// db.DB is the *sql.DB under sqlx's: the Store claims and acknowledges on it.
	if err := migrations.Up(ctx, db.DB, dialect.Name(), migrations.Options{}); err != nil {
		return err
	}
	store, err := outbox.New(db.DB, dialect, outbox.Options{})
	if err != nil {
		return err
	}
	if err := setUpShop(ctx, db, "book", 10); err != nil {
		return err
	}
	if err := placeOrder(ctx, db, store, Order{ID: time.Now().UnixNano(), SKU: "book", Quantity: 1}); err != nil {
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
