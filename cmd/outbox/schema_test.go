package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/outboxtest/testdb"
)

// --schema migrates and reads a table in a schema that the connection's search_path does
// not include.
func TestSchemaFlag(t *testing.T) {
	t.Parallel()
	db := testdb.Open(t, "postgres")
	f := &fixture{backend: "postgres", db: db, dsn: commandDSN(t, "postgres", db)}
	schema := fmt.Sprintf("cli_%d", time.Now().UnixNano())
	_, err := db.Exec(`CREATE SCHEMA ` + schema)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`DROP SCHEMA ` + schema + ` CASCADE`) })

	f.ok(t, "--schema", schema, "migrate", "up")
	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{Schema: schema})
	require.NoError(t, err)
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = store.Enqueue(ctx, tx, outbox.Message{Namespace: "ns", Topic: "t", Payload: []byte(`{}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())

	var st statsJSON
	f.okJSON(t, &st, "--schema", schema, "stats")
	require.Equal(t, int64(1), st.Pending)
	f.fails(t, exitFail, "does not exist", "stats")
	f.fails(t, exitUsage, "invalid --schema", "--schema", "Bad-Name", "stats")
}
