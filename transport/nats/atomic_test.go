package outboxnats_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/outboxtest/transporttest"
	"github.com/outboxgo/outbox/transport/nats"
)

// embedded starts a NATS server with JetStream in the test's process (one that has atomic
// batch publish, unlike the shared one), stopped when t ends, and returns its URL. edit
// changes its options.
func embedded(t testing.TB, edit func(*natsserver.Options)) string {
	t.Helper()
	opts := &natsserver.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true}
	if edit != nil {
		edit(opts)
	}
	s, err := natsserver.NewServer(opts)
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second), "the embedded server starts")
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s.ClientURL()
}

// atomicStream creates a stream that allows atomic batch publish (unless edit says not).
func atomicStream(t testing.TB, js jetstream.JetStream, edit func(*jetstream.StreamConfig)) (string, jetstream.Stream) {
	return stream(t, js, func(c *jetstream.StreamConfig) {
		c.AllowAtomicPublish = true
		if edit != nil {
			edit(c)
		}
	})
}

// stored is a message as the stream holds it, read by its sequence.
type stored struct {
	seq         uint64
	id          string // Nats-Msg-Id
	batch       string // Nats-Batch-Id, "" when it was not stored as part of an atomic batch
	batchSeq    int
	batchCommit bool
}

// storedMsgs returns every message s holds, in stream order.
func storedMsgs(t testing.TB, s jetstream.Stream) []stored {
	t.Helper()
	ctx := context.Background()
	info, err := s.Info(ctx)
	require.NoError(t, err)
	var out []stored
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		require.NoError(t, err)
		n, _ := strconv.Atoi(m.Header.Get("Nats-Batch-Sequence"))
		out = append(out, stored{seq: seq, id: m.Header.Get(jetstream.MsgIDHeader), batch: m.Header.Get("Nats-Batch-Id"),
			batchSeq: n, batchCommit: m.Header.Get("Nats-Batch-Commit") == "1"})
	}
	return out
}

// keyed returns n deliveries of key pk in namespace ns, in order.
func keyed(ns, pk string, n int) []outbox.Delivery {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Namespace: ns, Topic: "order.changed", PartitionKey: pk,
			Payload: json.RawMessage(fmt.Sprintf(`{"key":%q,"n":%d}`, pk, i))}
	}
	return transporttest.Deliveries(msgs)
}

// ids returns the ids of ds as the stream's Nats-Msg-Id.
func ids(ds []outbox.Delivery) []string {
	out := make([]string, len(ds))
	for i := range ds {
		out[i] = ds[i].ID.String()
	}
	return out
}

// requireOneBatch fails t unless got, in stream order, is exactly the messages of want, in
// order, stored as one atomic batch.
func requireOneBatch(t testing.TB, want []outbox.Delivery, got []stored) {
	t.Helper()
	require.Len(t, got, len(want))
	for n, g := range got {
		require.Equal(t, want[n].ID.String(), g.id, "message %d of the run in its place", n)
		require.NotEmpty(t, g.batch, "message %d stored as part of an atomic batch", n)
		require.Equal(t, got[0].batch, g.batch, "message %d in the same batch as the first", n)
		require.Equal(t, n+1, g.batchSeq, "message %d's place in the batch", n)
		require.Equal(t, n == len(want)-1, g.batchCommit, "only the last message commits")
	}
}

// TestAtomicBatchKeyRun: on a stream that allows atomic publish, a key's run in a batch is
// stored as one atomic batch, in order, while other keys and messages without a key go one
// each; a key's single message goes as today.
func TestAtomicBatchKeyRun(t *testing.T) {
	t.Parallel()
	js := connect(t, embedded(t, nil))
	ns, s := atomicStream(t, js, nil)
	tr := newTransport(t, js, outboxnats.Options{AckTimeout: 3 * time.Second})

	run := keyed(ns, "hot", 6)
	single := keyed(ns, "cold", 1)
	loose := keyed(ns, "", 2)
	batch := []outbox.Delivery{run[0], loose[0], run[1], run[2], single[0], run[3], loose[1], run[4], run[5]}
	errs := tr.Publish(context.Background(), batch)
	require.Empty(t, transporttest.Failures(errs))

	got := storedMsgs(t, s)
	require.Len(t, got, len(batch))
	var hot []stored
	for _, g := range got {
		if g.batch != "" {
			hot = append(hot, g)
		}
	}
	requireOneBatch(t, run, hot)
	for _, g := range got {
		if g.batch == "" {
			require.NotContains(t, ids(run), g.id, "the run's messages all went in the batch")
		}
	}
	// Seen by a consumer, the run is in order and every message is byte for byte.
	transporttest.RequireSame(t, batch, consume(t, s))
}

// TestAtomicBatchKeyOrder runs the shared key-order contract against a server with atomic
// batches: a key's message the stream refuses (over its max_msg_size) fails alone, the key's
// messages before it are stored in order, none after it.
func TestAtomicBatchKeyOrder(t *testing.T) {
	t.Parallel()
	js := connect(t, embedded(t, nil))
	ns, s := atomicStream(t, js, func(c *jetstream.StreamConfig) { c.MaxMsgSize = 4096 })
	tr := newTransport(t, js, outboxnats.Options{})
	transporttest.KeyOrder(t, tr, transporttest.KeyOrderCase{
		Namespace: ns, Topic: "order.changed",
		Consume: func() []transporttest.Received { return consume(t, s) },
		Break:   func(d *outbox.Delivery) { d.Payload = []byte(`"` + strings.Repeat("x", 8000) + `"`) },
	})
}

// TestAtomicBatchRefusedStoresNone: a batch the stream refuses (it has room for three
// messages of the run's five) stores none of them; every message fails, the first with the
// cause, the others saying they were not stored, none of them for good.
func TestAtomicBatchRefusedStoresNone(t *testing.T) {
	t.Parallel()
	js := connect(t, embedded(t, nil))
	ns, s := atomicStream(t, js, func(c *jetstream.StreamConfig) { c.MaxMsgs, c.Discard = 3, jetstream.DiscardNew })
	tr := newTransport(t, js, outboxnats.Options{AckTimeout: 3 * time.Second})

	run := keyed(ns, "hot", 5)
	errs := tr.Publish(context.Background(), run)
	require.Len(t, errs, len(run))
	require.Error(t, errs[0])
	require.Contains(t, errs[0].Error(), "maximum messages exceeded", "the first message carries the cause")
	for i, err := range errs {
		require.Error(t, err, "message %d of the refused batch fails", i)
		require.False(t, outbox.IsPermanent(err), "a full stream is no message's fault: %v", err)
		if i > 0 {
			require.Contains(t, err.Error(), run[0].ID.String(), "message %d names the message whose failure it shares", i)
		}
	}
	require.Empty(t, storedMsgs(t, s), "nothing of a refused batch is stored")

	// Once there is room, the run goes whole.
	require.Empty(t, transporttest.Failures(tr.Publish(context.Background(), run[:3])))
	requireOneBatch(t, run[:3], storedMsgs(t, s))
}

// TestAtomicBatchFirstTooLarge: a run whose first message is over the stream's
// max_msg_size stores nothing: the first fails for good, the others are not at fault.
func TestAtomicBatchFirstTooLarge(t *testing.T) {
	t.Parallel()
	js := connect(t, embedded(t, nil))
	ns, s := atomicStream(t, js, func(c *jetstream.StreamConfig) { c.MaxMsgSize = 4096 })
	tr := newTransport(t, js, outboxnats.Options{AckTimeout: 3 * time.Second})

	run := keyed(ns, "hot", 4)
	run[0].Payload = []byte(`"` + strings.Repeat("x", 8000) + `"`)
	errs := tr.Publish(context.Background(), run)
	require.Len(t, errs, len(run))
	require.True(t, outbox.IsPermanent(errs[0]), "the message over max_msg_size fails for good: %v", errs[0])
	for i, err := range errs[1:] {
		require.Error(t, err, "message %d after it fails", i+1)
		require.False(t, outbox.IsPermanent(err), "message %d is not at fault: %v", i+1, err)
	}
	require.Empty(t, storedMsgs(t, s))
}

// TestAtomicBatchFallback: on a stream without atomic publish, a key's run goes one message
// after another as on servers before 2.12, and once a stream that allowed it no longer does,
// the refused batch goes one by one and the transport asks the stream again.
func TestAtomicBatchFallback(t *testing.T) {
	t.Parallel()
	js := connect(t, embedded(t, nil))
	t.Run("not allowed", func(t *testing.T) {
		ns, s := stream(t, js, nil)
		tr := newTransport(t, js, outboxnats.Options{AckTimeout: 3 * time.Second})
		run := keyed(ns, "hot", 5)
		require.Empty(t, transporttest.Failures(tr.Publish(context.Background(), run)))
		got := storedMsgs(t, s)
		require.Len(t, got, len(run))
		for n, g := range got {
			require.Equal(t, run[n].ID.String(), g.id, "message %d in its place", n)
			require.Empty(t, g.batch, "message %d went alone", n)
		}
	})
	t.Run("no longer allowed", func(t *testing.T) {
		ns, s := atomicStream(t, js, nil)
		tr := newTransport(t, js, outboxnats.Options{AckTimeout: 3 * time.Second})
		first := keyed(ns, "hot", 3)
		require.Empty(t, transporttest.Failures(tr.Publish(context.Background(), first)))
		requireOneBatch(t, first, storedMsgs(t, s))

		info, err := s.Info(context.Background())
		require.NoError(t, err)
		cfg := info.Config
		cfg.AllowAtomicPublish = false
		_, err = js.UpdateStream(context.Background(), cfg)
		require.NoError(t, err)

		second, third := keyed(ns, "hot", 3), keyed(ns, "hot", 3)
		require.Empty(t, transporttest.Failures(tr.Publish(context.Background(), second)), "a refused batch goes again one by one")
		require.Empty(t, transporttest.Failures(tr.Publish(context.Background(), third)))
		got := storedMsgs(t, s)
		require.Len(t, got, 9)
		for n, g := range got[3:] {
			require.Equal(t, append(ids(second), ids(third)...)[n], g.id, "message %d in its place", n)
			require.Empty(t, g.batch, "message %d went alone", n)
		}
	})
}

// TestAtomicBatchLimit: a run longer than the server's max_batch_size goes in consecutive
// batches of at most that many, each committed before the next starts, in order.
func TestAtomicBatchLimit(t *testing.T) {
	t.Parallel()
	js := connect(t, embedded(t, func(o *natsserver.Options) { o.JetStreamLimits.MaxBatchSize = 3 }))
	ns, s := atomicStream(t, js, nil)
	tr := newTransport(t, js, outboxnats.Options{AckTimeout: 3 * time.Second})

	run := keyed(ns, "hot", 8)
	require.Empty(t, transporttest.Failures(tr.Publish(context.Background(), run)))
	got := storedMsgs(t, s)
	require.Len(t, got, len(run))
	requireOneBatch(t, run[0:3], got[0:3])
	requireOneBatch(t, run[3:6], got[3:6])
	requireOneBatch(t, run[6:8], got[6:8])
	require.NotEqual(t, got[0].batch, got[3].batch)
	require.NotEqual(t, got[3].batch, got[6].batch)
}

// TestAtomicBatchDedupe: a run published again (its acknowledgement lost, say) with newer
// messages of its key behind it stores only the new ones, in order: the server refuses a
// batch that holds a message id it saw within the duplicate window, so the transport sends
// such a run one message at a time, as before, and the stream acknowledges the seen ones as
// duplicates.
func TestAtomicBatchDedupe(t *testing.T) {
	t.Parallel()
	js := connect(t, embedded(t, nil))
	ns, s := atomicStream(t, js, nil)
	tr := newTransport(t, js, outboxnats.Options{AckTimeout: 3 * time.Second})

	run := keyed(ns, "hot", 5)
	require.Empty(t, transporttest.Failures(tr.Publish(context.Background(), run[:3])))
	again := run[:3:3]
	for i := range again {
		again[i].Attempt = 2
	}
	require.Empty(t, transporttest.Failures(tr.Publish(context.Background(), append(again, run[3:]...))))
	got := storedMsgs(t, s)
	require.Len(t, got, len(run), "the messages published twice are stored once")
	for n, g := range got {
		require.Equal(t, run[n].ID.String(), g.id, "message %d in its place", n)
	}
	// A whole run seen before is acknowledged as it is, and stores nothing.
	require.Empty(t, transporttest.Failures(tr.Publish(context.Background(), run)))
	require.Len(t, storedMsgs(t, s), len(run))
}

// TestAtomicBatchOverMaxPayload: a run that holds a message over the server's max_payload,
// which the client refuses to send, is not started as a batch (a batch broken off would
// blame the run's first message): it goes one by one, the messages ahead of the large one
// are stored in order, the large one fails for good, the ones after it wait.
func TestAtomicBatchOverMaxPayload(t *testing.T) {
	t.Parallel()
	js := connect(t, embedded(t, func(o *natsserver.Options) { o.MaxPayload = 4096 }))
	ns, s := atomicStream(t, js, nil)
	tr := newTransport(t, js, outboxnats.Options{AckTimeout: 3 * time.Second})

	run := keyed(ns, "hot", 4)
	run[2].Payload = []byte(`"` + strings.Repeat("x", 8000) + `"`)
	errs := tr.Publish(context.Background(), run)
	require.Len(t, errs, len(run))
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.True(t, outbox.IsPermanent(errs[2]), "the message over max_payload fails for good: %v", errs[2])
	require.Error(t, errs[3])
	require.False(t, outbox.IsPermanent(errs[3]), "the message after it is not at fault: %v", errs[3])
	got := storedMsgs(t, s)
	require.Len(t, got, 2)
	for n, g := range got {
		require.Equal(t, run[n].ID.String(), g.id, "message %d in its place", n)
	}
}
