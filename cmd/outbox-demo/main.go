// Command outbox-demo runs a small order service on embedded SQLite to show the outbox at
// work. Each order, its stock update and its order.placed event are written in one
// transaction; an order that cannot be served rolls back and leaves no event. A
// [outbox.Publisher] delivers the events to a fake broker that is unreliable in a fixed,
// repeatable way:
//
//   - every event fails its first attempt (the broker is "unavailable") and is retried;
//   - one event is rate limited on its second attempt, with a retry-after hint;
//   - one event carries a currency the broker's schema refuses: a permanent error, so it is
//     dead-lettered at once and reported by the OnDead hook.
//
// The demo prints each step and a final tally read from the database, and exits 0 once every
// event is delivered or dead. It needs nothing but Go (the SQLite driver is pure Go) and
// removes its database file at exit:
//
//	go run ./cmd/outbox-demo
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

func main() { os.Exit(run()) }

// order is a request to the shop.
type order struct {
	ID       int
	Customer string
	Item     string
	Qty      int
	Cents    int // unit price
	Currency string
}

// event is the payload of order.placed: complete, so consumers never query back.
type event struct {
	OrderID    int    `json:"order_id"`
	Customer   string `json:"customer"`
	Item       string `json:"item"`
	Qty        int    `json:"qty"`
	TotalCents int    `json:"total_cents"`
	Currency   string `json:"currency"`
}

var orders = []order{
	{1, "alice", "espresso beans", 2, 1550, "EUR"},
	{2, "bob", "grinder", 1, 8900, "EUR"},
	{3, "carol", "espresso beans", 1, 1550, "EUR"},
	{4, "dave", "grinder", 5, 8900, "EUR"}, // more than in stock: refused, rolled back
	{5, "erin", "filter papers", 3, 450, "EUR"},
	{6, "frank", "espresso beans", 4, 1550, "XTS"}, // the broker refuses this currency
	{7, "grace", "grinder", 1, 8900, "EUR"},
	{8, "heidi", "filter papers", 1, 450, "EUR"},
}

// rateLimited is the order whose second attempt is answered with a retry-after hint.
const rateLimited = 3

// console prints timestamped lines from several goroutines.
type console struct {
	mu    sync.Mutex
	start time.Time
}

func (c *console) say(who, format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fmt.Printf("%8.3fs  %-7s %s\n", time.Since(c.start).Seconds(), who, fmt.Sprintf(format, args...))
}

func run() int {
	start := time.Now()
	out := &console{start: start}
	ctx := context.Background()

	dir, err := os.MkdirTemp("", "outbox-demo-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "outbox-demo:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "shop.db")
	// The settings the SQLite dialect documents: WAL, a busy timeout, immediate transactions.
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate")
	if err != nil {
		fmt.Fprintln(os.Stderr, "outbox-demo:", err)
		return 1
	}
	defer db.Close()

	fmt.Println("outbox demo: an order service on embedded SQLite, a publisher and a flaky broker")
	fmt.Printf("database %s (removed at exit)\n\n", path)

	if err := setup(ctx, db); err != nil {
		fmt.Fprintln(os.Stderr, "outbox-demo: setup:", err)
		return 1
	}
	store, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "outbox-demo:", err)
		return 1
	}

	broker := &flakyBroker{out: out}
	pub, err := outbox.NewPublisher(store, outbox.PerMessage(broker.publish), outbox.PublisherOptions{
		Scope:          outbox.Scope{Namespace: "shop"},
		BatchSize:      10,
		PollInterval:   50 * time.Millisecond,
		IdleBackoffMax: 200 * time.Millisecond,
		Lease:          5 * time.Second,
		Retry:          outbox.RetryPolicy{BaseDelay: 50 * time.Millisecond, MaxDelay: 400 * time.Millisecond, MaxAttempts: 5},
		// The demo prints its own story; the publisher's log shows only real trouble.
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
		OnDead: func(_ context.Context, dl outbox.DeadLetter) {
			out.say("DEAD", "order %s (%s) after %d attempt(s): %s", orderOf(dl.Delivery), dl.Topic, dl.Attempt, dl.Reason)
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "outbox-demo:", err)
		return 1
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	stopped := make(chan error, 1)
	go func() { stopped <- pub.Run(runCtx) }()

	// The shop takes orders while the publisher runs.
	placed := 0
	for _, o := range orders {
		err := placeOrder(ctx, db, store, o)
		var refused refusal
		switch {
		case err == nil:
			placed++
			out.say("shop", "order %d placed: %s, %d x %s, %s; its event is committed in the same transaction",
				o.ID, o.Customer, o.Qty, o.Item, money(o.Qty*o.Cents, o.Currency))
		case errors.As(err, &refused):
			out.say("shop", "order %d refused: %s; transaction rolled back, so no event either", o.ID, refused)
		default:
			fmt.Fprintln(os.Stderr, "outbox-demo: place order:", err)
			return 1
		}
		time.Sleep(40 * time.Millisecond)
	}

	// Wait until every event is delivered or dead.
	deadline := time.Now().Add(30 * time.Second)
	var counts map[string]int
	for {
		if counts, err = countByStatus(ctx, db); err != nil {
			fmt.Fprintln(os.Stderr, "outbox-demo:", err)
			return 1
		}
		if counts["pending"]+counts["processing"] == 0 {
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "outbox-demo: events still in flight after 30s: %v\n", counts)
			return 1
		}
		time.Sleep(25 * time.Millisecond)
	}
	stop()
	if err := <-stopped; err != nil {
		fmt.Fprintln(os.Stderr, "outbox-demo: publisher:", err)
		return 1
	}

	var nOrders int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM orders`).Scan(&nOrders); err != nil {
		fmt.Fprintln(os.Stderr, "outbox-demo:", err)
		return 1
	}
	total := 0
	for _, n := range counts {
		total += n
	}
	s := pub.Stats()
	fmt.Printf("\nfinal tally after %.1fs\n", time.Since(start).Seconds())
	fmt.Printf("  orders table     %d orders (%d refused and rolled back)\n", nOrders, len(orders)-placed)
	fmt.Printf("  outbox table     %d events: delivered %d, dead %d, pending %d, processing %d\n",
		total, counts["delivered"], counts["dead"], counts["pending"], counts["processing"])
	fmt.Printf("  publisher        claimed %d, delivered %d, retried %d, dead %d, lease lost %d, errors %d\n",
		s.Claimed, s.Delivered, s.Retried, s.Dead, s.LeaseLost, s.Errors)
	fmt.Printf("  broker           received %d attempts, accepted %d events\n", broker.attempts(), broker.accepted())
	if total != nOrders || counts["delivered"]+counts["dead"] != total {
		fmt.Println("  MISMATCH: every committed order must have exactly one event, delivered or dead")
		return 1
	}
	fmt.Println("  every committed order has its event, and every event was delivered or dead-lettered")
	return 0
}

// setup creates the outbox table with the library's migrations, and the shop's own tables.
func setup(ctx context.Context, db *sql.DB) error {
	if err := migrations.Up(ctx, db, "sqlite", migrations.Options{}); err != nil {
		return err
	}
	for _, q := range []string{
		`CREATE TABLE inventory (item TEXT PRIMARY KEY, stock INTEGER NOT NULL CHECK (stock >= 0))`,
		`INSERT INTO inventory (item, stock) VALUES ('espresso beans', 20), ('grinder', 3), ('filter papers', 50)`,
		`CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT NOT NULL, item TEXT NOT NULL,
			qty INTEGER NOT NULL, total_cents INTEGER NOT NULL, currency TEXT NOT NULL)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// refusal is a business reason to turn an order down.
type refusal string

func (r refusal) Error() string { return string(r) }

// placeOrder takes stock, records the order and enqueues its event in one transaction.
func placeOrder(ctx context.Context, db *sql.DB, store *outbox.Store, o order) (err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	var stock int
	if err := tx.QueryRowContext(ctx, `SELECT stock FROM inventory WHERE item = ?`, o.Item).Scan(&stock); err != nil {
		return err
	}
	if stock < o.Qty {
		return refusal(fmt.Sprintf("only %d x %s in stock", stock, o.Item))
	}
	if _, err := tx.ExecContext(ctx, `UPDATE inventory SET stock = stock - ? WHERE item = ?`, o.Qty, o.Item); err != nil {
		return err
	}
	total := o.Qty * o.Cents
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, customer, item, qty, total_cents, currency) VALUES (?, ?, ?, ?, ?, ?)`,
		o.ID, o.Customer, o.Item, o.Qty, total, o.Currency); err != nil {
		return err
	}
	payload, err := json.Marshal(event{OrderID: o.ID, Customer: o.Customer, Item: o.Item, Qty: o.Qty, TotalCents: total, Currency: o.Currency})
	if err != nil {
		return err
	}
	_, err = store.Enqueue(ctx, tx, outbox.Message{
		Namespace:    "shop",
		Topic:        "order.placed",
		DedupeKey:    fmt.Sprintf("order-%d/placed", o.ID),
		PartitionKey: fmt.Sprintf("order-%d", o.ID),
		Headers:      outbox.Headers{"content-type": "application/json"},
		Payload:      payload,
	})
	if err != nil {
		return err
	}
	return tx.Commit()
}

// flakyBroker fails in a fixed pattern, so every run tells the same story.
type flakyBroker struct {
	out *console
	mu  sync.Mutex
	n   int            // attempts received
	ok  map[string]int // accepted events by message id
}

func (b *flakyBroker) publish(_ context.Context, d outbox.Delivery) error {
	b.mu.Lock()
	b.n++
	b.mu.Unlock()
	var e event
	if err := json.Unmarshal(d.Payload, &e); err != nil {
		return outbox.Permanent(fmt.Errorf("undecodable payload: %w", err))
	}
	who := fmt.Sprintf("order %d (%s) attempt %d:", e.OrderID, d.Topic, d.Attempt)
	switch {
	case e.Currency != "EUR":
		b.out.say("broker", "%s refused, unknown currency %s", who, e.Currency)
		return outbox.Permanent(fmt.Errorf("schema registry: unknown currency %q", e.Currency))
	case d.Attempt == 1:
		b.out.say("broker", "%s failed, broker unavailable; the publisher will retry with backoff", who)
		return errors.New("broker unavailable")
	case e.OrderID == rateLimited && d.Attempt == 2:
		b.out.say("broker", "%s rate limited; asked to retry after 300ms", who)
		return outbox.RetryAfter(errors.New("rate limited"), 300*time.Millisecond)
	}
	b.mu.Lock()
	if b.ok == nil {
		b.ok = map[string]int{}
	}
	b.ok[d.ID.String()]++
	b.mu.Unlock()
	b.out.say("broker", "%s delivered, %s", who, money(e.TotalCents, e.Currency))
	return nil
}

func (b *flakyBroker) attempts() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

func (b *flakyBroker) accepted() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.ok)
}

// orderOf reads the order id from a delivery's payload, for printing.
func orderOf(d outbox.Delivery) string {
	var e event
	if json.Unmarshal(d.Payload, &e) != nil || e.OrderID == 0 {
		return d.ID.String()
	}
	return fmt.Sprint(e.OrderID)
}

func countByStatus(ctx context.Context, db *sql.DB) (map[string]int, error) {
	rows, err := db.QueryContext(ctx, `SELECT status, COUNT(*) FROM outbox_events GROUP BY status`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	m := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			return nil, err
		}
		m[s] = n
	}
	return m, rows.Err()
}

func money(cents int, currency string) string {
	return fmt.Sprintf("%d.%02d %s", cents/100, cents%100, strings.ToUpper(currency))
}
