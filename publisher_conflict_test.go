package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

// conflictDialect fails its first claims with a conflict that outlived the dialect's own
// retries, as a Galera cluster's certification conflicts do, then claims normally.
type conflictDialect struct {
	outbox.Dialect
	fails atomic.Int64
}

func (d *conflictDialect) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]outbox.Record, error) {
	if d.fails.Add(-1) >= 0 {
		return nil, fmt.Errorf("after 4 tries: Error 1213 (40001): Deadlock: wsrep aborted transaction: %w", outbox.ErrRetryTransaction)
	}
	return d.Dialect.Claim(ctx, db, t, p)
}

// levelHandler counts records per level and message.
type levelHandler struct {
	mu     sync.Mutex
	counts map[string]int // "LEVEL message"
}

func (h *levelHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *levelHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *levelHandler) WithGroup(string) slog.Handler            { return h }
func (h *levelHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts[r.Level.String()+" "+r.Message]++
	return nil
}

func (h *levelHandler) count(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.counts[key]
}

// TestPublisherConflictIsAWarning: a claim that fails with ErrRetryTransaction is logged
// at Warn, not Error, counted as an error, and retried until the rows are delivered.
func TestPublisherConflictIsAWarning(t *testing.T) {
	t.Parallel()
	e := pubSetup(t, "sqlite")
	e.enqueue(t, "conflict", 3)
	d := &conflictDialect{Dialect: pubDialect(e.backend)}
	d.fails.Store(2)
	logs := &levelHandler{counts: map[string]int{}}
	o := fastOptions(t, "conflict")
	o.Logger = slog.New(logs)
	rec := newRecorder(nil)
	p, err := outbox.NewPublisher(e.newStore(t, e.db, d), rec.transport("p"), o)
	require.NoError(t, err)
	stop := start(t, p)
	e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == 3 })
	stop()
	require.Equal(t, 2, logs.count("WARN outbox publisher: claim failed"))
	require.Zero(t, logs.count("ERROR outbox publisher: claim failed"))
	require.EqualValues(t, 2, p.Stats().Errors)
}
