package e2e_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxgo/outbox/outboxtest/testdb"
)

// rowsPerDatabase is how many events each database of the matrix writes.
const rowsPerDatabase = 20

var topics = []string{"order.created", "order.paid"}

// broker is one transport of the matrix: the URL the relay is given (and its options), and
// a consumer reading what arrives.
type brokerUnderTest struct {
	url string
	env []string
	got *received
}

// natsBroker creates a JetStream stream for ns and reads its subjects.
func natsBroker(t *testing.T, ns string) brokerUnderTest {
	url := testdb.Service(t, "nats", "OUTBOX_NATS_URL", "nats://127.0.0.1:4222")
	nc, err := nats.Connect(url)
	if err != nil {
		testdb.Unavailable(t, "nats", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := context.Background()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: ns, Subjects: []string{ns + ".>"}, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), ns) })
	got := newReceived()
	sub, err := nc.Subscribe(ns+".>", func(m *nats.Msg) { got.add(m.Header.Get("Nats-Msg-Id"), m.Data) })
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, nc.Flush())
	return brokerUnderTest{url: url, got: got}
}

// kafkaBroker starts an in-process Kafka (kfake) on a TCP port with ns's topics.
func kafkaBroker(t *testing.T, ns string) brokerUnderTest {
	var ts []string
	for _, tp := range topics {
		ts = append(ts, ns+"."+tp)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, ts...))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	got := newReceived()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(ts...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			fs.EachRecord(func(r *kgo.Record) {
				for _, h := range r.Headers {
					if h.Key == "Outbox-Id" {
						got.add(string(h.Value), r.Value)
					}
				}
			})
		}
	}()
	t.Cleanup(func() { cancel(); <-done; cl.Close() })
	return brokerUnderTest{url: "kafka://" + c.ListenAddrs()[0], got: got}
}

// amqpBroker declares ns's exchange (the transport's default route) and a queue bound to
// every topic, and consumes it.
func amqpBroker(t *testing.T, ns string) brokerUnderTest {
	url := testdb.Service(t, "rabbitmq", "OUTBOX_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	conn, err := amqp.Dial(url)
	if err != nil {
		testdb.Unavailable(t, "rabbitmq", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclare(ns, "topic", false, true, false, false, nil))
	_, err = ch.QueueDeclare(ns, false, true, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(ns, "#", ns, false, nil))
	deliveries, err := ch.Consume(ns, "", true, false, false, false, nil)
	require.NoError(t, err)
	got := newReceived()
	go func() {
		for d := range deliveries {
			got.add(d.MessageId, d.Body)
		}
	}()
	return brokerUnderTest{url: url, got: got}
}

// redisBroker reads ns's streams.
func redisBroker(t *testing.T, ns, addr string) brokerUnderTest {
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() {
		for _, tp := range topics {
			_ = c.Del(context.Background(), ns+":"+tp).Err()
		}
		_ = c.Close()
	})
	if err := c.Ping(context.Background()).Err(); err != nil {
		testdb.Unavailable(t, "redis", err)
	}
	got := newReceived()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		last := map[string]string{}
		for ctx.Err() == nil {
			for _, tp := range topics {
				key := ns + ":" + tp
				from := "-"
				if l, ok := last[key]; ok {
					from = "(" + l
				}
				msgs, err := c.XRange(ctx, key, from, "+").Result()
				if err != nil {
					continue
				}
				for _, m := range msgs {
					got.add(m.Values["id"].(string), []byte(m.Values["payload"].(string)))
					last[key] = m.ID
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return brokerUnderTest{url: "redis://" + addr, got: got}
}

// webhookSecret returns a Standard Webhooks signing secret.
func webhookSecret() string {
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	return "whsec_" + base64.StdEncoding.EncodeToString(k)
}

// webhookBroker is an httptest receiver; hold, when set, is called before each answer
// (a test holds requests in flight with it).
func webhookBroker(t *testing.T, hold func()) brokerUnderTest {
	got := newReceived()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if hold != nil {
			hold()
		}
		got.add(r.Header.Get("webhook-id"), b)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	secret := webhookSecret()
	return brokerUnderTest{url: srv.URL + "/{namespace}/{topic}", got: got, env: []string{"OUTBOX_BROKER_OPTIONS=secret=" + secret}}
}

// TestRelayDeliversEverywhere: rows written by plain SQL in PostgreSQL, MariaDB and SQLite
// reach each of the five transports through one relay process per transport serving the
// three databases, with their payloads byte for byte; every row ends delivered, and the
// relay's endpoints answer.
func TestRelayDeliversEverywhere(t *testing.T) {
	t.Parallel()
	cases := map[string]func(t *testing.T, ns string) brokerUnderTest{
		"nats":  natsBroker,
		"kafka": kafkaBroker,
		"amqp":  amqpBroker,
		"redis": func(t *testing.T, ns string) brokerUnderTest {
			return redisBroker(t, ns, strings.TrimPrefix(testdb.Service(t, "redis", "OUTBOX_REDIS_ADDR", "127.0.0.1:6379"), "redis://"))
		},
		"webhook": func(t *testing.T, ns string) brokerUnderTest { return webhookBroker(t, nil) },
	}
	for name, mk := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ns := "rl_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
			br := mk(t, ns)
			var dbs []database
			for _, backend := range []string{"postgres", "mysql", "sqlite"} {
				dbs = append(dbs, newDatabase(t, backend))
			}
			want := map[string][]row{}
			// Half the rows wait in the tables before the relay starts, half are written
			// while it runs.
			for _, d := range dbs {
				want[d.backend] = writeRows(t, d, ns, rowsPerDatabase/2)
			}
			args := []string{"--broker", br.url, "--listen", "127.0.0.1:0", "--poll-interval", "50ms", "--watch-interval", "200ms"}
			env := append([]string{"OUTBOX_NAMESPACE=" + ns}, br.env...)
			if name == "webhook" {
				// This cell takes its databases from a config file, the others from flags.
				cfg := "# the relay of the webhook cell\nlog_format = \"json\"\nbatch_size = 10\n"
				for _, d := range dbs {
					cfg += "\n[[database]]\nname = \"" + d.backend + "\"\ndsn = '" + d.dsn + "'\n"
				}
				path := filepath.Join(t.TempDir(), "relay.toml")
				require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
				args = append(args, "--config", path)
			} else {
				for _, d := range dbs {
					args = append(args, "--dsn", d.dsn)
				}
			}
			p := startRelay(t, env, args...)
			for _, d := range dbs {
				want[d.backend] = append(want[d.backend], writeRows(t, d, ns, rowsPerDatabase/2)...)
			}
			for _, d := range dbs {
				testdb.Poll(t, 30*time.Second, d.backend+"'s rows at the broker", func() bool { return br.got.has(want[d.backend]) })
				br.got.requireExact(t, want[d.backend])
				testdb.Poll(t, 10*time.Second, d.backend+"'s rows delivered", func() bool {
					return counts(t, d)["delivered"] == len(want[d.backend])
				})
				require.Equal(t, map[string]int{"delivered": len(want[d.backend])}, counts(t, d))
			}

			code, body := p.get("/healthz")
			require.Equal(t, http.StatusOK, code)
			require.Equal(t, "ok\n", body)
			// Polling delivered the rows whether or not the listener was up yet.
			testdb.Poll(t, 30*time.Second, "the PostgreSQL store's wake-up listener", func() bool {
				_, body := p.get("/readyz")
				return strings.Contains(body, "(wake-up listener connected)")
			})
			code, body = p.get("/readyz")
			require.Equal(t, http.StatusOK, code, body)
			require.True(t, strings.HasPrefix(body, "ready\n"), body)
			require.Contains(t, body, "circuit: closed")
			require.Contains(t, body, "reachable")
			testdb.Poll(t, 10*time.Second, "the backlog gauges", func() bool {
				_, m := p.get("/metrics")
				return strings.Contains(m, `outbox_messages{`)
			})
			_, metrics := p.get("/metrics")
			for _, name := range []string{"outbox_attempts_total{", "messaging_client_sent_messages_total{", "outbox_delivery_lag_seconds_bucket{",
				"messaging_client_operation_duration_seconds_bucket{", "outbox_circuit_open{", "outbox_messages{", "outbox_oldest_undelivered_age_seconds{",
				"outbox_relay_store_up{", `outbox_store="`} {
				require.Contains(t, metrics, name)
			}
			p.signal(syscall.SIGTERM)
			require.Equal(t, 0, p.exit(30*time.Second))
		})
	}
}
