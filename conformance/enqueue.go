package conformance

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

var enqueueTests = []test{
	{"RollbackLeavesNoRow", testRollbackLeavesNoRow},
	{"CommitLeavesExactlyOne", testCommitLeavesExactlyOne},
	{"PayloadByteExact", testPayloadByteExact},
	{"Batch", testBatch},
	{"OptionalFieldCombinations", testOptionalFieldCombinations},
	{"DelayedDelivery", testDelayedDelivery},
	{"Standalone", testEnqueueStandalone},
	{"GetNotFound", testGetNotFound},
	{"InsertLeased", testInsertLeased},
}

func testRollbackLeavesNoRow(t *testing.T, h Harness) {
	e := setup(t, h)
	tx, err := e.db.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	res, err := e.store.Enqueue(e.ctx, tx, msg(1))
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())

	_, err = e.store.Get(e.ctx, res.ID)
	require.ErrorIs(t, err, outbox.ErrNotFound)
	require.Zero(t, e.count(t))
	require.Empty(t, e.claim(t, claimOpts(10, time.Minute)))
}

func testCommitLeavesExactlyOne(t *testing.T, h Harness) {
	e := setup(t, h)
	tenant := uuid.New()
	m := outbox.Message{
		Namespace:    "billing",
		Topic:        "invoice.paid",
		TenantID:     tenant,
		DedupeKey:    tenant.String() + "/invoice-7",
		PartitionKey: "invoice-7",
		Headers:      outbox.Headers{"traceparent": "00-abc-def-01", "content-type": "application/json"},
		Payload:      json.RawMessage(`{"invoice":7,"amount":"12.50"}`),
	}
	res := e.enqueue(t, m)[0]
	require.False(t, res.Duplicate)
	require.Equal(t, uuid.Version(7), res.ID.Version(), "ids are time-ordered UUIDv7")
	require.Equal(t, 1, e.count(t))

	r := e.get(t, res.ID)
	sum := sha256.Sum256(m.Payload)
	require.Equal(t, res.ID, r.ID)
	require.Equal(t, m.Namespace, r.Namespace)
	require.Equal(t, m.Topic, r.Topic)
	require.Equal(t, tenant, r.TenantID)
	require.Equal(t, m.DedupeKey, r.DedupeKey)
	require.Equal(t, m.PartitionKey, r.PartitionKey)
	require.Equal(t, m.Headers, r.Headers)
	require.Equal(t, string(m.Payload), string(r.Payload))
	require.Equal(t, sum[:], r.PayloadHash)
	require.Equal(t, outbox.StatusPending, r.Status)
	require.Zero(t, r.Attempts)
	require.Empty(t, r.LockedBy)
	require.True(t, r.LockedUntil.IsZero(), "no lease on insert")
	require.Equal(t, uuid.Nil, r.LeaseToken)
	require.Empty(t, r.LastError)
	require.False(t, r.CreatedAt.IsZero())
	require.Equal(t, r.CreatedAt, r.UpdatedAt)
	require.False(t, r.NextAttemptAt.Before(r.CreatedAt))
	require.True(t, r.NextAttemptAt.Sub(r.CreatedAt) < time.Second, "due now")
	require.True(t, r.DeliveredAt.IsZero())

	// Optional fields left empty are stored as absent.
	plain := e.enqueue(t, msg(2))[0]
	p := e.get(t, plain.ID)
	require.Equal(t, uuid.Nil, p.TenantID)
	require.Empty(t, p.DedupeKey)
	require.Empty(t, p.PartitionKey)
	require.Empty(t, p.Headers)
}

func testPayloadByteExact(t *testing.T, h Harness) {
	e := setup(t, h)
	payloads := []string{
		`{ "z": 1,   "a": [1, 2.50, 1e3], "nested": {"b": null, "a": true} }`,
		`{"unicode":"Grüße, 世界 🚀","escaped":"line\nbreak \"quoted\" \u00e9 \\ /"}`,
		`[]`,
		`"just a string"`,
		`12345678901234567890.000`,
		"{\n\t\"indented\": \"yes\"\n}",
	}
	want := map[uuid.UUID]string{}
	batch := make([]outbox.Message, len(payloads))
	for i, p := range payloads {
		m := msg(0)
		m.Payload = json.RawMessage(p)
		want[e.enqueue(t, m)[0].ID] = p // the one-row path
		batch[i] = m
	}
	for i, r := range e.enqueue(t, batch...) { // the multi-row path
		want[r.ID] = payloads[i]
	}
	recs := e.claim(t, claimOpts(100, time.Minute))
	require.Len(t, recs, 2*len(payloads))
	for _, r := range recs {
		require.Equal(t, want[r.ID], string(r.Payload), "payload must come back byte for byte")
		sum := sha256.Sum256(r.Payload)
		require.Equal(t, sum[:], r.PayloadHash)
	}
}

func testBatch(t *testing.T, h Harness) {
	e := setup(t, h)
	const n = 1234 // crosses the per-statement chunk size of every built-in dialect
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = msg(i)
		if i%3 == 0 {
			msgs[i].DedupeKey = "k-" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + "-" + uuid.NewString()
		}
	}
	res := e.enqueue(t, msgs...)
	require.Len(t, res, n)
	seen := map[uuid.UUID]bool{}
	for i, r := range res {
		require.False(t, r.Duplicate, "message %d", i)
		require.False(t, seen[r.ID], "duplicate id")
		seen[r.ID] = true
	}
	require.Equal(t, n, e.count(t))
	require.Equal(t, n, e.count(t, outbox.StatusPending))

	// Each result's id is the row of the message at the same index.
	for _, i := range []int{0, 1, 500, n - 1} {
		require.JSONEq(t, string(msgs[i].Payload), string(e.get(t, res[i].ID).Payload))
	}

	// An empty batch is a no-op.
	tx, err := e.db.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	r, err := e.store.EnqueueBatch(e.ctx, tx, nil)
	require.NoError(t, err)
	require.Empty(t, r)
	require.NoError(t, tx.Commit())
}

// testOptionalFieldCombinations enqueues every combination of the optional fields (tenant,
// dedupe key, partition key, headers, delay) alone, and in a batch next to a message that
// sets none of them and one that sets all, and reads each row back: what was set is stored,
// what was not is absent. Dialects may render a statement per combination (the built-in
// ones bind only the columns some row of a batch sets), so every one is exercised.
func testOptionalFieldCombinations(t *testing.T, h Harness) {
	e := setup(t, h)
	const fields = 5
	const delay = time.Hour
	build := func(set, serial int) outbox.Message {
		m := msg(serial)
		if set&1 != 0 {
			m.TenantID = uuid.New()
		}
		if set&2 != 0 {
			m.DedupeKey = "key-" + uuid.NewString()
			if m.TenantID != uuid.Nil {
				m.DedupeKey = m.TenantID.String() + "/" + m.DedupeKey
			}
		}
		if set&4 != 0 {
			m.PartitionKey = "pk-" + uuid.NewString()
		}
		if set&8 != 0 {
			m.Headers = outbox.Headers{"h": uuid.NewString()}
		}
		if set&16 != 0 {
			m.Delay = delay
		}
		return m
	}
	type sent struct {
		id uuid.UUID
		m  outbox.Message
	}
	var all []sent
	serial := 0
	for set := range 1 << fields {
		alone := build(set, serial)
		batch := []outbox.Message{build(0, serial+1), build(set, serial+2), build(1<<fields-1, serial+3)}
		serial += 4
		all = append(all, sent{e.enqueue(t, alone)[0].ID, alone})
		for i, r := range e.enqueue(t, batch...) {
			require.False(t, r.Duplicate)
			all = append(all, sent{r.ID, batch[i]})
		}
	}
	for _, s := range all {
		r, m := e.get(t, s.id), s.m
		require.Equal(t, m.TenantID, r.TenantID, "%+v", m)
		require.Equal(t, m.DedupeKey, r.DedupeKey, "%+v", m)
		require.Equal(t, m.PartitionKey, r.PartitionKey, "%+v", m)
		if len(m.Headers) == 0 {
			require.Empty(t, r.Headers, "%+v", m)
		} else {
			require.Equal(t, m.Headers, r.Headers, "%+v", m)
		}
		require.Equal(t, string(m.Payload), string(r.Payload), "%+v", m)
		due := r.NextAttemptAt.Sub(r.CreatedAt)
		require.True(t, due >= m.Delay && due < m.Delay+time.Second, "next_attempt_at - created_at = %s for %+v", due, m)
		require.Equal(t, outbox.StatusPending, r.Status)
	}
	require.Equal(t, len(all), e.count(t))
}

func testDelayedDelivery(t *testing.T, h Harness) {
	e := setup(t, h)
	m := msg(1)
	m.Delay = time.Hour
	id := e.enqueue(t, m)[0].ID
	now := e.enqueue(t, msg(2))[0].ID

	r := e.get(t, id)
	d := r.NextAttemptAt.Sub(r.CreatedAt)
	require.True(t, d >= time.Hour && d < time.Hour+time.Second, "next_attempt_at - created_at = %s", d)

	recs := e.claim(t, claimOpts(10, time.Minute))
	require.Equal(t, []uuid.UUID{now}, ids(recs), "a delayed row is not due")
}

func testEnqueueStandalone(t *testing.T, h Harness) {
	e := setup(t, h)
	res, err := e.store.EnqueueStandalone(e.ctx, msg(1), msg(2))
	require.NoError(t, err)
	require.Len(t, res, 2)
	require.Equal(t, 2, e.count(t), "EnqueueStandalone commits its own transaction")

	// A bad message fails the whole call and writes nothing.
	bad := msg(3)
	bad.Topic = ""
	_, err = e.store.EnqueueStandalone(e.ctx, msg(4), bad)
	require.ErrorIs(t, err, outbox.ErrInvalid)
	require.Equal(t, 2, e.count(t))

	// A transaction begun on a dedicated connection is a transaction like any other.
	conn, err := e.db.Conn(e.ctx)
	require.NoError(t, err)
	defer conn.Close()
	tx, err := conn.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	_, err = e.store.Enqueue(e.ctx, tx, msg(5))
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())
	require.Equal(t, 2, e.count(t), "a rolled-back connection transaction leaves no row")
}

// testInsertLeased: a Store with Options.LogLease inserts rows due at once already leased
// to the log's reader, by the one-row and the batch statement alike, which claims pass over
// until the lease expires; the reader settles them under LogLeaseOf, and a row that polling
// took over refuses the reader's outcome. A dialect that cannot refuses the option at New.
func testInsertLeased(t *testing.T, h Harness) {
	e := setup(t, h)
	for _, bad := range []time.Duration{-time.Second, outbox.MinLogLease / 2} {
		_, err := outbox.New(e.db, h.Dialect, outbox.Options{LogLease: bad})
		require.ErrorIs(t, err, outbox.ErrInvalid, "LogLease %s", bad)
	}
	const lease = outbox.MinLogLease
	s, err := outbox.New(e.db, h.Dialect, outbox.Options{LogLease: lease})
	if errors.Is(err, errors.ErrUnsupported) {
		return // the dialect declares it cannot; nothing is inserted leased
	}
	require.NoError(t, err)
	log := &env{ctx: e.ctx, db: e.db, store: s, table: e.table, h: h}

	keyed := msg(1)
	keyed.DedupeKey, keyed.PartitionKey = "k-1", "p-1"
	delayed := msg(3)
	delayed.Delay = time.Hour
	batch := log.enqueue(t, keyed, msg(2), delayed)
	single := log.enqueue(t, msg(4))[0].ID
	require.True(t, log.enqueue(t, keyed)[0].Duplicate, "a dedupe conflict still skips the row")
	leased := []uuid.UUID{batch[0].ID, batch[1].ID, single}

	for _, id := range leased {
		r := e.get(t, id)
		require.Equal(t, outbox.StatusProcessing, r.Status, "row %s", id)
		require.Equal(t, 1, r.Attempts, "the insert's lease counts as the first claim")
		require.Equal(t, outbox.LogWorkerID, r.LockedBy)
		require.Equal(t, outbox.LogLeaseToken(id), r.LeaseToken)
		require.Equal(t, lease, r.LockedUntil.Sub(r.UpdatedAt), "locked_until = now + LogLease")
		require.Equal(t, r.CreatedAt, r.UpdatedAt)
	}
	r := e.get(t, batch[2].ID)
	require.Equal(t, outbox.StatusPending, r.Status, "a delayed row is left to polling")
	require.Zero(t, r.Attempts)
	require.Empty(t, r.LockedBy)
	require.Equal(t, uuid.Nil, r.LeaseToken)

	require.Empty(t, e.claim(t, claimOpts(10, time.Minute)), "no claim takes a row under a live insert lease")

	require.NoError(t, e.store.Complete(e.ctx,
		outbox.Outcome{Lease: outbox.LogLeaseOf(single), Status: outbox.StatusDelivered},
		outbox.Outcome{Lease: outbox.LogLeaseOf(batch[1].ID), Status: outbox.StatusPending, Error: "broker said no"}))
	require.Equal(t, outbox.StatusDelivered, e.get(t, single).Status)
	recs := e.claim(t, claimOpts(10, time.Minute))
	require.Equal(t, []uuid.UUID{batch[1].ID}, ids(recs), "a failed delivery goes back to polling")
	require.Equal(t, 2, recs[0].Attempts)

	// Once its lease ran out, polling takes the row over, and the reader's late outcome
	// is refused rather than applied over the new owner's.
	deadline := time.Now().Add(10 * lease)
	for recs = nil; len(recs) == 0 && time.Now().Before(deadline); {
		recs = e.claim(t, claimOpts(10, time.Minute))
	}
	require.Equal(t, []uuid.UUID{batch[0].ID}, ids(recs), "an expired insert lease is reclaimed")
	require.NotEqual(t, outbox.LogLeaseToken(batch[0].ID), recs[0].LeaseToken)
	err = e.store.Complete(e.ctx, outbox.Outcome{Lease: outbox.LogLeaseOf(batch[0].ID), Status: outbox.StatusDelivered})
	require.ErrorIs(t, err, outbox.ErrLeaseLost)
	require.Equal(t, outbox.StatusProcessing, e.get(t, batch[0].ID).Status)
}

func testGetNotFound(t *testing.T, h Harness) {
	e := setup(t, h)
	_, err := e.store.Get(e.ctx, uuid.New())
	require.ErrorIs(t, err, outbox.ErrNotFound)
}

var validationTests = []test{
	{"BadMessages", testBadMessages},
	{"BadBatchWritesNothing", testBadBatchWritesNothing},
	{"BadTableName", testBadTableName},
	{"BadOptions", testBadOptions},
}

func testBadMessages(t *testing.T, h Harness) {
	e := setup(t, h, outbox.Options{MaxPayloadBytes: 1024})
	tenant := uuid.MustParse("0b7e5d7e-55c4-4d3c-8f3e-6b1f0c2a9d11")
	with := func(f func(*outbox.Message)) outbox.Message {
		m := msg(1)
		f(&m)
		return m
	}
	cases := []struct {
		name string
		m    outbox.Message
		kind error
	}{
		{"empty namespace", with(func(m *outbox.Message) { m.Namespace = "" }), outbox.ErrInvalid},
		{"empty topic", with(func(m *outbox.Message) { m.Topic = "" }), outbox.ErrInvalid},
		{"oversized namespace", with(func(m *outbox.Message) { m.Namespace = strings.Repeat("n", outbox.MaxNamespaceBytes+1) }), outbox.ErrInvalid},
		{"oversized topic", with(func(m *outbox.Message) { m.Topic = strings.Repeat("t", outbox.MaxTopicBytes+1) }), outbox.ErrInvalid},
		{"oversized dedupe key", with(func(m *outbox.Message) { m.DedupeKey = strings.Repeat("d", outbox.MaxDedupeKeyBytes+1) }), outbox.ErrInvalid},
		{"oversized partition key", with(func(m *outbox.Message) { m.PartitionKey = strings.Repeat("p", outbox.MaxPartitionKeyBytes+1) }), outbox.ErrInvalid},
		{"NUL in topic", with(func(m *outbox.Message) { m.Topic = "a\x00b" }), outbox.ErrInvalid},
		{"invalid UTF-8 in namespace", with(func(m *outbox.Message) { m.Namespace = "\xff\xfe" }), outbox.ErrInvalid},
		{"empty payload", with(func(m *outbox.Message) { m.Payload = nil }), outbox.ErrInvalid},
		{"invalid JSON", with(func(m *outbox.Message) { m.Payload = json.RawMessage(`{"a":`) }), outbox.ErrInvalid},
		{"two JSON values", with(func(m *outbox.Message) { m.Payload = json.RawMessage(`{} {}`) }), outbox.ErrInvalid},
		{"invalid UTF-8 payload", with(func(m *outbox.Message) { m.Payload = json.RawMessage("\"\xff\"") }), outbox.ErrInvalid},
		{"oversized payload", with(func(m *outbox.Message) {
			m.Payload = json.RawMessage(`"` + strings.Repeat("x", 1100) + `"`)
		}), outbox.ErrInvalid},
		{"empty header key", with(func(m *outbox.Message) { m.Headers = outbox.Headers{"": "v"} }), outbox.ErrInvalid},
		{"headers whose JSON escapes exceed the bound", with(func(m *outbox.Message) {
			m.Headers = outbox.Headers{"h": strings.Repeat("<", outbox.MaxHeadersBytes/3)}
		}), outbox.ErrInvalid},
		{"negative delay", with(func(m *outbox.Message) { m.Delay = -time.Second }), outbox.ErrInvalid},
		{"tenant mismatch", with(func(m *outbox.Message) {
			m.TenantID, m.DedupeKey = tenant, uuid.NewString()+"/order-1"
		}), outbox.ErrTenantMismatch},
		{"tenant without slash", with(func(m *outbox.Message) {
			m.TenantID, m.DedupeKey = tenant, tenant.String()+"order-1"
		}), outbox.ErrTenantMismatch},
		{"tenant in upper case", with(func(m *outbox.Message) {
			m.TenantID, m.DedupeKey = tenant, strings.ToUpper(tenant.String())+"/order-1"
		}), outbox.ErrTenantMismatch},
	}
	tx, err := e.db.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	for _, c := range cases {
		_, err := e.store.Enqueue(e.ctx, tx, c.m)
		require.Error(t, err, c.name)
		require.ErrorIs(t, err, outbox.ErrInvalid, c.name)
		require.ErrorIs(t, err, c.kind, c.name)
		var ve *outbox.ValidationError
		require.True(t, errors.As(err, &ve), c.name)
	}
	// The transaction is still usable, and nothing was written.
	ok := with(func(m *outbox.Message) { m.TenantID, m.DedupeKey = tenant, tenant.String()+"/order-1" })
	_, err = e.store.Enqueue(e.ctx, tx, ok)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	require.Equal(t, 1, e.count(t))
}

func testBadBatchWritesNothing(t *testing.T, h Harness) {
	e := setup(t, h)
	msgs := []outbox.Message{msg(0), msg(1), msg(2), msg(3), msg(4)}
	msgs[3].Topic = ""
	tx, err := e.db.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	_, err = e.store.EnqueueBatch(e.ctx, tx, msgs)
	var ve *outbox.ValidationError
	require.True(t, errors.As(err, &ve))
	require.Equal(t, 3, ve.Index)
	require.Equal(t, "topic", ve.Field)
	require.NoError(t, tx.Commit())
	require.Zero(t, e.count(t))
}

func testBadTableName(t *testing.T, h Harness) {
	db := h.OpenDB(t)
	for _, name := range []string{"x; DROP TABLE y", `x"y`, "x`y", "Outbox", "1abc", strings.Repeat("a", dialect.MaxTableBytes+1), "a.b", "a b"} {
		_, err := outbox.New(db, h.Dialect, outbox.Options{Table: name})
		require.ErrorIs(t, err, outbox.ErrInvalid, "table %q", name)
	}
}

func testBadOptions(t *testing.T, h Harness) {
	e := setup(t, h)
	id := e.enqueue(t, msg(1))[0].ID
	bad := []outbox.ClaimOptions{
		{Limit: 0, Lease: time.Minute, MaxAttempts: 1, WorkerID: "w"},
		{Limit: outbox.MaxBatch + 1, Lease: time.Minute, MaxAttempts: 1, WorkerID: "w"},
		{Limit: 1, Lease: 0, MaxAttempts: 1, WorkerID: "w"},
		{Limit: 1, Lease: time.Minute, MaxAttempts: 0, WorkerID: "w"},
		{Limit: 1, Lease: time.Minute, MaxAttempts: 1, WorkerID: ""},
		{Limit: 1, Lease: time.Minute, MaxAttempts: 1, WorkerID: "w", Scope: outbox.Scope{Topics: []string{""}}},
		{Limit: 1, Lease: time.Minute, MaxAttempts: 1, WorkerID: "w", Scope: outbox.Scope{Topics: make([]string, outbox.MaxScopeTopics+1)}},
	}
	for i, o := range bad {
		_, err := e.store.Claim(e.ctx, o)
		require.ErrorIs(t, err, outbox.ErrInvalid, "claim options %d", i)
	}
	_, err := outbox.New(e.db, h.Dialect, outbox.Options{MaxPayloadBytes: -1})
	require.ErrorIs(t, err, outbox.ErrInvalid)
	_, err = outbox.New(nil, h.Dialect, outbox.Options{})
	require.ErrorIs(t, err, outbox.ErrInvalid)

	recs := e.claim(t, claimOpts(1, time.Minute))
	require.Len(t, recs, 1)
	err = e.store.Nack(e.ctx, outbox.RetryPolicy{BaseDelay: time.Minute, MaxDelay: time.Second}, outbox.Failure{Lease: recs[0].Lease(), Attempts: 1})
	require.ErrorIs(t, err, outbox.ErrInvalid)
	err = e.store.Complete(e.ctx, outbox.Outcome{Lease: recs[0].Lease(), Status: "bogus"})
	require.ErrorIs(t, err, outbox.ErrInvalid)
	require.ErrorIs(t, e.store.Extend(e.ctx, 0, recs[0].Lease()), outbox.ErrInvalid)
	r := e.get(t, id)
	require.Equal(t, outbox.StatusProcessing, r.Status, "rejected calls changed nothing")
	require.Equal(t, recs[0].LeaseToken, r.LeaseToken)
}

var dedupeTests = []test{
	{"SecondIsAlreadyEnqueued", testDedupeSecond},
	{"RacingProducers", testDedupeRacing},
	{"RolledBackWinnerFreesKey", testDedupeRolledBackWinner},
	{"RacingProducersWinnerRollsBack", testDedupeRacingRollback},
	{"ScopedByNamespaceAndTopic", testDedupeScope},
	{"BytewiseKeys", testDedupeBytewise},
	{"WithinOneBatch", testDedupeWithinBatch},
}

func testDedupeSecond(t *testing.T, h Harness) {
	e := setup(t, h)
	m := msg(1)
	m.DedupeKey = "order-1/created"
	first := e.enqueue(t, m)[0]
	require.False(t, first.Duplicate)

	tx, err := e.db.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	second, err := e.store.Enqueue(e.ctx, tx, m)
	require.NoError(t, err, "a duplicate is an outcome, not an error")
	require.True(t, second.Duplicate)
	require.Equal(t, uuid.Nil, second.ID)
	// The transaction is still usable after the conflict.
	third, err := e.store.Enqueue(e.ctx, tx, msg(2))
	require.NoError(t, err)
	require.False(t, third.Duplicate)
	require.NoError(t, tx.Commit())

	require.Equal(t, 2, e.count(t))
	require.Equal(t, m.DedupeKey, e.get(t, first.ID).DedupeKey)
}

func testDedupeRacing(t *testing.T, h Harness) {
	e := setup(t, h)
	const producers = 8
	m := msg(1)
	m.DedupeKey = "racing-key"
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		results = make([]outbox.Result, producers)
		errs    = make([]error, producers)
	)
	for i := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = func() error {
				tx, err := e.db.BeginTx(e.ctx, nil)
				if err != nil {
					return err
				}
				defer func() { _ = tx.Rollback() }()
				r, err := e.store.Enqueue(e.ctx, tx, m)
				if err != nil {
					return err
				}
				results[i] = r
				// The loser's transaction must stay usable for its own work.
				if _, err := e.store.Enqueue(e.ctx, tx, msg(100+i)); err != nil {
					return err
				}
				return tx.Commit()
			}()
		}()
	}
	close(start)
	wg.Wait()
	winners := 0
	for i := range producers {
		require.NoError(t, errs[i], "producer %d", i)
		if !results[i].Duplicate {
			winners++
		}
	}
	require.Equal(t, 1, winners, "exactly one producer inserts; the others learn it was already enqueued")
	require.Equal(t, 1+producers, e.count(t))
}

func testDedupeRolledBackWinner(t *testing.T, h Harness) {
	e := setup(t, h)
	m := msg(1)
	m.DedupeKey = "k"
	tx, err := e.db.BeginTx(e.ctx, nil)
	require.NoError(t, err)
	_, err = e.store.Enqueue(e.ctx, tx, m)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())

	r := e.enqueue(t, m)[0]
	require.False(t, r.Duplicate, "a rolled-back enqueue leaves the key free")
	require.Equal(t, 1, e.count(t))
}

// testDedupeRacingRollback races dedupeRacers producers on one key, round after round; in
// every other round the first producer to win rolls back once the others are queued behind
// its key. Every other transaction must commit (the key's next winner, and every loser with
// Result.Duplicate), and each round's key must end with exactly one row. On InnoDB, waiters
// that upgrade shared locks on the key deadlock each other when the winner rolls back.
func testDedupeRacingRollback(t *testing.T, h Harness) {
	e := setup(t, h)
	const rounds = 20
	before := e.count(t)
	for round := range rounds {
		rollback := round%2 == 1
		key := fmt.Sprintf("race-%d", round)
		var (
			wg         sync.WaitGroup
			start      = make(chan struct{})
			started    atomic.Int32 // producers that have begun their transaction
			rolledBack atomic.Bool  // the round's first winner took the rollback
			errs       = make([]error, dedupeRacers)
			outcome    = make([]string, dedupeRacers)
		)
		for i := range dedupeRacers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				outcome[i], errs[i] = func() (string, error) {
					started.Add(1) // SQLite's BEGIN IMMEDIATE waits here behind the winner
					tx, err := e.db.BeginTx(e.ctx, nil)
					if err != nil {
						return "", err
					}
					defer func() { _ = tx.Rollback() }()
					m := msg(i)
					m.DedupeKey = key
					r, err := e.store.Enqueue(e.ctx, tx, m)
					if err != nil {
						return "", fmt.Errorf("enqueue: %w", err)
					}
					if !r.Duplicate && rollback && rolledBack.CompareAndSwap(false, true) {
						// Hold the key until every producer has started, then a little longer
						// so that they queue on it (the outcome does not depend on how many
						// did), and roll back.
						for started.Load() < dedupeRacers {
							time.Sleep(time.Millisecond)
						}
						time.Sleep(20 * time.Millisecond)
						return "rolled back", tx.Rollback()
					}
					// The transaction stays usable for the producer's own work.
					if _, err := e.store.Enqueue(e.ctx, tx, msg(1000+i)); err != nil {
						return "", fmt.Errorf("enqueue after the race: %w", err)
					}
					if r.Duplicate {
						return "duplicate", tx.Commit()
					}
					return "won", tx.Commit()
				}()
			}()
		}
		close(start)
		wg.Wait()
		won := 0
		for i := range dedupeRacers {
			require.NoError(t, errs[i], "round %d (winner rolls back: %v), producer %d: its transaction must commit", round, rollback, i)
			if outcome[i] == "won" {
				won++
			}
		}
		require.Equal(t, 1, won, "round %d: exactly one producer commits the key: %v", round, outcome)
		// Every producer that committed also enqueued a row without a key; one more row holds
		// the key.
		committed := 0
		for _, o := range outcome {
			if o == "won" || o == "duplicate" {
				committed++
			}
		}
		after := e.count(t)
		require.Equal(t, committed+1, after-before, "round %d: one row for the key", round)
		before = after
	}
}

// dedupeRacers is how many producers race on one dedupe key.
const dedupeRacers = 16

func testDedupeScope(t *testing.T, h Harness) {
	e := setup(t, h)
	base := msg(1)
	base.DedupeKey = "same"
	otherTopic, otherNS := base, base
	otherTopic.Topic = "order.cancelled"
	otherNS.Namespace = "billing"
	noKey1, noKey2 := msg(2), msg(2)
	res := e.enqueue(t, base, otherTopic, otherNS, noKey1, noKey2)
	for i, r := range res {
		require.False(t, r.Duplicate, "message %d", i)
	}
	require.Equal(t, 5, e.count(t))
}

func testDedupeBytewise(t *testing.T, h Harness) {
	e := setup(t, h)
	keys := []string{"key", "KEY", "key ", "kéy", "ke\u0301y"}
	msgs := make([]outbox.Message, len(keys))
	for i, k := range keys {
		msgs[i] = msg(i)
		msgs[i].DedupeKey = k
	}
	for i, r := range e.enqueue(t, msgs...) {
		require.False(t, r.Duplicate, "key %q is distinct byte for byte", keys[i])
	}
	require.Equal(t, len(keys), e.count(t))
}

func testDedupeWithinBatch(t *testing.T, h Harness) {
	e := setup(t, h)
	a, b := msg(1), msg(2)
	a.DedupeKey, b.DedupeKey = "dup", "dup"
	existing := msg(3)
	existing.DedupeKey = "existing"
	e.enqueue(t, existing)
	res := e.enqueue(t, a, msg(4), b, existing)
	require.False(t, res[0].Duplicate)
	require.False(t, res[1].Duplicate)
	require.True(t, res[2].Duplicate)
	require.True(t, res[3].Duplicate)
	require.Equal(t, 3, e.count(t))
}
