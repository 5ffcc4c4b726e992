package faults

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

const (
	reclaimChildEnv = "OUTBOX_FAULTS_RECLAIM_CHILD"
	reclaimDSNEnv   = "OUTBOX_FAULTS_RECLAIM_DSN"
	reclaimNSEnv    = "OUTBOX_FAULTS_RECLAIM_NS"

	reclaimRounds = 20
	reclaimRows   = 10
	// reclaimLease and reclaimPoll are the lease and poll interval of both the killed
	// publisher and its successor.
	reclaimLease = time.Second
	reclaimPoll  = 50 * time.Millisecond
	// reclaimMargin is what the bound allows beyond lease + poll interval: the successor's
	// claim statement, the publish, and the scheduling of three processes (test, successor
	// goroutines, PostgreSQL backend) on a 2-core machine that other test suites load.
	// Claims there take a few milliseconds when the machine is quiet, and spikes of a few
	// hundred milliseconds were seen under load; 750 ms covers them with room to spare while
	// still failing a successor that waits a second lease or a backed-off poll.
	reclaimMargin = 750 * time.Millisecond
)

// TestReclaimHelperProcess is not a test: it is the publisher that TestLeaseReclaimDelay
// kills, and returns at once in a normal run.
func TestReclaimHelperProcess(t *testing.T) {
	if os.Getenv(reclaimChildEnv) != "1" {
		return
	}
	db, err := sql.Open("pgx", os.Getenv(reclaimDSNEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	// The transport never returns: the process is killed with the batch in flight.
	block := outbox.TransportFunc(func(ctx context.Context, batch []outbox.Delivery) []error {
		<-ctx.Done()
		return nil
	})
	p, err := outbox.NewPublisher(store, block, outbox.PublisherOptions{
		Scope: outbox.Scope{Namespace: os.Getenv(reclaimNSEnv)}, WorkerID: "doomed", BatchSize: 100,
		Lease: reclaimLease, PollInterval: reclaimPoll, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	_ = p.Run(context.Background())
	os.Exit(3) // unreachable: Run only returns when its context is cancelled
}

// TestLeaseReclaimDelay measures, over 20 rounds on a private PostgreSQL, how long after a
// publisher is killed with SIGKILL (its batch in flight) another publisher delivers the
// killed one's rows, and checks that the median round stays under lease + poll interval + a
// margin, and the slowest under that plus a lease: a successor that waits a second lease or
// a backed-off poll does so in every round, which the median shows, while a stall of a
// loaded machine hits a round or two, which only the slowest shows.
func TestLeaseReclaimDelay(t *testing.T) {
	srv := private(t, "postgres")
	name := srv.createDatabase(t)
	dsn := srv.dsn(name, "outbox_faults_reclaim")
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer db.Close()
	ctx := context.Background()
	require.NoError(t, migrations.Up(ctx, db, "postgres", migrations.Options{}))
	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{})
	require.NoError(t, err)

	var sinceKill, sinceExpiry []time.Duration
	for round := range reclaimRounds {
		k, e := reclaimRound(t, store, dsn, fmt.Sprintf("reclaim%d", round))
		sinceKill = append(sinceKill, k)
		sinceExpiry = append(sinceExpiry, e)
	}
	slices.Sort(sinceKill)
	slices.Sort(sinceExpiry)
	bound := reclaimLease + reclaimPoll + reclaimMargin
	t.Logf("lease %s, poll %s, %d rounds of %d rows: delivered after the kill p50 %s p99 %s max %s; after the lease expired p50 %s p99 %s max %s (bound %s after the kill)",
		reclaimLease, reclaimPoll, reclaimRounds, reclaimRows,
		pct(sinceKill, 50), pct(sinceKill, 99), sinceKill[len(sinceKill)-1],
		pct(sinceExpiry, 50), pct(sinceExpiry, 99), sinceExpiry[len(sinceExpiry)-1], bound)
	require.Less(t, pct(sinceKill, 50), bound, "the median round")
	require.Less(t, sinceKill[len(sinceKill)-1], bound+reclaimLease, "the slowest round")
}

// pct returns the p-th percentile of sorted durations (nearest rank), rounded to 1 ms.
func pct(sorted []time.Duration, p int) time.Duration {
	i := (len(sorted)*p+99)/100 - 1
	return sorted[max(i, 0)].Round(time.Millisecond)
}

// reclaimRound enqueues rows in namespace ns, lets a child publisher claim them and kills
// it, then starts a successor and returns how long after the kill, and after the latest
// lease expiry, the successor had delivered them all.
func reclaimRound(t *testing.T, store *outbox.Store, dsn, ns string) (sinceKill, sinceExpiry time.Duration) {
	t.Helper()
	ctx := context.Background()
	msgs := make([]outbox.Message, reclaimRows)
	for i := range msgs {
		msgs[i] = outbox.Message{Namespace: ns, Topic: "t", Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}
	}
	res, err := store.EnqueueStandalone(ctx, msgs...)
	require.NoError(t, err)
	ids := make([]uuid.UUID, len(res))
	for i, r := range res {
		ids[i] = r.ID
	}

	var out bytes.Buffer
	cmd := exec.Command(os.Args[0], "-test.run=^TestReclaimHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), reclaimChildEnv+"=1", reclaimDSNEnv+"="+dsn, reclaimNSEnv+"="+ns)
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	defer func() { _ = cmd.Process.Kill(); <-exited }()

	// Wait until the child holds every row.
	deadline := time.Now().Add(30 * time.Second)
	for {
		held := 0
		for _, id := range ids {
			r, err := store.Get(ctx, id)
			require.NoError(t, err)
			if r.Status == outbox.StatusProcessing {
				held++
			}
		}
		if held == len(ids) {
			break
		}
		select {
		case <-exited:
			t.Fatalf("child exited early: %s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("child did not claim the rows: %s", out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	require.NoError(t, cmd.Process.Kill()) // SIGKILL: no shutdown, no settlement
	killed := time.Now()
	<-exited
	var expiry time.Time
	for _, id := range ids {
		r, err := store.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, "doomed", r.LockedBy)
		if r.LockedUntil.After(expiry) {
			expiry = r.LockedUntil
		}
	}

	var mu sync.Mutex
	delivered := map[uuid.UUID]time.Time{}
	tr := outbox.PerMessage(func(_ context.Context, d outbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		delivered[d.ID] = time.Now()
		return nil
	})
	p, err := outbox.NewPublisher(store, tr, outbox.PublisherOptions{
		Scope: outbox.Scope{Namespace: ns}, WorkerID: "successor", BatchSize: 100,
		Lease: reclaimLease, PollInterval: reclaimPoll, IdleBackoffMax: reclaimPoll,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	pctx, stop := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- p.Run(pctx) }()
	defer func() { stop(); require.NoError(t, <-runErr) }()

	deadline = time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(delivered)
		var last time.Time
		for _, at := range delivered {
			if at.After(last) {
				last = at
			}
		}
		mu.Unlock()
		if n == len(ids) {
			return last.Sub(killed), last.Sub(expiry)
		}
		if time.Now().After(deadline) {
			t.Fatalf("successor delivered %d of %d rows within 30s", n, len(ids))
		}
		time.Sleep(5 * time.Millisecond)
	}
}
