package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/testdb"
)

// logCounter counts log records by level and message prefix, and passes Warn and above on
// to the test log.
type logCounter struct {
	slog.Handler
	mu   sync.Mutex
	msgs []string
}

func (h *logCounter) Enabled(context.Context, slog.Level) bool { return true }

func (h *logCounter) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	h.msgs = append(h.msgs, r.Level.String()+" "+r.Message)
	h.mu.Unlock()
	if r.Level >= slog.LevelWarn {
		return h.Handler.Handle(ctx, r)
	}
	return nil
}

func (h *logCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logCounter) WithGroup(string) slog.Handler      { return h }

func (h *logCounter) count(prefix string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.msgs {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n
}

// TestPublisherCircuitOutage: the destination goes away in the middle of a run, under a
// retry policy that would dead-letter everything within a second (3 attempts, 10ms). The
// circuit opens once; while it is open the database sees at most one claim per probe
// interval however often the publisher is woken, and nothing spends an attempt; once the
// destination is back, delivery resumes within two probe intervals and every message is
// delivered on what the records say is its first attempt. A message that fails
// permanently in the normal run still dies.
func TestPublisherCircuitOutage(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		const n = 600
		d := &ClaimCounter{Dialect: pubDialect(e.backend)}
		store := e.newStore(t, e.db, d)
		ids := e.enqueue(t, "cb", n)
		poison := ids[7]

		var down atomic.Bool
		var delivered atomic.Int64
		var mu sync.Mutex
		seen := map[uuid.UUID][]int{} // attempts delivered per id
		tr := outbox.TransportFunc(func(ctx context.Context, batch []outbox.Delivery) []error {
			errs := make([]error, len(batch))
			isDown := down.Load() // a call reaches the destination or not, whole
			for i, m := range batch {
				switch {
				case isDown:
					errs[i] = outbox.Unavailable(errors.New("dial tcp: connection refused"))
				case m.ID == poison:
					errs[i] = outbox.Permanent(errors.New("schema rejected"))
				default:
					mu.Lock()
					seen[m.ID] = append(seen[m.ID], m.Attempt)
					mu.Unlock()
					// The destination goes away in the middle of the run.
					if delivered.Add(1) == n/3 {
						down.Store(true)
					}
				}
			}
			time.Sleep(2 * time.Millisecond) // a broker's round trip: the run takes a while
			return errs
		})
		logs := &logCounter{Handler: testLogger(t).Handler()}
		o := fastOptions(t, "cb")
		o.Concurrency = 2
		o.Retry = outbox.RetryPolicy{BaseDelay: 10 * time.Millisecond, MaxDelay: 10 * time.Millisecond, MaxAttempts: 3}
		o.Circuit = outbox.CircuitOptions{ProbeMin: 200 * time.Millisecond, ProbeMax: 800 * time.Millisecond}
		o.Logger = slog.New(logs)
		p, err := outbox.NewPublisher(store, tr, o)
		require.NoError(t, err)
		stop := start(t, p)

		var openedAt time.Time
		testdb.Poll(t, 20*time.Second, "the circuit to open", func() bool {
			st := p.Stats()
			openedAt = st.CircuitOpenedAt
			return st.CircuitOpen
		})
		// Wake-ups must not bypass the open circuit: enqueues on the store, and Wake.
		const outage = 3 * time.Second
		extra := make(chan []uuid.UUID, 1)
		go func() {
			var more []uuid.UUID
			for end := time.Now().Add(outage - 200*time.Millisecond); time.Now().Before(end); {
				p.Wake()
				if len(more) < 20 {
					res, err := store.EnqueueStandalone(context.Background(), outbox.Message{Namespace: "cb", Topic: "t", Payload: []byte(`{}`)})
					if err == nil {
						more = append(more, res[0].ID)
					}
				}
				time.Sleep(10 * time.Millisecond)
			}
			extra <- more
		}()
		time.Sleep(outage) // the outage's length; what happens meanwhile is checked below
		more := <-extra
		st := p.Stats()
		require.True(t, st.CircuitOpen, "%+v", st)
		restored := time.Now()
		claimsOpen := d.Between(openedAt, restored)
		// Probes come at 200ms, 400ms, 800ms, 800ms, ... (plus jitter): in 3s, at most 6.
		maxClaims := 1 + int(restored.Sub(openedAt)/o.Circuit.ProbeMin)
		t.Logf("%s: %d claims in the %s the circuit was open (bound %d); stats %+v", e.backend, claimsOpen,
			restored.Sub(openedAt).Round(time.Millisecond), maxClaims, st)
		require.LessOrEqual(t, claimsOpen, 6, "claims while the circuit was open")
		require.LessOrEqual(t, claimsOpen, maxClaims)
		require.Zero(t, st.Retried, "an outage is not a retry")
		require.Positive(t, st.Unavailable)
		m := e.counts(t)
		require.Equal(t, 1, m[outbox.StatusDead], "only the poison message is dead: %v", m)
		requireAttemptsAtMost(t, e, 1)

		down.Store(false)
		testdb.Poll(t, 2*o.Circuit.ProbeMax+time.Second, "delivery to resume", func() bool { return !p.Stats().CircuitOpen })
		resumed := time.Since(restored)
		e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool {
			return m[outbox.StatusDelivered] == n-1+len(more)
		})
		stop()
		st = p.Stats()
		t.Logf("%s: resumed %s after the destination came back; %+v", e.backend, resumed.Round(time.Millisecond), st)
		require.LessOrEqual(t, resumed, 2*(o.Circuit.ProbeMax+o.Circuit.ProbeMax/4), "delivery resumes within two probe intervals")

		require.Equal(t, outbox.StatusDead, e.get(t, poison).Status, "a permanent failure still dies")
		require.EqualValues(t, 1, st.Dead)
		require.Zero(t, st.Retried)
		require.EqualValues(t, 1, st.CircuitOpens)
		requireAttemptsAtMost(t, e, 1)
		mu.Lock()
		for id, attempts := range seen {
			require.Equal(t, []int{1}, attempts, "message %s", id)
		}
		mu.Unlock()
		require.Equal(t, 1, logs.count("WARN outbox publisher: destination unavailable; circuit open"), "one Warn when it opens")
		require.Equal(t, 1, logs.count("INFO outbox publisher: destination reachable again"), "one Info when it closes")
		require.Zero(t, logs.count("WARN outbox publisher: destination unavailable; will retry"), "no line per batch")
	})
}

// requireAttemptsAtMost fails unless every row has at most max attempts.
func requireAttemptsAtMost(t *testing.T, e *pubEnv, max int) {
	t.Helper()
	var over int
	require.NoError(t, e.db.QueryRow(e.rebind(`SELECT COUNT(*) FROM outbox_events WHERE attempts > ?`), max).Scan(&over))
	require.Zero(t, over, "rows with more than %d attempts", max)
}

// TestPublisherPartialUnavailable: a batch where some messages are delivered and others
// report their destination unavailable settles the delivered ones as usual and gives the
// others their attempt back (with one attempt allowed, a spent one would kill those that
// fail once); one that the destination refuses for good spends its attempts once it is
// retried alone, and is dead-lettered at the attempt limit instead of being retried forever
// at no cost. Nothing opens the circuit.
func TestPublisherPartialUnavailable(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ids := e.enqueue(t, "partial", 40)
		odd := map[uuid.UUID]bool{}
		for i, id := range ids {
			odd[id] = i%2 == 1
		}
		refused := ids[1]
		var mu sync.Mutex
		failed := map[uuid.UUID]int{}
		tr := outbox.TransportFunc(func(ctx context.Context, batch []outbox.Delivery) []error {
			mu.Lock()
			defer mu.Unlock()
			errs := make([]error, len(batch))
			for i, m := range batch {
				if m.ID == refused || odd[m.ID] && failed[m.ID] < 1 {
					failed[m.ID]++
					errs[i] = outbox.Unavailable(fmt.Errorf("message %d: 503 Service Unavailable", i))
				}
			}
			return errs
		})
		o := fastOptions(t, "partial")
		o.Retry = outbox.RetryPolicy{BaseDelay: 10 * time.Millisecond, MaxDelay: 10 * time.Millisecond, MaxAttempts: 1}
		p, err := outbox.NewPublisher(e.store, tr, o)
		require.NoError(t, err)
		stop := start(t, p)
		e.waitCounts(t, 20*time.Second, func(m map[outbox.Status]int) bool {
			return m[outbox.StatusDelivered] == 39 && m[outbox.StatusDead] == 1
		})
		stop()
		st := p.Stats()
		require.EqualValues(t, 1, st.Dead)
		require.Zero(t, st.CircuitOpens, "a destination that answers is not down")
		// Each odd message's refusal beside delivered ones gave its attempt back, the refused
		// one's too (once, and again whenever its retry shared a batch with delivered ones).
		require.GreaterOrEqual(t, st.Unavailable, int64(20))
		require.EqualValues(t, 39, st.Delivered)
		rec := e.get(t, refused)
		require.Equal(t, outbox.StatusDead, rec.Status)
		require.Equal(t, 1, rec.Attempts)
		require.Contains(t, rec.LastError, "attempt limit reached (1 of 1)")
		mu.Lock()
		require.EqualValues(t, st.Unavailable-19+1, failed[refused], "refused for free beside delivered ones, then once per attempt")
		mu.Unlock()
		requireAttemptsAtMost(t, e, 1)
	})
}

// TestPublisherFlappingCostsNoAttempts: a broker whose connection is cut in the middle of
// batches fails some messages Unavailable beside delivered ones, and then, retried alone,
// again while it is still down. Its errors say it did not answer (a refused dial), so none of
// them spends an attempt: with one attempt allowed, nothing is dead-lettered.
func TestPublisherFlappingCostsNoAttempts(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ids := e.enqueue(t, "flap", 40)
		odd := map[uuid.UUID]bool{}
		for i, id := range ids {
			odd[id] = i%2 == 1
		}
		var mu sync.Mutex
		failed := map[uuid.UUID]int{}
		tr := outbox.TransportFunc(func(ctx context.Context, batch []outbox.Delivery) []error {
			mu.Lock()
			defer mu.Unlock()
			errs := make([]error, len(batch))
			for i, m := range batch {
				if odd[m.ID] && failed[m.ID] < 3 {
					failed[m.ID]++
					errs[i] = outbox.Unavailable(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
				}
			}
			return errs
		})
		o := fastOptions(t, "flap")
		o.Retry = outbox.RetryPolicy{BaseDelay: 10 * time.Millisecond, MaxDelay: 10 * time.Millisecond, MaxAttempts: 1}
		o.Circuit = outbox.CircuitOptions{Disabled: true} // retried alone at once, as while the circuit is closed
		p, err := outbox.NewPublisher(e.store, tr, o)
		require.NoError(t, err)
		stop := start(t, p)
		e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == 40 })
		stop()
		require.Zero(t, p.Stats().Dead)
		requireAttemptsAtMost(t, e, 1) // the delivery itself
	})
}

// TestPublisherCircuitShutdown: Run returns promptly while the circuit is open and its next
// probe is far away, and leaves no goroutine behind. Not parallel: goleak sees the whole
// process.
func TestPublisherCircuitShutdown(t *testing.T) {
	e := pubSetup(t, "sqlite")
	e.enqueue(t, "shut", 5)
	tr := outbox.TransportFunc(func(ctx context.Context, batch []outbox.Delivery) []error {
		errs := make([]error, len(batch))
		for i := range errs {
			errs[i] = outbox.Unavailable(nil)
		}
		return errs
	})
	o := fastOptions(t, "shut")
	o.Circuit.ProbeMin = time.Minute
	p, err := outbox.NewPublisher(e.store, tr, o)
	require.NoError(t, err)
	leaks := goleakBaseline()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx) }()
	testdb.Poll(t, 10*time.Second, "the circuit to open", func() bool { return p.Stats().CircuitOpen })
	cancel()
	cancelled := time.Now()
	require.NoError(t, <-errc)
	require.Less(t, time.Since(cancelled), time.Second, "shutdown while the circuit is open")
	goleak.VerifyNone(t, leaks...)
	require.Zero(t, e.counts(t)[outbox.StatusDead])
}

// An Unavailable outcome never dead-letters, whatever the attempts; Permanent wins over it.
func TestRetryPolicyUnavailable(t *testing.T) {
	t.Parallel()
	p := outbox.RetryPolicy{BaseDelay: time.Second, MaxDelay: time.Minute, MaxAttempts: 3}
	for _, attempts := range []int{1, 3, 50} {
		o := p.Outcome(outbox.Failure{Attempts: attempts, Err: outbox.Unavailable(errors.New("refused"))})
		require.Equal(t, outbox.StatusPending, o.Status, "attempts %d", attempts)
		require.True(t, o.RefundAttempt)
		b := p.Backoff(attempts)
		require.True(t, o.Delay >= b/2 && o.Delay <= b, "delay %s", o.Delay)
	}
	o := p.Outcome(outbox.Failure{Attempts: 1, Err: outbox.Unavailable(outbox.RetryAfter(errors.New("503"), 7*time.Second))})
	require.Equal(t, 7*time.Second, o.Delay)
	o = p.Outcome(outbox.Failure{Attempts: 1, Err: outbox.Permanent(outbox.Unavailable(nil))})
	require.Equal(t, outbox.StatusDead, o.Status)
	require.False(t, o.RefundAttempt)
	o = p.Outcome(outbox.Failure{Attempts: 3, Err: errors.New("500")})
	require.Equal(t, outbox.StatusDead, o.Status)
	require.False(t, o.RefundAttempt)
}
