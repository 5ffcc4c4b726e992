package pgxv5_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/pgxv5"
)

// The publisher's listener holds a connection of the pgx pool while it runs; when it stops,
// that connection must not go back to the pool still listening, where the service's own
// pgx code would get it.
func TestListenerConnectionNotReturnedListening(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, outbox.Options{})
	app := "outbox_pgxv5_" + uuid.NewString()[:8]
	pcfg, err := pgxpool.ParseConfig(e.dsn + "&application_name=" + app)
	require.NoError(t, err)
	pcfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	defer pool.Close()
	store, err := pgxv5.New(pool, outbox.Options{})
	require.NoError(t, err)
	defer store.DB().Close()
	p, err := outbox.NewPublisher(store, newRecorder().transport(), outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "shop"}})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	waitFor(t, 10*time.Second, "the listener", func() bool {
		var n int
		require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'`, app).Scan(&n))
		return n == 1
	})
	stop()
	require.NoError(t, <-done)
	// Every connection the pool hands out now listens to nothing.
	for range 2 {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer c.Release()
		var n int
		require.NoError(t, c.QueryRow(ctx, `SELECT count(*) FROM pg_listening_channels()`).Scan(&n))
		require.Zero(t, n, "a connection of the pool still listens")
	}
}
