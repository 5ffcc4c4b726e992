// Command gorm shows the outbox with GORM (gorm.io/gorm): an order and its event written in
// one GORM transaction, and a Publisher that prints what it delivers until interrupted.
// GORM and the outbox share one *sql.DB. The glue is sqlTx below: the outbox enqueues on the
// *sql.Tx under GORM's transaction, which GORM keeps in tx.Statement.ConnPool (wrapped in a
// *gorm.PreparedStmtTX when PrepareStmt is on).
//
//	go run . -driver pgx -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//	go run . -driver mysql -dsn 'root@tcp(127.0.0.1:3306)/test' -prepare
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
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	_ "modernc.org/sqlite" // registers "sqlite"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

func main() {
	driver := flag.String("driver", "pgx", "database/sql driver: pgx, mysql or sqlite")
	dsn := flag.String("dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "data source name")
	prepare := flag.Bool("prepare", false, "turn on GORM's PrepareStmt")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *driver, *dsn, *prepare); err != nil {
		log.Fatal(err)
	}
}

// Product is a stock-keeping unit and how many are in stock.
type Product struct {
	SKU   string `gorm:"primaryKey;size:64"`
	Stock int
}

// Order is the business row.
type Order struct {
	ID       int64  `gorm:"primaryKey;autoIncrement:false" json:"id"`
	SKU      string `gorm:"size:64" json:"sku"`
	Quantity int    `json:"quantity"`
}

// ErrOutOfStock means an order asked for more than the stock holds; nothing was written.
var ErrOutOfStock = errors.New("out of stock")

// sqlTx returns the *sql.Tx under a GORM transaction: tx.Statement.ConnPool itself, or,
// with PrepareStmt, the transaction that GORM's statement cache wraps.
func sqlTx(tx *gorm.DB) (*sql.Tx, error) {
	pool := tx.Statement.ConnPool
	if p, ok := pool.(*gorm.PreparedStmtTX); ok {
		pool = p.Tx
	}
	if t, ok := pool.(*sql.Tx); ok {
		return t, nil
	}
	return nil, fmt.Errorf("not in a GORM transaction: its connection pool is a %T", pool)
}

// placeOrder writes the order and its event in one transaction: both commit, or neither.
func placeOrder(ctx context.Context, db *gorm.DB, store *outbox.Store, o Order) error {
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&o).Error; err != nil {
			return err
		}
		payload, err := json.Marshal(o)
		if err != nil {
			return err
		}
		stx, err := sqlTx(tx)
		if err != nil {
			return err
		}
		if _, err := store.Enqueue(ctx, stx, outbox.Message{
			Namespace: "shop", Topic: "order.placed", PartitionKey: strconv.FormatInt(o.ID, 10), Payload: payload,
		}); err != nil {
			return err
		}
		// Taken last, the stock decides: without enough of it, the order and its event roll back.
		res := tx.Model(&Product{}).Where("sku = ? AND stock >= ?", o.SKU, o.Quantity).
			Update("stock", gorm.Expr("stock - ?", o.Quantity))
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 0 {
			return ErrOutOfStock
		}
		return nil
	})
}

// openGorm opens GORM on db, whose driver is driver ("pgx", "mysql" or "sqlite").
func openGorm(db *sql.DB, driver string, prepare bool) (*gorm.DB, error) {
	var d gorm.Dialector
	switch driver {
	case "pgx":
		d = postgres.New(postgres.Config{Conn: db})
	case "mysql":
		d = mysql.New(mysql.Config{Conn: db})
	case "sqlite":
		d = sqlite.New(sqlite.Config{Conn: db})
	default:
		return nil, fmt.Errorf("unknown driver %q: pgx, mysql or sqlite", driver)
	}
	return gorm.Open(d, &gorm.Config{PrepareStmt: prepare})
}

// setUpShop creates the shop's tables when missing and puts n units of sku in stock.
func setUpShop(ctx context.Context, db *gorm.DB, sku string, n int) error {
	db = db.WithContext(ctx)
	if err := db.AutoMigrate(&Product{}, &Order{}); err != nil {
		return err
	}
	return db.Save(&Product{SKU: sku, Stock: n}).Error
}

func run(ctx context.Context, driver, dsn string, prepare bool) error {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	gdb, err := openGorm(db, driver, prepare)
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
	if err := setUpShop(ctx, gdb, "book", 10); err != nil {
		return err
	}
	if err := placeOrder(ctx, gdb, store, Order{ID: time.Now().UnixNano(), SKU: "book", Quantity: 1}); err != nil {
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
