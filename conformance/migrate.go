package conformance

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
)

var migrationTests = []test{
	{"UpDownUpWithCustomTable", testMigrationsUpDownUp},
}

func testMigrationsUpDownUp(t *testing.T, h Harness) {
	const table = "conformance_custom_events"
	e := setup(t, h, outbox.Options{Table: table})
	require.NoError(t, h.up(e.ctx, e.db, table), "up twice is a no-op")

	// The custom table works end to end.
	id := e.enqueueN(t, 1)[0]
	recs := e.claim(t, claimOpts(1, time.Minute))
	require.Len(t, recs, 1)
	require.NoError(t, e.store.Ack(e.ctx, recs[0].Lease()))
	require.Equal(t, outbox.StatusDelivered, e.get(t, id).Status)

	// The default table was never created.
	def, err := outbox.New(e.db, h.Dialect, outbox.Options{})
	require.NoError(t, err)
	_, err = def.EnqueueStandalone(e.ctx, msg(1))
	require.Error(t, err, "only the custom table exists")

	require.NoError(t, h.down(e.ctx, e.db, table))
	_, err = e.store.EnqueueStandalone(e.ctx, msg(2))
	require.Error(t, err, "down drops the table")

	require.NoError(t, h.up(e.ctx, e.db, table))
	require.Zero(t, e.count(t))
	e.enqueueN(t, 2)
	require.Len(t, e.claim(t, claimOpts(5, time.Minute)), 2)
}
