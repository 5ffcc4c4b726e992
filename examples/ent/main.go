// Command ent shows the outbox with ent (entgo.io/ent): an order and its event written in
// one transaction through the generated ent client, and a Publisher that prints what it
// delivers until interrupted. ent and the outbox share one *sql.DB. The glue is txClient
// below: the transaction is a *sql.Tx begun on that pool, and an ent client over it writes
// the business rows while the outbox enqueues on the same *sql.Tx. (A transaction begun with
// ent's own client.Tx keeps its *sql.Tx to itself.)
//
//	go run . -driver pgx -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//	go run . -driver mysql -dsn 'root@tcp(127.0.0.1:3306)/test'
//	go run . -driver sqlite -dsn 'file:shop.db?_pragma=foreign_keys(1)&_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate'
//
// The ent client in ./ent is generated from ./ent/schema: go generate ./ent.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"time"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	_ "github.com/go-sql-driver/mysql" // registers "mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	_ "modernc.org/sqlite"             // registers "sqlite"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/examples/ent/ent"
	"github.com/outboxgo/outbox/examples/ent/ent/product"
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

// Shop is the ent client on the shop's database.
type Shop struct {
	db      *sql.DB
	dialect string // ent's dialect name
	client  *ent.Client
}

// openShop returns the shop on db, whose driver is driver ("pgx", "mysql" or "sqlite").
func openShop(db *sql.DB, driver string) (*Shop, error) {
	d, ok := map[string]string{"pgx": dialect.Postgres, "mysql": dialect.MySQL, "sqlite": dialect.SQLite}[driver]
	if !ok {
		return nil, fmt.Errorf("unknown driver %q: pgx, mysql or sqlite", driver)
	}
	return &Shop{db: db, dialect: d, client: ent.NewClient(ent.Driver(entsql.OpenDB(d, db)))}, nil
}

// txClient returns an ent client whose queries run on tx.
func (s *Shop) txClient(tx *sql.Tx) *ent.Client {
	return ent.NewClient(ent.Driver(entsql.NewDriver(s.dialect, entsql.Conn{ExecQuerier: tx})))
}

// OrderPlaced is the event's payload.
type OrderPlaced struct {
	ID       int64  `json:"id"`
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

// ErrOutOfStock means an order asked for more than the stock holds; nothing was written.
var ErrOutOfStock = errors.New("out of stock")

// placeOrder writes the order and its event in one transaction: both commit, or neither.
func (s *Shop) placeOrder(ctx context.Context, store *outbox.Store, o OrderPlaced) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }() // does nothing once committed
	client := s.txClient(tx)

	if err := client.Order.Create().SetID(o.ID).SetSku(o.SKU).SetQuantity(o.Quantity).Exec(ctx); err != nil {
		return err
	}
	payload, err := json.Marshal(o)
	if err != nil {
		return err
	}
	if _, err := store.Enqueue(ctx, tx, outbox.Message{
		Namespace: "shop", Topic: "order.placed", PartitionKey: strconv.FormatInt(o.ID, 10), Payload: payload,
	}); err != nil {
		return err
	}
	// Taken last, the stock decides: without enough of it, the order and its event roll back.
	n, err := client.Product.Update().Where(product.ID(o.SKU), product.StockGTE(o.Quantity)).AddStock(-o.Quantity).Save(ctx)
	if err != nil {
		return err
	}
	if n == 0 {
		return ErrOutOfStock
	}
	return tx.Commit()
}

// setUp creates the shop's tables (ent's migration) and puts n units of sku in stock.
func (s *Shop) setUp(ctx context.Context, sku string, n int) error {
	if err := s.client.Schema.Create(ctx); err != nil {
		return err
	}
	if _, err := s.client.Product.Delete().Where(product.ID(sku)).Exec(ctx); err != nil {
		return err
	}
	return s.client.Product.Create().SetID(sku).SetStock(n).Exec(ctx)
}

func run(ctx context.Context, driver, dsn string) error {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	shop, err := openShop(db, driver)
	if err != nil {
		return err
	}
	dialect := map[string]outbox.Dialect{"pgx": outbox.Postgres(), "mysql": outbox.MySQL(), "sqlite": outbox.SQLite()}[driver]
	if err := migrations.Up(ctx, db, dialect.Name(), migrations.Options{}); err != nil {
		return err
	}
	store, err := outbox.New(db, dialect, outbox.Options{})
	if err != nil {
		return err
	}
	if err := shop.setUp(ctx, "book", 10); err != nil {
		return err
	}
	if err := shop.placeOrder(ctx, store, OrderPlaced{ID: time.Now().UnixNano(), SKU: "book", Quantity: 1}); err != nil {
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
