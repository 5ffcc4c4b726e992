package faults

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

var backends = []string{"postgres", "mysql"}

// outage is how long a restarted server stays down.
const outage = 2 * time.Second

// TestRestartMidFlow restarts a private database server twice while producers commit and
// publishers deliver: once with a clean shutdown, once with a crash (PostgreSQL's immediate
// shutdown, SIGKILL for MariaDB), each time down for two seconds. Run must neither return
// nor panic during the outages, delivery must resume at every publisher once the server is
// back, and at the end every committed event is delivered, no other is, and no message was
// ever in flight at two publishers at once.
func TestRestartMidFlow(t *testing.T) {
	noLeaks(t)
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			srv := private(t, backend)
			t.Cleanup(func() {
				if err := srv.ensureRunning(); err != nil {
					t.Errorf("start %s again: %v", backend, err)
				}
			})
			opts := defaultFlowOptions()
			f := newFlow(t, srv, opts)
			f.start()
			f.waitDelivered(100, time.Minute)

			for _, crash := range []bool{false, true} {
				mode := map[bool]string{false: "clean shutdown", true: "crash"}[crash]
				require.NoError(t, srv.stop(crash))
				// The outage: publishers and producers keep running against a dead server.
				for end := time.Now().Add(outage); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
					f.checkRunning()
				}
				require.NoError(t, srv.start())
				back := time.Now()
				before := f.delivered()
				first, all := f.waitResumed(back, 30*time.Second)
				f.waitDelivered(before+50, 30*time.Second)
				t.Logf("%s, %s: delivery resumed %s after the server was back (first publisher), %s (every publisher)",
					backend, mode, first.Round(time.Millisecond), all.Round(time.Millisecond))
				// A publisher retries a failed claim after a backoff that doubles up to
				// IdleBackoffMax; the first attempts after the restart may still meet
				// broken pooled connections, each costing one more backoff.
				require.Less(t, all, 3*opts.pub.IdleBackoffMax+2*time.Second, "resume after %s", mode)
			}
			// Producers keep committing after the last restart, then the flow drains.
			f.waitDelivered(f.delivered()+100, time.Minute)
			rep := f.finish(2 * time.Minute)
			t.Logf("%s: %s", backend, rep)
			require.Positive(t, rep.aborted+rep.unknown, "the outages should have failed some transactions")
			require.Positive(t, rep.stats.Errors, "the outages should have failed some publisher calls")
		})
	}
}

// TestKilledConnections kills every connection of the producers' and publishers' pools
// every 100 to 300 ms for eight seconds: pg_terminate_backend on the connections whose
// application_name is this test's, MariaDB's KILL on the connections using this test's
// database. The guarantees are those of TestRestartMidFlow.
func TestKilledConnections(t *testing.T) {
	noLeaks(t)
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			srv := private(t, backend)
			f := newFlow(t, srv, defaultFlowOptions())
			f.start()
			f.waitDelivered(50, time.Minute)

			adm, err := sql.Open(srv.driver(), srv.dsn("", "faults_admin"))
			require.NoError(t, err)
			defer adm.Close()
			ctx, stop := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			var killed, rounds int
			var killErr error
			wg.Go(func() {
				for ctx.Err() == nil {
					n, err := f.killConnections(adm)
					if err != nil {
						killErr = err
						return
					}
					killed += n
					rounds++
					time.Sleep(time.Duration(100+rand.IntN(200)) * time.Millisecond)
				}
			})
			for end := time.Now().Add(8 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
				f.checkRunning()
			}
			stop()
			wg.Wait()
			require.NoError(t, killErr)
			back := time.Now()
			first, all := f.waitResumed(back, 30*time.Second)
			f.waitDelivered(f.delivered()+100, time.Minute)
			rep := f.finish(2 * time.Minute)
			t.Logf("%s: %d connections killed in %d rounds; delivery after the last kill: %s (first publisher), %s (every publisher); %s",
				backend, killed, rounds, first.Round(time.Millisecond), all.Round(time.Millisecond), rep)
			require.Positive(t, killed)
			require.Positive(t, rep.aborted+rep.unknown, "the kills should have failed some transactions")
		})
	}
}

// noLeaks checks, once t and its subtests are done, that every goroutine they started has
// ended, except the private servers' process waiters, which live as long as the servers.
func noLeaks(t *testing.T) {
	opts := []goleak.Option{goleak.IgnoreCurrent(),
		goleak.IgnoreAnyFunction("github.com/outboxgo/outbox/internal/faults.(*server).start.func1")}
	t.Cleanup(func() {
		if err := goleak.Find(opts...); err != nil {
			t.Error(err)
		}
	})
}

// killConnections kills the connections of the flow's pools, and only those, and returns
// how many it killed.
func (f *flow) killConnections(adm *sql.DB) (int, error) {
	ctx := context.Background()
	if f.backend == "postgres" {
		var n int
		err := adm.QueryRowContext(ctx, `SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE left(application_name, length($1)) = $1 AND pid <> pg_backend_pid()) k`, f.app+"_").Scan(&n)
		return n, err
	}
	rows, err := adm.QueryContext(ctx, `SELECT id FROM information_schema.processlist WHERE db = ? AND id <> CONNECTION_ID()`, f.dbName)
	if err != nil {
		return 0, err
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	n := 0
	for _, id := range ids {
		// The connection may have gone on its own meanwhile (unknown thread id).
		if _, err := adm.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id)); err == nil {
			n++
		}
	}
	return n, nil
}
