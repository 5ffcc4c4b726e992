package mysql_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/testdb"
)

// The DBA's settings on MariaDB (session variables through the DSN, as a server's
// defaults would set them): each ends in a clear error or a recovery.

// TestMySQLLockWaitTimeoutOnEnqueue: with innodb_lock_wait_timeout=1, an enqueue that
// waits for a racing producer's uncommitted dedupe key fails after a second with error
// 1205 on the caller's transaction; once the racer commits, the retry finds the key
// taken: one row, nothing lost.
func TestMySQLLockWaitTimeoutOnEnqueue(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	db := reopenMySQL(t, e.db, func(c *mysql.Config) { c.Params = map[string]string{"innodb_lock_wait_timeout": "1"} }, nil)
	s := e.storeOn(t, db)
	msg := myMsg(1)
	msg.DedupeKey = "order-1"

	racer, err := db.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	defer func() { _ = racer.Rollback() }()
	_, err = s.Enqueue(e.ctx, racer, msg)
	require.NoError(t, err)

	tx, err := db.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	start := time.Now()
	_, err = s.Enqueue(e.ctx, tx, msg)
	require.Error(t, err, "the enqueue waits for the racer's key until innodb_lock_wait_timeout")
	var me *mysql.MySQLError
	require.True(t, errors.As(err, &me), "the server's error comes through: %v", err)
	require.EqualValues(t, 1205, me.Number)
	require.Less(t, time.Since(start), 20*time.Second)
	require.NoError(t, tx.Rollback())

	require.NoError(t, racer.Commit())
	res := myEnqueue(t, e.ctx, db, s, msg)
	require.True(t, res[0].Duplicate, "the retry finds the racer's row")
	var n int
	require.NoError(t, db.QueryRowContext(e.ctx, "SELECT COUNT(*) FROM `"+e.table+"`").Scan(&n))
	require.Equal(t, 1, n)
}

// TestMySQLWaitTimeout: with wait_timeout=1 the server closes the pool's connections that
// sit idle for a second; the publisher's next claim, woken by an enqueue, finds one closed,
// takes a new one and delivers, with no error logged.
func TestMySQLWaitTimeout(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	db := reopenMySQL(t, e.db, func(c *mysql.Config) { c.Params = map[string]string{"wait_timeout": "1"} }, nil)
	s, err := outbox.New(db, outbox.MySQL(), outbox.Options{Table: e.table, DisableNotify: true})
	require.NoError(t, err)
	// The pool's one connection, known by its id, idle in the pool.
	db.SetMaxIdleConns(1)
	c, err := db.Conn(e.ctx)
	require.NoError(t, err)
	var id int64
	require.NoError(t, c.QueryRowContext(e.ctx, "SELECT CONNECTION_ID()").Scan(&id))
	require.NoError(t, c.Close())

	var logs lockedBuffer
	delivered := make(chan uuid.UUID, 2)
	p, err := outbox.NewPublisher(s, outbox.PerMessage(func(_ context.Context, d outbox.Delivery) error {
		delivered <- d.ID
		return nil
	}), outbox.PublisherOptions{
		Scope: outbox.Scope{Namespace: "orders"}, PollInterval: 5 * time.Second, IdleBackoffMax: 5 * time.Second,
		Lease: time.Minute, SweepInterval: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	testdb.Poll(t, 30*time.Second, "the server to close the idle connection", func() bool {
		var n int
		err := e.db.QueryRowContext(e.ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?", id).Scan(&n)
		return err == nil && n == 0
	})
	res := myEnqueue(t, e.ctx, db, s, myMsg(1))
	select {
	case got := <-delivered:
		require.Equal(t, res[0].ID, got)
	case <-time.After(30 * time.Second):
		t.Fatalf("not delivered after wait_timeout closed the idle connection: %s", logs.String())
	}
	require.Empty(t, logs.String(), "a closed idle connection is replaced without an error")
}

// lockedBuffer is a bytes.Buffer for a logger that goroutines share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
