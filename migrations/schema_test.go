package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
)

// newSchema creates a schema that the pool's search_path does not include.
func newSchema(t *testing.T, db *sql.DB, prefix string) string {
	t.Helper()
	name := fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano())
	_, err := db.Exec(`CREATE SCHEMA ` + name)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`DROP SCHEMA ` + name + ` CASCADE`) })
	return name
}

func regclass(t *testing.T, db *sql.DB, name string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, db.QueryRow(`SELECT to_regclass($1) IS NOT NULL`, name).Scan(&ok))
	return ok
}

// A table in a schema off the search_path is migrated up and down there, and a Store and a
// Publisher on it deliver, with every statement naming the schema.
func TestSchemaOffTheSearchPath(t *testing.T) {
	ctx := context.Background()
	db := testdb.Postgres(t)
	schema := newSchema(t, db, "myschema")
	opts := migrations.Options{Schema: schema, Ordered: true}
	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{Schema: schema})
	require.NoError(t, err)
	require.ErrorContains(t, store.Check(ctx), "--schema "+schema, "the fix names the schema")
	require.NoError(t, migrations.Up(ctx, db, "postgres", opts))
	require.True(t, regclass(t, db, schema+".outbox_events"))
	require.True(t, regclass(t, db, schema+".outbox_events_order_idx"))
	require.True(t, regclass(t, db, schema+".outbox_events_goose_version"))
	require.False(t, regclass(t, db, "outbox_events"), "nothing is created on the search_path")

	require.NoError(t, store.Check(ctx))
	var got atomic.Int64
	p, err := outbox.NewPublisher(store, outbox.TransportFunc(func(_ context.Context, b []outbox.Delivery) []error {
		got.Add(int64(len(b)))
		return make([]error, len(b))
	}), outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "ns"}, Ordered: true})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = store.Enqueue(ctx, tx, outbox.Message{Namespace: "ns", Topic: "t", Payload: []byte(`{}`), PartitionKey: "k"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	testdb.Poll(t, 10*time.Second, "delivery from the schema", func() bool { return got.Load() == 1 })

	cancel()
	<-done
	done <- nil
	require.NoError(t, migrations.Down(ctx, db, "postgres", opts))
	require.False(t, regclass(t, db, schema+".outbox_events"))
	require.False(t, regclass(t, db, schema+".outbox_events_order_idx"))
}

// The same table name in two schemas has two notification channels: a signal for one never
// wakes a listener of the other.
func TestSchemasDoNotWakeEachOther(t *testing.T) {
	ctx := context.Background()
	db := testdb.Postgres(t)
	a, b := newSchema(t, db, "sa"), newSchema(t, db, "sb")
	ta, err := dialect.NewTableIn(a, outbox.DefaultTable)
	require.NoError(t, err)
	tb, err := dialect.NewTableIn(b, outbox.DefaultTable)
	require.NoError(t, err)
	n := outbox.Postgres().(dialect.Notifier)
	ra, _ := n.(sqlkit.Renderer).RenderSignal(ta, "x")
	rb, _ := n.(sqlkit.Renderer).RenderSignal(tb, "x")
	require.NotEqual(t, ra.Args[0], rb.Args[0], "one channel per schema")
	wakes := make(chan string, 10)
	ready := make(chan struct{})
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- n.Listen(lctx, db, tb, func() { close(ready) }, func(ns string) { wakes <- ns })
	}()
	defer func() { cancel(); <-done }()
	<-ready
	for _, s := range []struct {
		t  dialect.Table
		ns string
	}{{ta, "from-a"}, {tb, "from-b"}} {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, n.Signal(ctx, tx, s.t, s.ns))
		require.NoError(t, tx.Commit())
	}
	// Notifications arrive in commit order: a wake from a would come before b's.
	select {
	case ns := <-wakes:
		require.Equal(t, "from-b", ns)
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up from schema b")
	}
}

// A bad schema name, or a schema on a dialect without schemas, is a ValidationError.
func TestSchemaRefused(t *testing.T) {
	db := testdb.Postgres(t)
	_, err := outbox.New(db, outbox.Postgres(), outbox.Options{Schema: "My-Schema"})
	var ve *outbox.ValidationError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, "Schema", ve.Field)
	for _, d := range []outbox.Dialect{outbox.MySQL(), outbox.SQLite()} {
		_, err := outbox.New(db, d, outbox.Options{Schema: "billing"})
		require.ErrorAs(t, err, &ve, d.Name())
		require.ErrorIs(t, err, errors.ErrUnsupported)
	}
	err = migrations.Up(context.Background(), db, "postgres", migrations.Options{Schema: "1bad"})
	require.ErrorAs(t, err, &ve)
	sq := testdb.SQLite(t)
	err = migrations.Up(context.Background(), sq, "sqlite", migrations.Options{Schema: "billing"})
	require.ErrorAs(t, err, &ve)
}
