// Package exampletest holds what the tests of the data-access examples (examples/sqlx,
// examples/gorm, ...) share. Each example writes a business row and enqueues its event in
// one transaction of its library; its test places one order that commits and one that rolls
// back after its event was enqueued, and then asks this package to prove, with a real
// [outbox.Publisher], that the table holds exactly the committed event and that it reaches
// the transport exactly once.
//
// Support for this repository's own tests and modules ([github.com/outboxgo/outbox/outboxtest]),
// with no compatibility promise.
package exampletest

import (
	"context"
	"database/sql"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

// Namespace is the namespace the examples enqueue in.
const Namespace = "shop"

// Backends are the databases, by the names package internal/testdb gives them, that an
// example runs on when its library supports all three.
var Backends = []string{"postgres", "mysql", "sqlite"}

// Drivers maps each of [Backends] to the database/sql driver name that internal/testdb
// registers and the examples' -driver flag takes.
var Drivers = map[string]string{"postgres": "pgx", "mysql": "mysql", "sqlite": "sqlite"}

// dialects maps each of [Backends] to its outbox dialect.
var dialects = map[string]func() outbox.Dialect{
	"postgres": outbox.Postgres, "mysql": outbox.MySQL, "sqlite": outbox.SQLite,
}

// Outbox is a Store on a test's database that counts the messages enqueued on it.
type Outbox struct {
	*outbox.Store
	enqueued atomic.Int64
}

// New migrates the outbox table on db, a database of backend (from testdb.Open), and
// returns a Store on it.
func New(t testing.TB, db *sql.DB, backend string) *Outbox {
	t.Helper()
	return Open(t, db, backend, func(opts outbox.Options) (*outbox.Store, error) {
		return outbox.New(db, dialects[backend](), opts)
	})
}

// Open is [New] with the Store that open returns for the options it is given, on the
// database of db (the pgx examples open it with pgxv5.New on a pool of their own).
func Open(t testing.TB, db *sql.DB, backend string, open func(outbox.Options) (*outbox.Store, error)) *Outbox {
	t.Helper()
	require.NoError(t, migrations.Up(context.Background(), db, backend, migrations.Options{}))
	o := &Outbox{}
	store, err := open(outbox.Options{Hooks: outbox.StoreHooks{Enqueue: counter{&o.enqueued}}})
	require.NoError(t, err)
	o.Store = store
	return o
}

// Enqueued is how many messages were enqueued without error, in transactions that committed
// or not.
func (o *Outbox) Enqueued() int64 { return o.enqueued.Load() }

// counter is an enqueue hook that counts the messages enqueued without error.
type counter struct{ n *atomic.Int64 }

func (c counter) StartEnqueue(ctx context.Context, _ *outbox.Message) context.Context { return ctx }

func (c counter) EndEnqueue(_ context.Context, _ outbox.Message, res outbox.Result, err error) {
	if err == nil && !res.Duplicate {
		c.n.Add(1)
	}
}

// Shop is an example's shop, written with its data-access library: three units of "book"
// in stock, no order yet.
type Shop struct {
	// Place places order id for quantity units of "book" and enqueues its event in the same
	// transaction, before it takes the stock: when the stock is short it must return
	// OutOfStock, and both the order and the event must roll back.
	Place      func(id int64, quantity int) error
	OutOfStock error
	// Orders returns the ids of the orders the database holds.
	Orders func() ([]int64, error)
}

// Prove places an order that commits and one that rolls back after its event was enqueued,
// and fails t unless the database holds the first order only, and a Publisher delivers its
// event, {"id":1,"sku":"book","quantity":2}, exactly once and nothing else.
func (o *Outbox) Prove(t testing.TB, shop Shop) {
	t.Helper()
	require.NoError(t, shop.Place(1, 2))
	require.ErrorIs(t, shop.Place(2, 2), shop.OutOfStock)
	require.EqualValues(t, 2, o.Enqueued(), "both orders enqueued their event")
	ids, err := shop.Orders()
	require.NoError(t, err)
	require.Equal(t, []int64{1}, ids, "the second order rolled back")
	ds := o.Deliver(t)
	require.Len(t, ds, 1, "only the committed order's event is delivered")
	require.JSONEq(t, `{"id":1,"sku":"book","quantity":2}`, string(ds[0].Payload))
}

// Deliver runs a Publisher on the store, with a transport that records what it receives,
// until no row of [Namespace] is left to deliver, then stops it. It fails t unless every row
// of the table went to the transport exactly once and was recorded as delivered, and
// returns the deliveries in the order the transport received them.
func (o *Outbox) Deliver(t testing.TB) []outbox.Delivery {
	t.Helper()
	ctx := context.Background()
	var (
		mu   sync.Mutex
		seen []outbox.Delivery
	)
	pub, err := outbox.NewPublisher(o.Store, outbox.PerMessage(func(_ context.Context, d outbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, d)
		return nil
	}), outbox.PublisherOptions{
		Scope:        outbox.Scope{Namespace: Namespace},
		PollInterval: 10 * time.Millisecond,
		Logger:       slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- pub.Run(runCtx) }()
	stopped := false
	t.Cleanup(func() { // on failure too: a publisher must not outlive its database
		if !stopped {
			stop()
			<-done
		}
	})

	var st outbox.Stats
	require.Eventually(t, func() bool {
		st, err = o.Stats(ctx, outbox.Scope{Namespace: Namespace})
		return err == nil && st.Delivered > 0 && st.Pending+st.Scheduled+st.Processing+st.Dead == 0
	}, 10*time.Second, 10*time.Millisecond, "rows left to deliver: %+v (%v)", st, err)
	stop()
	stopped = true
	require.NoError(t, <-done)

	mu.Lock()
	defer mu.Unlock()
	require.EqualValues(t, st.Delivered, len(seen), "every row reaches the transport exactly once")
	ids := map[string]bool{}
	for _, d := range seen {
		require.False(t, ids[d.ID.String()], "%s delivered twice", d.ID)
		ids[d.ID.String()] = true
		require.Equal(t, 1, d.Attempt)
	}
	return seen
}
