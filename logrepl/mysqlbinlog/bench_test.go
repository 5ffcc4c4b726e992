package outboxbinlog

import (
	"context"
	"database/sql"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

// stamps is a transport that notes when each message reached it.
type stamps struct {
	mu  sync.Mutex
	got map[uuid.UUID]time.Time
}

func (s *stamps) Publish(_ context.Context, batch []outbox.Delivery) []error {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range batch {
		if _, ok := s.got[d.ID]; !ok {
			s.got[d.ID] = now
		}
	}
	return nil
}

func (s *stamps) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.got)
}

// BenchmarkCommitToPublish measures the time from a producer's commit (when Commit
// returns, on a pool of its own) to the transport, at 100 and 1,000 events a second, for
// the log publisher and for a polling Publisher with its wake-ups (on MariaDB a probe of
// the table, and in-process signals the producer's pool does not share). It reports p50
// and p99 in milliseconds; b.N is ignored: each run sends for two seconds.
//
//	go test -run '^$' -bench CommitToPublish -benchtime 1x ./logrepl/mysqlbinlog
func BenchmarkCommitToPublish(b *testing.B) {
	for _, mode := range []string{"log", "polling"} {
		for _, rate := range []int{100, 1000} {
			b.Run(mode+"/"+map[int]string{100: "100", 1000: "1000"}[rate], func(b *testing.B) {
				benchLatency(b, mode, rate)
			})
		}
	}
}

func benchLatency(b *testing.B, mode string, rate int) {
	dsn := privateServer(b).database(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := sql.Open("mysql", dsn)
	require.NoError(b, err)
	defer db.Close()
	require.NoError(b, migrations.Up(ctx, db, "mysql", migrations.Options{}))
	lease := time.Minute
	if mode == "polling" {
		lease = 0
	}
	store, err := outbox.New(db, outbox.MySQL(), outbox.Options{LogLease: lease})
	require.NoError(b, err)
	tr := &stamps{got: map[uuid.UUID]time.Time{}}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	if mode == "log" {
		p, err := New(store, tr, Options{ConnString: dsn, Scope: outbox.Scope{Namespace: "orders"}, Logger: quiet})
		require.NoError(b, err)
		go func() { done <- p.Run(rctx) }()
		for !p.Stats().Reading {
			time.Sleep(5 * time.Millisecond)
		}
	} else {
		p, err := outbox.NewPublisher(store, tr, outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "orders"}, Logger: quiet})
		require.NoError(b, err)
		go func() { done <- p.Run(rctx) }()
	}
	defer func() { stop(); <-done }()

	// The producer: another pool, as another process would have.
	prod, err := sql.Open("mysql", dsn)
	require.NoError(b, err)
	defer prod.Close()
	pstore, err := outbox.New(prod, outbox.MySQL(), outbox.Options{LogLease: lease})
	require.NoError(b, err)
	n := 2 * rate
	committed := make(map[uuid.UUID]time.Time, n)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	b.ResetTimer()
	for i := range n {
		<-tick.C
		tx, err := prod.BeginTx(ctx, nil)
		require.NoError(b, err)
		res, err := pstore.Enqueue(ctx, tx, msg(i))
		require.NoError(b, err)
		require.NoError(b, tx.Commit())
		committed[res.ID] = time.Now()
	}
	for deadline := time.Now().Add(30 * time.Second); tr.count() < n && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	b.StopTimer()
	require.Equal(b, n, tr.count(), "every event published")
	lat := make([]float64, 0, n)
	tr.mu.Lock()
	for id, c := range committed {
		lat = append(lat, max(0, float64(tr.got[id].Sub(c))/float64(time.Millisecond)))
	}
	tr.mu.Unlock()
	slices.Sort(lat)
	b.ReportMetric(lat[len(lat)/2], "p50_ms")
	b.ReportMetric(lat[len(lat)*99/100], "p99_ms")
}
