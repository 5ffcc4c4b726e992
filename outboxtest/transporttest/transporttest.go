// Package transporttest holds what the broker transports' tests share: deliveries with
// varied ids, keys, headers and payloads, a check that a consumer received them byte for
// byte, and a PostgreSQL outbox with a running Publisher for end-to-end and outage tests.
// Every transport module imports it from its own tests.
//
// Support for this repository's own tests and modules ([github.com/outboxgo/outbox/outboxtest]),
// with no compatibility promise.
package transporttest

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/migrations"
	"github.com/outboxgo/outbox/outboxtest/testdb"
	"github.com/outboxgo/outbox/outboxtest/testproxy"
)

// Name returns a name unique to this test run, such as "tr_1a2b3c4d5e6f", made of lowercase
// letters, digits and underscores: valid as a NATS subject token, a stream, a Kafka topic and
// a Redis key.
func Name(prefix string) string {
	return prefix + "_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
}

// Messages returns n messages in namespace ns with varied topics, partition keys, headers
// and payloads (unicode, escapes, nested JSON), every third with a tenant and a dedupe key.
func Messages(ns string, n int) []outbox.Message {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		m := outbox.Message{
			Namespace:    ns,
			Topic:        []string{"order.created", "order.paid", "order.shipped"}[i%3],
			PartitionKey: fmt.Sprintf("order-%d", i%7),
			Headers:      outbox.Headers{"content-type": "application/json", "traceparent": fmt.Sprintf("00-%032x-%016x-01", i+1, i+1)},
			Payload:      json.RawMessage(fmt.Sprintf(`{"i":%d,"name":"caf\u00e9 \"%d\" ü€𝄞","nested":{"a":[1,2.5,null,true]},"s":"\\n\t"}`, i, i)),
		}
		if i%3 == 0 {
			m.TenantID = uuid.New()
			m.DedupeKey = fmt.Sprintf("%s/dedupe-%d", m.TenantID, i)
		}
		if i%5 == 0 {
			m.PartitionKey = "" // some messages have no key
			m.Headers = nil
		}
		msgs[i] = m
	}
	return msgs
}

// Deliveries turns msgs into deliveries as a Publisher would hand them over, each with a
// new id, attempt 1.
func Deliveries(msgs []outbox.Message) []outbox.Delivery {
	ds := make([]outbox.Delivery, len(msgs))
	for i, m := range msgs {
		ds[i] = outbox.Delivery{
			ID: uuid.Must(uuid.NewV7()), Namespace: m.Namespace, Topic: m.Topic, TenantID: m.TenantID,
			DedupeKey: m.DedupeKey, PartitionKey: m.PartitionKey, Headers: m.Headers,
			Payload: m.Payload, Attempt: 1, CreatedAt: time.Now().UTC(),
		}
	}
	return ds
}

// Received is one message as a real consumer read it back from the broker, with the
// transport's fields decoded.
type Received struct {
	// Route is where the broker put it: the subject, topic or stream.
	Route        string
	ID           uuid.UUID
	Namespace    string
	Topic        string
	TenantID     uuid.UUID
	DedupeKey    string
	PartitionKey string
	Attempt      int
	// Headers are the message's own headers, without the transport's.
	Headers outbox.Headers
	Payload []byte
}

// RequireSame fails t unless got holds each of want exactly once (in any order), with every
// field byte for byte.
func RequireSame(t testing.TB, want []outbox.Delivery, got []Received) {
	t.Helper()
	require.Len(t, got, len(want), "messages received")
	byID := make(map[uuid.UUID]Received, len(got))
	for _, g := range got {
		_, dup := byID[g.ID]
		require.False(t, dup, "message %s received twice", g.ID)
		byID[g.ID] = g
	}
	for _, w := range want {
		g, ok := byID[w.ID]
		require.True(t, ok, "message %s not received", w.ID)
		require.Equal(t, w.Namespace, g.Namespace, "namespace of %s", w.ID)
		require.Equal(t, w.Topic, g.Topic, "topic of %s", w.ID)
		require.Equal(t, w.TenantID, g.TenantID, "tenant of %s", w.ID)
		require.Equal(t, w.DedupeKey, g.DedupeKey, "dedupe key of %s", w.ID)
		require.Equal(t, w.PartitionKey, g.PartitionKey, "partition key of %s", w.ID)
		require.Equal(t, w.Attempt, g.Attempt, "attempt of %s", w.ID)
		require.Equal(t, len(w.Headers), len(g.Headers), "headers of %s: %v", w.ID, g.Headers)
		for k, v := range w.Headers {
			require.Equal(t, v, g.Headers[k], "header %q of %s", k, w.ID)
		}
		require.Equal(t, string(w.Payload), string(g.Payload), "payload of %s", w.ID)
	}
}

// IDs returns the distinct ids of got and how many messages repeated an id.
func IDs(got []Received) (distinct map[uuid.UUID]bool, duplicates int) {
	distinct = make(map[uuid.UUID]bool, len(got))
	for _, g := range got {
		if distinct[g.ID] {
			duplicates++
		}
		distinct[g.ID] = true
	}
	return distinct, duplicates
}

// Consumed polls consume until what it returns holds every message of want, up to within,
// and returns its last answer; past the deadline it returns that answer as it is, for the
// caller's assertions to say what is missing. A broker hands a consumer what it confirmed
// to the publisher a moment later (AMQP pushes deliveries to a consumer goroutine), so a
// read right after the last ack can miss the last messages.
func Consumed(t testing.TB, want []outbox.Delivery, consume func() []Received, within time.Duration) []Received {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := consume()
		ids, _ := IDs(got)
		all := true
		for _, d := range want {
			if !ids[d.ID] {
				all = false
				break
			}
		}
		if all || time.Now().After(deadline) {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Outbox is a PostgreSQL outbox in a schema of its own, dropped after the test.
type Outbox struct {
	DB    *sql.DB
	Store *outbox.Store
}

// Postgres migrates a fresh PostgreSQL schema and returns its store.
func Postgres(t testing.TB) *Outbox {
	t.Helper()
	db := testdb.Postgres(t)
	require.NoError(t, migrations.Up(context.Background(), db, "postgres", migrations.Options{}))
	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{})
	require.NoError(t, err)
	return &Outbox{DB: db, Store: store}
}

// Enqueue commits msgs and returns them as the deliveries of their first attempt.
func (o *Outbox) Enqueue(t testing.TB, msgs []outbox.Message) []outbox.Delivery {
	t.Helper()
	res, err := o.Store.EnqueueStandalone(context.Background(), msgs...)
	require.NoError(t, err)
	ds := Deliveries(msgs)
	for i := range ds {
		ds[i].ID = res[i].ID
	}
	return ds
}

// Counts returns how many rows are in each status.
func (o *Outbox) Counts(t testing.TB) map[string]int {
	t.Helper()
	rows, err := o.DB.Query(`SELECT status, COUNT(*) FROM outbox_events GROUP BY status`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		require.NoError(t, rows.Scan(&s, &n))
		out[s] = n
	}
	require.NoError(t, rows.Err())
	return out
}

// Running is a Publisher running in the background until Stop or the end of the test.
type Running struct {
	Publisher *outbox.Publisher
	cancel    context.CancelFunc
	done      chan error
}

// Start runs a Publisher of namespace ns on o through tr, polling every 10ms and retrying
// after 20ms to 200ms, and stops it when the test ends.
func (o *Outbox) Start(t testing.TB, ns string, tr outbox.Transport, batch int) *Running {
	t.Helper()
	pub, err := outbox.NewPublisher(o.Store, tr, outbox.PublisherOptions{
		Scope: outbox.Scope{Namespace: ns}, BatchSize: batch,
		PollInterval: 10 * time.Millisecond, IdleBackoffMax: 50 * time.Millisecond, Lease: 5 * time.Second,
		Retry:  outbox.RetryPolicy{BaseDelay: 20 * time.Millisecond, MaxDelay: 200 * time.Millisecond, MaxAttempts: 1000},
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	return Run(t, pub)
}

// Run runs pub in the background until Stop or the end of the test.
func Run(t testing.TB, pub *outbox.Publisher) *Running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{Publisher: pub, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- pub.Run(ctx) }()
	t.Cleanup(func() { r.Stop(t) })
	return r
}

// Stop stops the publisher and waits for Run to return; it may be called more than once.
func (r *Running) Stop(t testing.TB) outbox.PublisherStats {
	t.Helper()
	r.cancel()
	if r.done != nil {
		require.NoError(t, <-r.done)
		r.done = nil
	}
	return r.Publisher.Stats()
}

// WaitDelivered polls until n rows are delivered, failing t if any row is dead or the
// deadline passes.
func (o *Outbox) WaitDelivered(t testing.TB, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		c := o.Counts(t)
		if c["dead"] > 0 {
			var reason string
			_ = o.DB.QueryRow(`SELECT last_error FROM outbox_events WHERE status = 'dead' LIMIT 1`).Scan(&reason)
			t.Fatalf("dead rows: %v; the first: %s", c, reason)
		}
		if c["delivered"] == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d rows delivered after %s: %v", c["delivered"], n, within, c)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Poll calls fn every 20ms until it returns true, failing t with msg after within.
func Poll(t testing.TB, within time.Duration, fn func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !fn() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: "+msg, append([]any{within}, args...)...)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Strip returns h without the names in drop, or nil when nothing is left.
func Strip(h map[string]string, drop ...string) outbox.Headers {
	out := outbox.Headers{}
	for k, v := range h {
		if !slices.Contains(drop, k) {
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// Failures returns the errors of errs that are not nil.
func Failures(errs []error) []error {
	var out []error
	for _, err := range errs {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// RequireClassify fails t unless classify marks every error of permanent, wrapped once, with
// [outbox.Permanent] (keeping it matchable with errors.Is), none of retryable, neither of
// them with [outbox.Unavailable], and keeps nil.
func RequireClassify(t testing.TB, classify func(error) error, permanent, retryable []error) {
	t.Helper()
	for _, err := range permanent {
		got := classify(fmt.Errorf("publish: %w", err))
		require.True(t, outbox.IsPermanent(got), "%v should be permanent", err)
		require.False(t, outbox.IsUnavailable(got), "%v should not be an outage", err)
		require.ErrorIs(t, got, err)
	}
	for _, err := range retryable {
		got := classify(fmt.Errorf("publish: %w", err))
		require.False(t, outbox.IsPermanent(got), "%v should be retried", err)
		require.False(t, outbox.IsUnavailable(got), "%v should not be an outage", err)
		require.ErrorIs(t, got, err)
	}
	require.NoError(t, classify(nil))
}

// RequireUnavailable fails t unless classify marks every error of outage, wrapped once,
// with [outbox.Unavailable] and not [outbox.Permanent], keeping it matchable with errors.Is.
func RequireUnavailable(t testing.TB, classify func(error) error, outage []error) {
	t.Helper()
	for _, err := range outage {
		got := classify(fmt.Errorf("publish: %w", err))
		require.True(t, outbox.IsUnavailable(got), "%v should be an outage", err)
		require.False(t, outbox.IsPermanent(got), "%v should not be permanent", err)
		require.ErrorIs(t, got, err)
	}
}

// CutAndRestore publishes through tr, directly, while cut has taken the broker away: every
// message of every Publish within the next few calls must fail with an error marked
// [outbox.Unavailable] (and not [outbox.Permanent]). After restore, it publishes until a
// batch is delivered whole, within 30 s, and returns what was delivered. fresh returns a new
// batch each time it is called.
func CutAndRestore(t testing.TB, tr outbox.Transport, fresh func() []outbox.Delivery, cut, restore func()) []outbox.Delivery {
	t.Helper()
	cut()
	for round := range 3 {
		batch := fresh()
		errs := tr.Publish(context.Background(), batch)
		require.Len(t, errs, len(batch), "round %d", round)
		if len(errs) > 0 {
			t.Logf("while cut, round %d: %v", round, errs[0])
		}
		for i, err := range errs {
			require.Error(t, err, "round %d, message %d was delivered through a cut connection", round, i)
			require.True(t, outbox.IsUnavailable(err), "round %d, message %d: %v", round, i, err)
			require.False(t, outbox.IsPermanent(err), "round %d, message %d: %v", round, i, err)
		}
	}
	restore()
	var delivered []outbox.Delivery
	Poll(t, 30*time.Second, func() bool {
		batch := fresh()
		if len(Failures(tr.Publish(context.Background(), batch))) == 0 {
			delivered = batch
			return true
		}
		return false
	}, "no batch delivered after the broker came back")
	return delivered
}

// EndToEnd enqueues 300 messages of namespace ns in a fresh PostgreSQL outbox, runs a
// Publisher through tr until all are delivered, and requires consume, which reads
// everything the broker received for ns, to return each exactly once, byte for byte.
func EndToEnd(t *testing.T, ns string, tr outbox.Transport, consume func() []Received) {
	t.Helper()
	ob := Postgres(t)
	want := ob.Enqueue(t, Messages(ns, 300))
	run := ob.Start(t, ns, tr, 50)
	ob.WaitDelivered(t, 300, 30*time.Second)
	st := run.Stop(t)
	require.EqualValues(t, 300, st.Delivered)
	RequireSame(t, want, Consumed(t, want, consume, 10*time.Second))
}

// Outage runs a Publisher of namespace ns through tr from a fresh PostgreSQL outbox: 60
// messages are delivered, cut takes the broker away, 60 more are enqueued, the publisher's
// circuit opens (the batches fail [outbox.Unavailable]), restore brings the broker back,
// and then all 120 must be delivered with nothing dead. consume reads what the broker holds for ns: every id must be there, and
// when dedupe is true (the broker drops redeliveries) none twice.
func Outage(t *testing.T, ns string, tr outbox.Transport, cut, restore func(), consume func() []Received, dedupe bool) {
	t.Helper()
	ob := Postgres(t)
	run := ob.Start(t, ns, tr, 20)
	first := ob.Enqueue(t, Messages(ns, 60))
	ob.WaitDelivered(t, 60, 20*time.Second)
	cut()
	second := ob.Enqueue(t, Messages(ns, 60))
	Poll(t, 20*time.Second, func() bool { return run.Publisher.Stats().CircuitOpen },
		"the circuit did not open while the broker was away: %+v", run.Publisher.Stats())
	restore()
	ob.WaitDelivered(t, 120, 30*time.Second)
	st := run.Stop(t)
	t.Logf("publisher: %+v", st)
	require.Zero(t, st.Dead)

	got := Consumed(t, append(slices.Clone(first), second...), consume, 10*time.Second)
	ids, dups := IDs(got)
	t.Logf("%d received, %d duplicates", len(got), dups)
	if dedupe {
		require.Zero(t, dups, "the broker stored a redelivery twice")
	}
	require.Len(t, ids, 120)
	for _, d := range append(first, second...) {
		require.True(t, ids[d.ID], "message %s missing", d.ID)
	}
}

// RequireCancelled publishes batch through tr with a cancelled context and requires every
// message to fail with context.Canceled, to be retried, and without waiting for the broker.
func RequireCancelled(t testing.TB, tr outbox.Transport, batch []outbox.Delivery) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	errs := tr.Publish(ctx, batch)
	require.Less(t, time.Since(start), time.Second, "Publish waited despite the cancelled context")
	require.Len(t, errs, len(batch))
	for i, err := range errs {
		require.ErrorIs(t, err, context.Canceled, "message %d", i)
		require.False(t, outbox.IsPermanent(err), "message %d", i)
	}
}

// ClaimCounter wraps a dialect and records when each claim ran, through Claim or
// CompleteAndClaim, keeping the abilities the publisher uses (settle-and-claim, NOTIFY):
// tests of the circuit breaker count the claims made while it was open with Between.
type ClaimCounter struct {
	outbox.Dialect
	mu    sync.Mutex
	times []time.Time
}

func (d *ClaimCounter) note() {
	d.mu.Lock()
	d.times = append(d.times, time.Now())
	d.mu.Unlock()
}

func (d *ClaimCounter) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]outbox.Record, error) {
	d.note()
	return d.Dialect.Claim(ctx, db, t, p)
}

var _ dialect.SettleClaimer = (*ClaimCounter)(nil)

func (d *ClaimCounter) CompleteAndClaim(ctx context.Context, db *sql.DB, t dialect.Table, outs []outbox.Outcome, p dialect.ClaimParams) ([]outbox.Record, []uuid.UUID, error) {
	d.note()
	return d.Dialect.(dialect.SettleClaimer).CompleteAndClaim(ctx, db, t, outs, p)
}

// Signal and Listen pass NOTIFY through where the wrapped dialect has it; elsewhere a
// signal is nothing and listening is unsupported, as the publisher expects of a driver
// that cannot listen.
func (d *ClaimCounter) Signal(ctx context.Context, q dialect.DBTX, t dialect.Table, ns string) error {
	if n, ok := d.Dialect.(dialect.Notifier); ok {
		return n.Signal(ctx, q, t, ns)
	}
	return nil
}

func (d *ClaimCounter) Listen(ctx context.Context, db *sql.DB, t dialect.Table, ready func(), wake func(string)) error {
	if n, ok := d.Dialect.(dialect.Notifier); ok {
		return n.Listen(ctx, db, t, ready, wake)
	}
	return errors.ErrUnsupported
}

// Between counts the claims in (from, to).
func (d *ClaimCounter) Between(from, to time.Time) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, at := range d.times {
		if at.After(from) && at.Before(to) {
			n++
		}
	}
	return n
}

// attempts returns how many rows are delivered and the attempts of every row.
func (o *Outbox) attempts(t testing.TB) (delivered int, attempts map[uuid.UUID]int) {
	t.Helper()
	rows, err := o.DB.Query(`SELECT id, status, attempts FROM outbox_events`)
	require.NoError(t, err)
	defer rows.Close()
	attempts = map[uuid.UUID]int{}
	for rows.Next() {
		var id uuid.UUID
		var st string
		var n int
		require.NoError(t, rows.Scan(&id, &st, &n))
		attempts[id] = n
		if st == string(outbox.StatusDelivered) {
			delivered++
		}
	}
	require.NoError(t, rows.Err())
	return delivered, attempts
}

// CircuitOutage is the broker outage scenario that every transport passes, on PostgreSQL:
// a Publisher with the default circuit breaker and a retry policy that would dead-letter
// everything within a second without it (3 attempts, 10ms apart) drains 5,000 messages
// of namespace ns through tr; a third of the way in, cut takes the broker away for 10 s
// while the publisher is woken every 50ms. Then:
//
//   - nothing is dead, and no row has more attempts than it had when the broker went away,
//     plus one (the claim in flight at the cut, which the refund gives back);
//   - while the circuit was open the database saw at most one claim per probe interval
//     (1 s doubling: 4 or 5 in the 10 s);
//   - delivery resumes within two probe intervals of restore (the interval in force when
//     the broker came back is at most the time the circuit had been open);
//   - consume, which reads what the broker holds for ns, finds every message.
//
// It logs the figures: claims during the outage and the time to resume.
func CircuitOutage(t *testing.T, ns string, tr outbox.Transport, cut, restore func(), consume func() []Received) {
	t.Helper()
	const n, cutFor = 5000, 10 * time.Second
	db := testdb.Postgres(t)
	require.NoError(t, migrations.Up(context.Background(), db, "postgres", migrations.Options{}))
	counter := &ClaimCounter{Dialect: outbox.Postgres()}
	store, err := outbox.New(db, counter, outbox.Options{})
	require.NoError(t, err)
	ob := &Outbox{DB: db, Store: store}
	want := ob.Enqueue(t, Messages(ns, n))

	pub, err := outbox.NewPublisher(store, tr, outbox.PublisherOptions{
		Scope: outbox.Scope{Namespace: ns}, BatchSize: 100, PollInterval: 10 * time.Millisecond, Lease: 5 * time.Second,
		Retry:  outbox.RetryPolicy{BaseDelay: 10 * time.Millisecond, MaxDelay: 10 * time.Millisecond, MaxAttempts: 3},
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	run := Run(t, pub)

	Poll(t, 60*time.Second, func() bool { return pub.Stats().Delivered >= n/3 }, "a third of the messages delivered: %+v", pub.Stats())
	_, before := ob.attempts(t)
	cut()
	cutAt := time.Now()
	Poll(t, 20*time.Second, func() bool { return pub.Stats().CircuitOpen }, "the circuit to open: %+v", pub.Stats())
	openedAt := pub.Stats().CircuitOpenedAt
	for time.Since(cutAt) < cutFor { // wake-ups must not bypass the open circuit
		pub.Wake()
		time.Sleep(50 * time.Millisecond)
	}
	during := pub.Stats()
	deliveredAtRestore, _ := ob.attempts(t)
	restore()
	restoredAt := time.Now()
	claims := counter.Between(openedAt, restoredAt)
	openFor := restoredAt.Sub(openedAt)
	t.Logf("circuit opened %s after the cut; %d claims in the %s it was open before the broker came back; %+v",
		openedAt.Sub(cutAt).Round(time.Millisecond), claims, openFor.Round(time.Millisecond), during)
	require.True(t, during.CircuitOpen, "the circuit closed while the broker was away: %+v", during)
	// Probes at 1, 2, 4, 8 s apart, each up to a quarter later: at most one per second.
	require.LessOrEqual(t, claims, 1+int(openFor/outbox.DefaultProbeMin), "claims while the circuit was open")
	require.LessOrEqual(t, claims, 6, "claims while the circuit was open")

	var resumed time.Duration
	Poll(t, 60*time.Second, func() bool {
		d, _ := ob.attempts(t)
		if d > deliveredAtRestore {
			resumed = time.Since(restoredAt)
			return true
		}
		return false
	}, "delivery to resume after the broker came back")
	interval := min(max(openFor, outbox.DefaultProbeMin), outbox.DefaultProbeMax)
	t.Logf("delivery resumed %s after the broker came back", resumed.Round(time.Millisecond))
	require.LessOrEqual(t, resumed, 2*interval, "delivery resumes within two probe intervals")

	ob.WaitDelivered(t, n, 120*time.Second)
	st := run.Stop(t)
	t.Logf("publisher: %+v", st)
	require.Zero(t, st.Dead)
	_, after := ob.attempts(t)
	for id, a := range after {
		require.LessOrEqual(t, a, before[id]+1, "attempts of %s", id)
	}
	ids, dups := IDs(Consumed(t, want, consume, 10*time.Second))
	t.Logf("%d duplicates", dups)
	for _, d := range want {
		require.True(t, ids[d.ID], "message %s missing", d.ID)
	}
}

// An OutageKind is how [ProxyOutage] takes the broker away.
type OutageKind string

// The outages every transport passes: the connections cut and refused, a broker that keeps
// its connections open and answers nothing, and connections cut again and again.
const (
	Refused   OutageKind = "refused"
	Blackhole OutageKind = "blackhole"
	Flapping  OutageKind = "flapping"
)

// OutageKinds lists every [OutageKind].
var OutageKinds = []OutageKind{Refused, Blackhole, Flapping}

// OutageHold is how long [ProxyOutage] keeps the broker away; the transport's timeouts in
// the test must be well below it, so that batches fail while it lasts.
const OutageHold = 4 * time.Second

// ProxyOutage runs a Publisher of namespace ns through tr, whose client reaches the broker
// through proxy, from a fresh PostgreSQL outbox, under a retry policy that would
// dead-letter a message on its third attempt within a second (3 attempts, 10ms apart) and
// a circuit breaker probing every 200ms to 1s. 200 messages are delivered; then the broker
// goes away as kind says for [OutageHold] while 200 more are enqueued; then it comes back.
// It requires:
//
//   - the circuit breaker opened during the outage (the batches came back Unavailable);
//   - all 400 delivered within 30 s of the broker's return, none dead, and no row above 2
//     attempts (the batch in flight when the outage began may spend one);
//   - consume, which reads what the broker holds for ns, finds every message;
//   - the transport, logging to logs, logged one warning when the broker went away and
//     one line when it came back, for each time it went away (once, unless flapping).
func ProxyOutage(t *testing.T, kind OutageKind, ns string, tr outbox.Transport, proxy *testproxy.Proxy, logs *Logs, consume func() []Received) {
	t.Helper()
	proxyOutage(t, kind, ns, tr, proxy, logs, consume, outbox.PublisherOptions{
		Scope: outbox.Scope{Namespace: ns}, BatchSize: 50, PollInterval: 10 * time.Millisecond,
		IdleBackoffMax: 50 * time.Millisecond, Lease: 10 * time.Second,
		Retry:   outbox.RetryPolicy{BaseDelay: 10 * time.Millisecond, MaxDelay: 10 * time.Millisecond, MaxAttempts: 3},
		Circuit: outbox.CircuitOptions{ProbeMin: 200 * time.Millisecond, ProbeMax: time.Second},
		Logger:  slog.New(slog.DiscardHandler),
	}, OutageHold, 30*time.Second)
}

// DefaultsHold is how long [DefaultsOutage] keeps the broker away: past every transport's
// default timeouts taken twice, since a batch cut in the middle fails as retries and the
// next one as the outage (AMQP's confirmation waits 30 s, a webhook request 15 s and its
// HEAD check 15 s more), so that the circuit opens while it lasts.
const DefaultsHold = 70 * time.Second

// DefaultsOutage is [ProxyOutage] for a broker that keeps its connections open and answers
// nothing for [DefaultsHold], with a Publisher and a transport at their default options (tr
// built with nothing but what reaches the broker and logs): what a production team runs. It
// requires the same, with 120 s after the broker's return for the circuit breaker's probe,
// which backs off up to 30 s by default, and the backlog.
func DefaultsOutage(t *testing.T, ns string, tr outbox.Transport, proxy *testproxy.Proxy, logs *Logs, consume func() []Received) {
	t.Helper()
	proxyOutage(t, Blackhole, ns, tr, proxy, logs, consume, outbox.PublisherOptions{
		Scope: outbox.Scope{Namespace: ns}, Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
	}, DefaultsHold, 120*time.Second)
}

func proxyOutage(t *testing.T, kind OutageKind, ns string, tr outbox.Transport, proxy *testproxy.Proxy, logs *Logs, consume func() []Received,
	opts outbox.PublisherOptions, hold, restoreWithin time.Duration) {
	t.Helper()
	const n = 400
	ob := Postgres(t)
	pub, err := outbox.NewPublisher(ob.Store, tr, opts)
	require.NoError(t, err)
	run := Run(t, pub)

	want := ob.Enqueue(t, Messages(ns, n/2))
	ob.WaitDelivered(t, n/2, 30*time.Second)

	began := time.Now()
	atCut := logs.len()
	stopFlap := make(chan struct{})
	var flapped <-chan struct{}
	switch kind {
	case Refused:
		proxy.Cut()
	case Blackhole:
		proxy.Blackhole()
	case Flapping:
		flapped = proxy.Flap(hold/2, stopFlap)
	default:
		t.Fatalf("unknown outage %q", kind)
	}
	want = append(want, ob.Enqueue(t, Messages(ns, n/2))...)
	Poll(t, hold, func() bool { return pub.Stats().CircuitOpens > 0 },
		"the circuit to open during the %s outage: %+v", kind, pub.Stats())
	time.Sleep(time.Until(began.Add(hold))) // the outage lasts its whole span, whatever happens in it
	if flapped != nil {
		close(stopFlap)
		<-flapped
	} else {
		proxy.Restore()
	}
	restored := time.Now()
	atRestore := logs.len()
	ob.WaitDelivered(t, n, restoreWithin)
	t.Logf("%s: every message delivered %s after the broker came back", kind, time.Since(restored).Round(time.Millisecond))
	st := run.Stop(t)
	t.Logf("publisher: %+v", st)
	require.Zero(t, st.Dead)
	_, attempts := ob.attempts(t)
	for id, a := range attempts {
		require.LessOrEqual(t, a, 2, "attempts of %s", id)
	}
	ids, dups := IDs(Consumed(t, want, consume, 10*time.Second))
	t.Logf("%d duplicates", dups)
	for _, d := range want {
		require.True(t, ids[d.ID], "message %s missing", d.ID)
	}
	lost, back := logs.Count()
	t.Logf("the transport logged: %s", strings.Join(logs.Lines(), "; "))
	require.Positive(t, lost, "no line said the broker went away")
	require.Equal(t, lost, back, "a line when the broker went away, one when it came back")
	if kind != Flapping {
		// The outage is judged by its own lines: a batch that outlives the test's short
		// timeouts on a loaded machine, before the cut or after the broker is back, is a
		// loss of its own, rightly logged as one more pair.
		downBefore, outageLost, backAt := logs.outage(atCut)
		want := 1
		if downBefore {
			want = 0
		}
		require.Equal(t, want, outageLost, "one line when the broker went away (already said before it: %v)", downBefore)
		require.GreaterOrEqual(t, backAt, atRestore, "the line saying the broker was back came while it was away")
	}
}

// Logs is a [slog.Handler] that keeps a transport's log lines: a warning says the broker
// went away, an information line that it came back; debug lines are not kept.
type Logs struct {
	mu    sync.Mutex
	lines []logLine
}

type logLine struct {
	lost bool // a warning, or worse; an information line otherwise
	text string
}

// Logger returns a logger writing to l.
func (l *Logs) Logger() *slog.Logger { return slog.New(l) }

// Count returns how many warnings and information lines were logged.
func (l *Logs) Count() (lost, back int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ln := range l.lines {
		if ln.lost {
			lost++
		} else {
			back++
		}
	}
	return lost, back
}

// Lines returns the lines kept, each as its level, message and attributes.
func (l *Logs) Lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := make([]string, len(l.lines))
	for i, ln := range l.lines {
		lines[i] = ln.text
	}
	return lines
}

// outage reports the lines of the outage that began when l held from lines: whether the
// transport had already said the broker was lost (a warning not yet followed by an
// information line), the warnings from then until the first information line after it,
// and the index of that line (-1 when there is none).
func (l *Logs) outage(from int) (downBefore bool, lost, backAt int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ln := range l.lines[:from] {
		downBefore = ln.lost
	}
	for i, ln := range l.lines[from:] {
		if !ln.lost {
			return downBefore, lost, from + i
		}
		lost++
	}
	return downBefore, lost, -1
}

// len returns how many lines l holds.
func (l *Logs) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}

func (l *Logs) Enabled(_ context.Context, level slog.Level) bool { return level >= slog.LevelInfo }

func (l *Logs) Handle(_ context.Context, r slog.Record) error {
	text := r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool {
		text += " " + a.String()
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, logLine{lost: r.Level >= slog.LevelWarn, text: text})
	return nil
}

func (l *Logs) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *Logs) WithGroup(string) slog.Handler      { return l }
