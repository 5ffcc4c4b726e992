package mysql_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
)

// TestEnqueueDeadlockIsRetryTransaction makes an Enqueue the statement that closes a
// deadlock: the server rolls its transaction back with error 1213, and the error matches
// outbox.ErrRetryTransaction while still being the driver's error underneath.
func TestEnqueueDeadlockIsRetryTransaction(t *testing.T) {
	t.Parallel()
	e := setupMySQL(t, "")
	ctx := e.ctx
	_, err := e.db.ExecContext(ctx, `CREATE TABLE accounts (id INT PRIMARY KEY, n INT NOT NULL)`)
	require.NoError(t, err)
	_, err = e.db.ExecContext(ctx, `INSERT INTO accounts VALUES (1, 0)`)
	require.NoError(t, err)
	msg := func(i int) outbox.Message {
		return outbox.Message{Namespace: "conflict", Topic: "t", DedupeKey: "k", Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))}
	}

	// The heavier transaction holds the key's stripe and many rows, so that the server picks
	// the other one as the deadlock's victim.
	heavy, err := e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = heavy.Rollback() }()
	batch := []outbox.Message{msg(0)}
	for i := 1; i < 50; i++ {
		batch = append(batch, outbox.Message{Namespace: "conflict", Topic: "t", Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))})
	}
	_, err = e.store.EnqueueBatch(ctx, heavy, batch)
	require.NoError(t, err)

	light, err := e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = light.Rollback() }()
	_, err = light.ExecContext(ctx, `UPDATE accounts SET n = n + 1 WHERE id = 1`)
	require.NoError(t, err)
	enqueued := make(chan error, 1)
	go func() {
		_, err := e.store.Enqueue(ctx, light, msg(1)) // waits for the stripe heavy holds
		enqueued <- err
	}()
	// Wait until the light Enqueue waits for its lock, then close the cycle.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting int
		require.NoError(t, e.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.innodb_trx
			WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE 'INSERT INTO%'`).Scan(&waiting))
		if waiting > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the second Enqueue never waited for the key's stripe")
		time.Sleep(10 * time.Millisecond)
	}
	_, err = heavy.ExecContext(ctx, `UPDATE accounts SET n = n + 1 WHERE id = 1`)
	require.NoError(t, err, "the heavier transaction should not be the victim")

	err = <-enqueued
	require.Error(t, err)
	require.ErrorIs(t, err, outbox.ErrRetryTransaction)
	var me *mysql.MySQLError
	require.True(t, errors.As(err, &me), "the driver's error is still there: %v", err)
	require.EqualValues(t, 1213, me.Number)
	require.NoError(t, heavy.Commit())
}
