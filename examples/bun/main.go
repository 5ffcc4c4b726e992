// Command bun shows the outbox with bun (github.com/uptrace/bun): an order and its event
// written in one bun transaction, and a Publisher that prints what it delivers until
// interrupted. bun and the outbox share one *sql.DB. The glue is tx.Tx: the *sql.Tx that a
// bun.Tx embeds. A bun.Tx itself has the methods of an outbox.Tx, but it formats every query
// with bun's own placeholders before the driver sees it, which breaks the outbox's SQL; its
// embedded *sql.Tx is the same transaction without that step.
//
//	go run . -driver pgx -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//	go run . -driver mysql -dsn 'root@tcp(127.0.0.1:3306)/test'
//	go run . -driver sqlite -dsn 'file:shop.db?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate'
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

	_ "github.com/go-sql-driver/mysql" // registers "mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/mysqldialect"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/dialect/sqlitedialect"
	"github.com/uptrace/bun/schema"
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

// Product is a stock-keeping unit and how many are in stock.
type Product struct {
	bun.BaseModel `bun:"table:products"`
	SKU           string `bun:"sku,pk,type:varchar(64)"`
	Stock         int    `bun:"stock,notnull"`
}

// Order is the business row.
type Order struct {
	bun.BaseModel `bun:"table:orders"`
	ID            int64  `bun:"id,pk" json:"id"`
	SKU           string `bun:"sku,notnull,type:varchar(64)" json:"sku"`
	Quantity      int    `bun:"quantity,notnull" json:"quantity"`
}

// ErrOutOfStock means an order asked for more than the stock holds; nothing was written.
var ErrOutOfStock = errors.New("out of stock")

// placeOrder writes the order and its event in one transaction: both commit, or neither.
func placeOrder(ctx context.Context, db *bun.DB, store *outbox.Store, o Order) error {
	return db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		if _, err := tx.NewInsert().Model(&o).Exec(ctx); err != nil {
			return err
		}
		payload, err := json.Marshal(o)
		if err != nil {
			return err
		}
		// tx.Tx, the *sql.Tx under bun's transaction; not tx.
		if _, err := store.Enqueue(ctx, tx.Tx, outbox.Message{
			Namespace: "shop", Topic: "order.placed", PartitionKey: strconv.FormatInt(o.ID, 10), Payload: payload,
		}); err != nil {
			return err
		}
		// Taken last, the stock decides: without enough of it, the order and its event roll back.
		res, err := tx.NewUpdate().Model((*Product)(nil)).Set("stock = stock - ?", o.Quantity).
			Where("sku = ?", o.SKU).Where("stock >= ?", o.Quantity).Exec(ctx)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return ErrOutOfStock
		}
		return nil
	})
}

// openBun opens bun on db, whose driver is driver ("pgx", "mysql" or "sqlite").
func openBun(db *sql.DB, driver string) (*bun.DB, error) {
	var d schema.Dialect
	switch driver {
	case "pgx":
		d = pgdialect.New()
	case "mysql":
		d = mysqldialect.New()
	case "sqlite":
		d = sqlitedialect.New()
	default:
		return nil, fmt.Errorf("unknown driver %q: pgx, mysql or sqlite", driver)
	}
	return bun.NewDB(db, d), nil
}

// setUpShop creates the shop's tables when missing and puts n units of sku in stock.
func setUpShop(ctx context.Context, db *bun.DB, sku string, n int) error {
	for _, model := range []any{(*Product)(nil), (*Order)(nil)} {
		if _, err := db.NewCreateTable().Model(model).IfNotExists().Exec(ctx); err != nil {
			return err
		}
	}
	if _, err := db.NewDelete().Model((*Product)(nil)).Where("sku = ?", sku).Exec(ctx); err != nil {
		return err
	}
	_, err := db.NewInsert().Model(&Product{SKU: sku, Stock: n}).Exec(ctx)
	return err
}

func run(ctx context.Context, driver, dsn string) error {
	sqldb, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer sqldb.Close()
	db, err := openBun(sqldb, driver)
	if err != nil {
		return err
	}
	dialect := map[string]outbox.Dialect{"pgx": outbox.Postgres(), "mysql": outbox.MySQL(), "sqlite": outbox.SQLite()}[driver]
	if err := migrations.Up(ctx, sqldb, dialect.Name(), migrations.Options{}); err != nil {
		return err
	}
	store, err := outbox.New(sqldb, dialect, outbox.Options{})
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
