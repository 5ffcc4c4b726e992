package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/conformance"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
)

func TestSQLiteConformance(t *testing.T) {
	t.Parallel()
	conformance.Run(t, conformance.Harness{
		Dialect: outbox.SQLite(),
		OpenDB:  func(t testing.TB) *sql.DB { return testdb.SQLite(t) },
	})
}

// TestEnqueueBatchOnDBIsAtomic: a batch enqueued on a bare *sql.DB spans several
// statements (SQLite takes 500 rows per INSERT); when a later one fails, none of the batch
// stays, because the store runs it in one transaction of its own.
func TestEnqueueBatchOnDBIsAtomic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.SQLite(t)
	require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{}))
	_, err := db.Exec(`CREATE TRIGGER boom BEFORE INSERT ON outbox_events WHEN NEW.topic = 'boom'
		BEGIN SELECT RAISE(ABORT, 'injected failure'); END`)
	require.NoError(t, err)
	s, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	require.NoError(t, err)
	msgs := make([]outbox.Message, 800)
	for i := range msgs {
		msgs[i] = outbox.Message{Namespace: "n", Topic: "ok", Payload: json.RawMessage(`{}`)}
	}
	msgs[700].Topic = "boom" // in the second statement
	_, err = s.EnqueueBatch(ctx, db, msgs)
	require.ErrorContains(t, err, "injected failure")
	var n int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM outbox_events`).Scan(&n))
	require.Zero(t, n, "the first statement's 500 rows were rolled back too")
}
