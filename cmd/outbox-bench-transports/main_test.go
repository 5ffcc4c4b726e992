package main

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxgo/outbox/outboxtest/testdb"
)

// Every broker, database and in-process cluster a run opens is closed when it returns.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

// A short run against the real servers (kfake in-process) measures every pair and reports
// every metric, the ordered mode's too (on a few rows: until ordered claims take a key's
// rows together, an ordered Publisher delivers a key's rows about five a second).
func TestRunReportsEveryMetric(t *testing.T) {
	testdb.Postgres(t) // fails or skips, as configured, when PostgreSQL is down
	cfg := config{
		// Enough rows that neither side of a race drains its namespace before the other has
		// published a batch: with 400 (eight batches a side, a pipelined publisher taking two
		// per loop at once) one side once finished first and the ratio came out 0.
		N: 2000, Batch: 50, Workers: 2, Rounds: 1, PgDSN: testdb.PostgresDSN(),
		NatsURL:    testdb.Service(t, "nats", "OUTBOX_NATS_URL", "nats://127.0.0.1:4222"),
		RedisAddr:  testdb.Service(t, "redis", "OUTBOX_REDIS_ADDR", "127.0.0.1:6379"),
		AMQPURL:    testdb.Service(t, "rabbitmq", "OUTBOX_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
		Transports: []string{"nats", "kafka", "redis", "amqp", "webhook"},
		OrderedN:   10,
	}
	rep, err := run(context.Background(), cfg)
	require.NoError(t, err)
	var names []string
	for _, m := range rep.metrics() {
		require.Positive(t, m.Value, m.Metric)
		require.Equal(t, "postgres", m.Backend)
		names = append(names, m.Metric)
	}
	require.Equal(t, []string{
		"e2e_nats_vs_client", "transport_nats_vs_client", "e2e_nats_vs_client_alone",
		"e2e_kafka_vs_client", "transport_kafka_vs_client", "e2e_kafka_vs_client_alone",
		"e2e_redis_vs_client", "transport_redis_vs_client", "e2e_redis_vs_client_alone",
		"e2e_amqp_vs_client", "transport_amqp_vs_client", "e2e_amqp_vs_client_alone",
		"e2e_webhook_vs_client", "transport_webhook_vs_client", "e2e_webhook_vs_client_alone",
		"e2e_nats_ordered_1key_vs_unordered", "e2e_nats_ordered_1key_vs_unkeyed",
	}, names)
	var table strings.Builder
	rep.printTable(&table)
	require.Contains(t, table.String(), "burn-down via transport")
	require.Contains(t, table.String(), "rows on one key: ordered")
}

func TestUnknownTransport(t *testing.T) {
	testdb.Postgres(t)
	_, err := run(context.Background(), config{N: 100, Batch: 50, Workers: 1, Rounds: 1, PgDSN: testdb.PostgresDSN(), Transports: []string{"carrier-pigeon"}})
	require.ErrorContains(t, err, "unknown transport")
}

// -ordered needs NATS among the transports.
func TestOrderedNeedsNATS(t *testing.T) {
	testdb.Postgres(t)
	_, err := run(context.Background(), config{N: 100, Batch: 50, Workers: 1, Rounds: 1, PgDSN: testdb.PostgresDSN(),
		Transports: []string{"webhook"}, OrderedN: 10})
	require.ErrorContains(t, err, "add nats")
}

// With NatsEmbedded, the NATS transport is measured on a server run in the process, whose
// stream allows atomic batch publish, the ordered mode included, and the server is gone
// when run returns (goleak checks its goroutines).
func TestEmbeddedNATS(t *testing.T) {
	testdb.Postgres(t)
	cfg := config{N: 2000, Batch: 50, Workers: 2, Rounds: 1, PgDSN: testdb.PostgresDSN(),
		NatsURL: "nats://127.0.0.1:1", NatsEmbedded: true, NatsAtomic: true, Transports: []string{"nats"}, OrderedN: 10}
	rep, err := run(context.Background(), cfg)
	require.NoError(t, err)
	var names []string
	for _, m := range rep.metrics() {
		require.Positive(t, m.Value, m.Metric)
		names = append(names, m.Metric)
	}
	require.Contains(t, names, "e2e_nats_ordered_1key_vs_unordered")
}
