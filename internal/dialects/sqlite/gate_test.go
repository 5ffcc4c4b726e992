package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/outboxgo/outbox/dialect"
)

// TestSQLiteGateHonoursContext: a library write waiting for its turn at the pool's gate
// gives up when its context ends, and gives the turn back after a failed write.
func TestSQLiteGateHonoursContext(t *testing.T) {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "gate.db"))
	require.NoError(t, err)
	defer db.Close()
	gate := sqliteGateOf(db)
	require.Equal(t, gate, sqliteGateOf(db), "one gate per pool")
	tbl, err := dialect.NewTable("outbox_events")
	require.NoError(t, err)
	ack := []dialect.Outcome{{Lease: dialect.Lease{ID: uuid.New(), Token: uuid.New()}, Status: dialect.StatusDelivered}}

	gate <- struct{}{} // another library write has the turn
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = New().Complete(ctx, db, tbl, ack)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	<-gate

	// With the turn free the same write reaches SQLite (and fails there: no table).
	_, err = New().Complete(context.Background(), db, tbl, ack)
	require.Error(t, err)
	require.False(t, errors.Is(err, context.DeadlineExceeded))
	require.Empty(t, gate, "the turn is given back after a failed write")
}

// TestSQLiteGateIsDroppedWithItsPool: the gates do not keep pools alive, nor grow with
// every pool a program ever opened.
func TestSQLiteGateIsDroppedWithItsPool(t *testing.T) {
	var key weak.Pointer[sql.DB]
	func() {
		db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "gone.db"))
		require.NoError(t, err)
		sqliteGateOf(db)
		key = weak.Make(db)
		require.NoError(t, db.Close())
	}()
	present := func() bool { _, ok := sqliteGates.Load(key); return ok }
	require.True(t, present())
	deadline := time.Now().Add(5 * time.Second)
	for present() && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	require.False(t, present(), "the gate of a dropped pool is removed")
}
