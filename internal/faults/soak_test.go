package faults

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

const (
	soakProducers  = 4
	soakRate       = 200 // events per second, all producers together
	soakPublishers = 4
	soakFailRate   = 0.05
)

// soakSample is one periodic measurement.
type soakSample struct {
	at                    time.Duration
	produced, delivered   int64
	backlog               int
	heapAlloc             uint64 // live heap after a GC
	goroutines            int
	producerConns         sql.DBStats
	publisherConns        []sql.DBStats
	producedPS, deliverPS float64
}

func (s soakSample) String() string {
	var pubs []string
	for _, st := range s.publisherConns {
		pubs = append(pubs, fmt.Sprintf("%d/%d", st.OpenConnections, st.InUse))
	}
	return fmt.Sprintf("t=%4.0fs produced=%d (%.0f/s) delivered=%d (%.0f/s) backlog=%d heap=%.2fMiB goroutines=%d conns(open/in use) producers=%d/%d publishers=%s",
		s.at.Seconds(), s.produced, s.producedPS, s.delivered, s.deliverPS, s.backlog, float64(s.heapAlloc)/(1<<20), s.goroutines,
		s.producerConns.OpenConnections, s.producerConns.InUse, strings.Join(pubs, " "))
}

// soakLedger tracks deliveries by sequence number in constant memory per message, so that
// the test's own bookkeeping does not show as heap growth.
type soakLedger struct {
	mu        sync.Mutex
	delivered []uint8 // deliveries per seq, saturating
	inflight  map[int]string
	overlaps  int
	count     atomic.Int64 // distinct messages delivered
	attempts  atomic.Int64 // publishes, failed ones included
}

func (l *soakLedger) transport(name string) outbox.Transport {
	return outbox.TransportFunc(func(ctx context.Context, batch []outbox.Delivery) []error {
		seqs := make([]int, len(batch))
		l.mu.Lock()
		for i, d := range batch {
			seqs[i], _ = strconv.Atoi(d.Headers["seq"])
			if _, ok := l.inflight[seqs[i]]; ok {
				l.overlaps++
			}
			l.inflight[seqs[i]] = name
		}
		l.mu.Unlock()
		errs := make([]error, len(batch))
		l.mu.Lock()
		defer l.mu.Unlock()
		for i, seq := range seqs {
			delete(l.inflight, seq)
			l.attempts.Add(1)
			if rand.Float64() < soakFailRate {
				errs[i] = errors.New("injected transport failure")
				continue
			}
			for len(l.delivered) <= seq {
				l.delivered = append(l.delivered, 0)
			}
			if l.delivered[seq] == 0 {
				l.count.Add(1)
			}
			if l.delivered[seq] < 255 {
				l.delivered[seq]++
			}
		}
		return errs
	})
}

// soakDuration is SOAK_DURATION, 10 minutes by default.
func soakDuration(t *testing.T) time.Duration {
	v := os.Getenv("SOAK_DURATION")
	if v == "" {
		return 10 * time.Minute
	}
	d, err := time.ParseDuration(v)
	require.NoError(t, err, "SOAK_DURATION")
	return d
}

// TestSoak runs steady producers (200 events/s in all) and four publishers whose transport
// fails 5 % of deliveries against a private PostgreSQL for SOAK_DURATION, sampling
// throughput, backlog, live heap, goroutines and each pool's connections. At the end every
// event is delivered, none was in flight at two publishers at once, and the heap and
// goroutine counts have not grown beyond noise.
func TestSoak(t *testing.T) {
	if os.Getenv("OUTBOX_SOAK") != "1" {
		t.Skip("set OUTBOX_SOAK=1 (make soak)")
	}
	dur := soakDuration(t)
	every := min(max(dur/20, 5*time.Second), 30*time.Second)
	srv := private(t, "postgres")
	name := srv.createDatabase(t)
	open := func(app string) *sql.DB {
		db, err := sql.Open("pgx", srv.dsn(name, "outbox_soak_"+app))
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		return db
	}
	ctx := context.Background()
	monitor := open("monitor")
	require.NoError(t, migrations.Up(ctx, monitor, "postgres", migrations.Options{}))
	goroutinesBefore := runtime.NumGoroutine()
	leakBaseline := goleak.IgnoreCurrent()

	ledger := &soakLedger{inflight: map[int]string{}}
	prodDB := open("producers")
	prodStore, err := outbox.New(prodDB, outbox.Postgres(), outbox.Options{})
	require.NoError(t, err)
	var seq, produced atomic.Int64
	pctx, stopProducers := context.WithCancel(ctx)
	var producers sync.WaitGroup
	var produceErrs atomic.Int64
	pad := strings.Repeat("x", 150)
	for range soakProducers {
		producers.Go(func() {
			tick := time.NewTicker(time.Second * soakProducers / soakRate)
			defer tick.Stop()
			for {
				select {
				case <-pctx.Done():
					return
				case <-tick.C:
				}
				n := seq.Add(1) - 1
				_, err := prodStore.EnqueueStandalone(ctx, outbox.Message{
					Namespace: "soak", Topic: "tick", Headers: outbox.Headers{"seq": strconv.FormatInt(n, 10)},
					Payload: []byte(fmt.Sprintf(`{"seq":%d,"pad":%q}`, n, pad)),
				})
				if err != nil {
					produceErrs.Add(1)
					continue
				}
				produced.Add(1)
			}
		})
	}

	var pubDBs []*sql.DB
	var pubs []*outbox.Publisher
	runCtx, stopPubs := context.WithCancel(ctx)
	runErrs := make(chan error, soakPublishers)
	var running sync.WaitGroup
	for i := range soakPublishers {
		db := open(fmt.Sprintf("pub%d", i))
		pubDBs = append(pubDBs, db)
		s, err := outbox.New(db, outbox.Postgres(), outbox.Options{})
		require.NoError(t, err)
		p, err := outbox.NewPublisher(s, ledger.transport(fmt.Sprintf("pub%d", i)), outbox.PublisherOptions{
			Scope: outbox.Scope{Namespace: "soak"}, WorkerID: fmt.Sprintf("pub%d", i), BatchSize: 50,
			PollInterval: 50 * time.Millisecond, IdleBackoffMax: 500 * time.Millisecond, Lease: 5 * time.Second,
			Retry:  outbox.RetryPolicy{BaseDelay: 10 * time.Millisecond, MaxDelay: time.Second, MaxAttempts: 50},
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		require.NoError(t, err)
		pubs = append(pubs, p)
		running.Go(func() {
			if err := p.Run(runCtx); err != nil || runCtx.Err() == nil {
				runErrs <- fmt.Errorf("pub%d: Run returned %v before it was stopped", i, err)
			}
		})
	}

	began := time.Now()
	var samples []soakSample
	sample := func() soakSample {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		s := soakSample{at: time.Since(began), produced: produced.Load(), delivered: ledger.count.Load(),
			heapAlloc: ms.HeapAlloc, goroutines: runtime.NumGoroutine(), producerConns: prodDB.Stats()}
		require.NoError(t, monitor.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox_events WHERE status IN ('pending', 'processing')`).Scan(&s.backlog))
		for _, db := range pubDBs {
			s.publisherConns = append(s.publisherConns, db.Stats())
		}
		if n := len(samples); n > 0 {
			prev := samples[n-1]
			secs := (s.at - prev.at).Seconds()
			s.producedPS = float64(s.produced-prev.produced) / secs
			s.deliverPS = float64(s.delivered-prev.delivered) / secs
		}
		samples = append(samples, s)
		t.Log(s)
		return s
	}
	sample()
	for time.Since(began) < dur {
		select {
		case err := <-runErrs:
			t.Fatal(err)
		case <-time.After(min(every, dur-time.Since(began))):
		}
		sample()
	}
	// The baseline is the first sample after the warm-up (a tenth of the run, at least one
	// interval), when pools, caches and the scheduler have reached their steady state.
	base := samples[1]
	for _, s := range samples[1:] {
		if s.at >= dur/10 {
			base = s
			break
		}
	}
	end := samples[len(samples)-1]

	stopProducers()
	producers.Wait()
	want := produced.Load()
	deadline := time.Now().Add(2 * time.Minute)
	for ledger.count.Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("delivered %d of %d events within 2 minutes of the producers' stop", ledger.count.Load(), want)
		}
		time.Sleep(50 * time.Millisecond)
	}
	drained := sample()
	stopPubs()
	running.Wait()
	select {
	case err := <-runErrs:
		t.Fatal(err)
	default:
	}
	var stats outbox.PublisherStats
	for _, p := range pubs {
		s := p.Stats()
		stats.Claimed += s.Claimed
		stats.Delivered += s.Delivered
		stats.Retried += s.Retried
		stats.Dead += s.Dead
		stats.LeaseLost += s.LeaseLost
		stats.Errors += s.Errors
	}
	for _, db := range append(pubDBs, prodDB) {
		_ = db.Close()
	}
	// Every goroutine the producers, publishers and their pools started must end (goleak
	// retries for a while: a closed pool's goroutines end shortly after Close returns).
	leaked := goleak.Find(leakBaseline)
	goroutinesAfter := runtime.NumGoroutine()

	ledger.mu.Lock()
	redelivered := 0
	missing := 0
	for i := range int(seq.Load()) {
		switch {
		case i >= len(ledger.delivered) || ledger.delivered[i] == 0:
			missing++ // a failed enqueue leaves its seq unused
		case ledger.delivered[i] > 1:
			redelivered += int(ledger.delivered[i]) - 1
		}
	}
	overlaps := ledger.overlaps
	ledger.mu.Unlock()

	t.Logf("soak %s: %d events produced (%d enqueue errors), %d delivered, %d publishes (%d failed on purpose and retried), %d redeliveries after a successful publish, %d dead, %d lease lost, %d publisher errors, %d double ownership",
		dur, want, produceErrs.Load(), drained.delivered, ledger.attempts.Load(), stats.Retried, redelivered, stats.Dead, stats.LeaseLost, stats.Errors, overlaps)
	t.Logf("soak %s: live heap %.2f MiB at %s, %.2f MiB at %s; goroutines %d then %d; after stop %d (before start %d); mean throughput %.0f/s",
		dur, float64(base.heapAlloc)/(1<<20), base.at.Round(time.Second), float64(end.heapAlloc)/(1<<20), end.at.Round(time.Second),
		base.goroutines, end.goroutines, goroutinesAfter, goroutinesBefore, float64(end.delivered)/end.at.Seconds())

	require.Zero(t, overlaps, "a message was in flight at two publishers at once")
	require.EqualValues(t, want, int64(seq.Load())-int64(missing), "every committed event delivered")
	require.Zero(t, stats.Dead)
	require.Positive(t, stats.Retried, "the transport's failures should have caused retries")
	// Noise: the heap moves with the backlog and the pools' buffers by a few MiB; a leak
	// per message or per batch would grow it by tens of MiB over a soak.
	require.Less(t, end.heapAlloc, base.heapAlloc+base.heapAlloc/2+8<<20, "live heap grew")
	// Goroutines come and go with in-flight batches and lease renewals (samples moved by up
	// to four in short runs); a leak per batch would add thousands.
	require.LessOrEqual(t, end.goroutines, base.goroutines+10, "goroutines grew")
	require.NoError(t, leaked, "goroutines left after the publishers stopped and the pools closed")
}
