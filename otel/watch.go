package outboxotel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/outboxgo/outbox"
)

// DefaultWatchInterval is how often a [StoreWatcher] reads [outbox.Store.Stats] when
// [WatchOptions.Interval] is zero.
const DefaultWatchInterval = 15 * time.Second

// ErrWatched is returned by [Telemetry.WatchStore] for a store that is watched already: one
// poller per store is enough, whatever the number of publishers.
var ErrWatched = errors.New("outboxotel: store is watched already")

// WatchOptions configure [Telemetry.WatchStore].
type WatchOptions struct {
	// Interval is the pause between two reads of [outbox.Store.Stats], one query each.
	// Default [DefaultWatchInterval]; at least 100ms.
	Interval time.Duration
	// Scope restricts the gauges to a namespace, topics or a tenant. Default: the whole
	// table.
	Scope outbox.Scope
	// Logger receives a warning when a read fails (the gauges then keep the last values).
	// Default [slog.Default].
	Logger *slog.Logger
	// Name, when set, is the outbox.store attribute of the store's gauges: a process that
	// watches several databases (a relay's stores, by their names) must tell them apart,
	// or two stores' topics of the same name would report one series. Default: none.
	Name string
}

// StoreWatcher reads a store's [outbox.Store.Stats] every interval for the gauges
// outbox.messages, outbox.oldest_pending.age and outbox.oldest_undelivered.age. Stop it with [StoreWatcher.Close].
type StoreWatcher struct {
	t       *Telemetry
	store   *outbox.Store
	opts    WatchOptions
	cancel  context.CancelFunc
	done    chan struct{}
	queries atomic.Int64

	mu   sync.Mutex
	last *outbox.Stats
	seen map[[2]string]bool // (namespace, topic) reported once: reported as 0 when gone
}

// WatchStore starts the poller of store's gauges: a first read at once, then one every
// interval, on a goroutine of its own. A collection of the metrics reads the last
// snapshot and runs no query. A store already watched returns [ErrWatched]; bad options a
// [*outbox.ValidationError].
func (t *Telemetry) WatchStore(store *outbox.Store, opts WatchOptions) (*StoreWatcher, error) {
	if store == nil {
		return nil, &outbox.ValidationError{Index: -1, Field: "store", Reason: "is nil"}
	}
	switch {
	case opts.Interval == 0:
		opts.Interval = DefaultWatchInterval
	case opts.Interval < 100*time.Millisecond:
		return nil, &outbox.ValidationError{Index: -1, Field: "Interval", Reason: fmt.Sprintf("must be at least 100ms, got %s", opts.Interval)}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &StoreWatcher{t: t, store: store, opts: opts, cancel: cancel, done: make(chan struct{}), seen: map[[2]string]bool{}}
	t.mu.Lock()
	if _, ok := t.watchers[store]; ok {
		t.mu.Unlock()
		cancel()
		return nil, ErrWatched
	}
	t.watchers[store] = w
	t.mu.Unlock()
	go w.loop(ctx)
	return w, nil
}

func (w *StoreWatcher) loop(ctx context.Context) {
	defer close(w.done)
	tick := time.NewTicker(w.opts.Interval)
	defer tick.Stop()
	for {
		w.poll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (w *StoreWatcher) poll(ctx context.Context) {
	w.queries.Add(1)
	st, err := w.store.Stats(ctx, w.opts.Scope)
	if err != nil {
		if ctx.Err() == nil {
			w.opts.Logger.Warn("outboxotel: reading the outbox's stats failed; the gauges keep their last values", "err", err)
		}
		return
	}
	w.mu.Lock()
	w.last = &st
	w.mu.Unlock()
}

// Refresh reads the stats now, beside the interval's reads.
func (w *StoreWatcher) Refresh(ctx context.Context) { w.poll(ctx) }

// Queries returns how many Stats queries the watcher has run.
func (w *StoreWatcher) Queries() int64 { return w.queries.Load() }

// Close stops the poller and the store's gauges, and waits for the poller to return.
func (w *StoreWatcher) Close() {
	w.t.mu.Lock()
	if w.t.watchers[w.store] == w {
		delete(w.t.watchers, w.store)
	}
	w.t.mu.Unlock()
	w.cancel()
	<-w.done
}

func (w *StoreWatcher) observe(t *Telemetry, o metric.Observer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil {
		return
	}
	present := map[[2]string]bool{}
	report := func(ns, topic string, pending, scheduled, processing, dead int64, oldest, undelivered time.Duration) {
		base := []attribute.KeyValue{NamespaceKey.String(ns), TopicKey.String(topic)}
		if w.opts.Name != "" {
			base = append(base, StoreKey.String(w.opts.Name))
		}
		for _, c := range []struct {
			status string
			n      int64
		}{{"pending", pending}, {"scheduled", scheduled}, {"processing", processing}, {"dead", dead}} {
			o.ObserveInt64(t.messages, c.n, metric.WithAttributes(append(base[:len(base):len(base)], StatusKey.String(c.status))...))
		}
		o.ObserveFloat64(t.oldest, oldest.Seconds(), metric.WithAttributes(base...))
		o.ObserveFloat64(t.undeliv, undelivered.Seconds(), metric.WithAttributes(base...))
	}
	for _, ts := range w.last.Topics {
		k := [2]string{ts.Namespace, ts.Topic}
		present[k], w.seen[k] = true, true
		report(ts.Namespace, ts.Topic, ts.Pending, ts.Scheduled, ts.Processing, ts.Dead, ts.OldestPendingAge, ts.OldestUndeliveredAge)
	}
	for k := range w.seen {
		if !present[k] { // its rows are gone (purged): its gauges fall to zero
			report(k[0], k[1], 0, 0, 0, 0, 0, 0)
		}
	}
}
