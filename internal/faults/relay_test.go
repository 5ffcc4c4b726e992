package faults

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
)

// TestRelayDatabaseDown: a relay serves four SQLite files, a PostgreSQL schema on the
// shared server and a database on a private PostgreSQL server of this test's own, which is
// stopped for three seconds mid-run. While it is down the other stores keep delivering, the
// relay reports the store down (one log line, its state in Stats), and once the server is
// back the store catches up: every event committed anywhere is delivered.
func TestRelayDatabaseDown(t *testing.T) {
	t.Parallel()
	// A server of its own: the suite's shared private server is restarted by other tests.
	srv, err := newServer("postgres")
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = srv.stop(false)
		_ = os.RemoveAll(srv.dir)
	})
	dbName := srv.createDatabase(t)
	downDB, err := sql.Open("pgx", srv.dsn(dbName, "relay_down"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = downDB.Close() })
	require.NoError(t, migrations.Up(context.Background(), downDB, "postgres", migrations.Options{}))

	type member struct {
		name  string
		store *outbox.Store
	}
	var members []member
	open := func(name, backend string, db *sql.DB, d outbox.Dialect) {
		if db == nil {
			db = testdb.Open(t, backend)
			require.NoError(t, migrations.Up(context.Background(), db, backend, migrations.Options{}))
		}
		s, err := outbox.New(db, d, outbox.Options{})
		require.NoError(t, err)
		members = append(members, member{name, s})
	}
	open("down", "postgres", downDB, outbox.Postgres())
	open("pg", "postgres", nil, outbox.Postgres())
	for i := range 4 {
		open(fmt.Sprintf("sqlite-%d", i), "sqlite", nil, outbox.SQLite())
	}

	noLeaks(t) // from here: the pools and testdb's admin pool are not the relay's

	// One transport; deliveries counted per store (the topic is the store's name).
	var mu sync.Mutex
	delivered := map[uuid.UUID]bool{}
	perStore := map[string]int{}
	tr := outbox.TransportFunc(func(_ context.Context, batch []outbox.Delivery) []error {
		mu.Lock()
		defer mu.Unlock()
		for _, d := range batch {
			delivered[d.ID] = true
			perStore[d.Topic]++
		}
		return nil
	})
	count := func(name string) int {
		mu.Lock()
		defer mu.Unlock()
		return perStore[name]
	}

	logs := &lineCounter{}
	relay, err := outbox.NewRelay(tr, outbox.RelayOptions{
		Publisher: outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "relay"}, BatchSize: 50,
			PollInterval: 20 * time.Millisecond, IdleBackoffMax: 200 * time.Millisecond, Lease: 3 * time.Second,
			Logger: slog.New(logs)},
		MaxInFlight: 4, DownBackoffMax: time.Second,
	})
	require.NoError(t, err)
	for _, m := range members {
		require.NoError(t, relay.Add(m.name, m.store))
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- relay.Run(ctx) }()

	// Producers: one per store, an event every 10ms; the one of the down store pauses
	// during the outage, so that every event it counts is committed.
	var down atomic.Bool
	var committed []uuid.UUID
	var cmu sync.Mutex
	stopProducers := make(chan struct{})
	var pwg sync.WaitGroup
	for _, m := range members {
		pwg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stopProducers:
					return
				case <-time.After(10 * time.Millisecond):
				}
				if m.name == "down" && down.Load() {
					continue
				}
				rs, err := m.store.EnqueueStandalone(context.Background(), outbox.Message{Namespace: "relay", Topic: m.name,
					Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))})
				if err != nil {
					if m.name == "down" && down.Load() {
						continue // begun before the outage, cut by it: its row may exist, and is not counted
					}
					t.Errorf("enqueue in %s: %v", m.name, err)
					return
				}
				cmu.Lock()
				committed = append(committed, rs[0].ID)
				cmu.Unlock()
			}
		})
	}
	waitFor := func(what string, within time.Duration, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(within)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %s", what, within)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("every store delivers", 30*time.Second, func() bool {
		for _, m := range members {
			if count(m.name) < 20 {
				return false
			}
		}
		return true
	})

	down.Store(true)
	require.NoError(t, srv.stop(true))
	stopped := time.Now()
	waitFor("the relay reports the store down", 15*time.Second, func() bool {
		return relay.Stats().Stores["down"].State == outbox.StoreDown
	})
	others := count("sqlite-0") + count("pg")
	for time.Since(stopped) < 3*time.Second {
		time.Sleep(20 * time.Millisecond)
	}
	during := count("sqlite-0") + count("pg") - others
	st := relay.Stats().Stores["down"]
	t.Logf("while down: the other stores delivered %d events; the down store: state %s, %d errors, last error %q",
		during, st.State, st.Errors, st.LastError)
	require.Positive(t, during, "the other stores kept delivering")

	require.NoError(t, srv.start())
	back := time.Now()
	down.Store(false)
	waitFor("the store is healthy again", 30*time.Second, func() bool {
		return relay.Stats().Stores["down"].State == outbox.StoreHealthy
	})
	t.Logf("store healthy again %s after the server was back", time.Since(back).Round(time.Millisecond))
	mark := count("down")
	waitFor("the store delivers again", 30*time.Second, func() bool { return count("down") > mark+20 })

	close(stopProducers)
	pwg.Wait()
	cmu.Lock()
	all := append([]uuid.UUID(nil), committed...)
	cmu.Unlock()
	waitFor("every committed event delivered", time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range all {
			if !delivered[id] {
				return false
			}
		}
		return true
	})
	cancel()
	select {
	case err := <-runErr:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
	downLines, claimLines := logs.count("outbox relay: store down"), logs.count("outbox publisher: claim failed")
	t.Logf("%d events committed and delivered; %d relay line(s) saying the store is down, %d claim-failed lines",
		len(all), downLines, claimLines)
	require.Equal(t, 1, downLines, "the outage is logged once")
	require.Zero(t, claimLines, "the failed claims of a store reported down are not logged one by one")
}

// lineCounter is a slog handler that counts messages.
type lineCounter struct {
	mu    sync.Mutex
	lines []string
}

func (h *lineCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *lineCounter) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lines = append(h.lines, r.Message)
	return nil
}
func (h *lineCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *lineCounter) WithGroup(string) slog.Handler      { return h }

func (h *lineCounter) count(prefix string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, l := range h.lines {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}
