package main

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPlanBinlogDelivery: delivery = "log" on MySQL plans the binlog reader with the
// replication DSN (in the driver's form, its password a secret to scrub), the slot as the
// reader's name and the relay's drain timeout; without a replication DSN it reads with the
// database's own.
func TestPlanBinlogDelivery(t *testing.T) {
	t.Parallel()
	plan := func(env map[string]string) (*cli, storePlan) {
		t.Helper()
		c := newCLI(func(k string) string { return env[k] }, io.Discard, io.Discard)
		rc, err := c.loadRelayConfig("", map[string][]string{})
		require.NoError(t, err)
		plans, err := c.planRelay(rc, slog.New(slog.DiscardHandler))
		require.NoError(t, err)
		require.Len(t, plans, 1)
		return c, plans[0]
	}
	env := map[string]string{"OUTBOX_BROKER": "nats://127.0.0.1:4222", "OUTBOX_NAMESPACE": "orders",
		"OUTBOX_DSN": "mysql://app@db.internal:3306/shop", "OUTBOX_DELIVERY": "log", "OUTBOX_DRAIN_TIMEOUT": "7s",
		"OUTBOX_REPLICATION_DSN": "mysql://repl:s3cretpw@db.internal:3306/shop", "OUTBOX_SLOT": "orders_reader"}
	c, p := plan(env)
	require.Nil(t, p.log)
	require.NotNil(t, p.binlog)
	require.Equal(t, "repl:s3cretpw@tcp(db.internal:3306)/shop?parseTime=true", p.binlog.ConnString)
	require.Equal(t, "orders_reader", p.binlog.Name)
	require.Equal(t, "orders", p.binlog.Namespace)
	require.Equal(t, 7*time.Second, p.binlog.ShutdownTimeout)
	require.Contains(t, c.secrets, "s3cretpw")

	delete(env, "OUTBOX_REPLICATION_DSN")
	delete(env, "OUTBOX_SLOT")
	_, p = plan(env)
	require.Equal(t, "app@tcp(db.internal:3306)/shop?parseTime=true", p.binlog.ConnString)
	require.Empty(t, p.binlog.Name, "the reader's default name")
}
