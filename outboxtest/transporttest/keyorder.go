package transporttest

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
)

// KeyOrderCase is how [KeyOrder] drives one transport against its broker.
type KeyOrderCase struct {
	// Namespace and Topic are those of every message; the broker must capture them (a
	// stream, a bound queue, a topic), in order.
	Namespace, Topic string
	// Consume reads back everything the broker holds for the namespace, each route in the
	// broker's order (a stream's, a partition's, a queue's).
	Consume func() []Received
	// Break makes d fail for real at the broker, and only d: too large for the stream or
	// topic, routed nowhere, refused by the endpoint.
	Break func(d *outbox.Delivery)
	// Shared says that a failure may also fail messages of other keys, and the broken
	// key's messages before it (Kafka refuses a partition's whole record batch, and the
	// client fails every later record of the partition): what is delivered must still be
	// each key's first messages in order, but not all of them.
	Shared bool
}

// KeyOrder checks a transport that keeps key order ([outbox.TransportKeyOrder]) against its
// broker, with one Publish call at a time:
//
//  1. a batch with four keys' runs interleaved, and messages without a key, is delivered,
//     and read back each key's messages come in their batch order;
//  2. in a second such batch, one message of a key broken with Break at its fourth place
//     fails, the key's three before it are delivered in order, and none of its six after
//     it is delivered: each reports an error, not a permanent one; every other key is
//     delivered in order. With Shared, the messages reported delivered are each key's
//     first ones, in order.
func KeyOrder(t *testing.T, tr outbox.Transport, c KeyOrderCase) {
	t.Helper()
	ko, ok := tr.(outbox.TransportKeyOrder)
	require.True(t, ok, "the transport implements outbox.TransportKeyOrder")
	require.True(t, ko.KeepsKeyOrder(), "KeepsKeyOrder")
	ctx := context.Background()

	// 1. Everything delivered, each key in order.
	batch := keyRuns(c, "one", []int{15, 15, 15, 15}, 5)
	errs := tr.Publish(ctx, batch)
	require.Empty(t, Failures(errs), "every message of an ordered batch is delivered")
	got := Consumed(t, batch, c.Consume, 10*time.Second)
	requireKeyOrder(t, batch, got)
	RequireSame(t, batch, only(got, batch))

	// 2. The key's fourth message fails: none after it is delivered.
	batch = keyRuns(c, "two", []int{10, 10, 10, 10}, 4)
	var run []int // the broken key's messages, in order
	for i := range batch {
		if batch[i].PartitionKey == key("two", 1) {
			run = append(run, i)
		}
	}
	broken := run[3]
	c.Break(&batch[broken])
	errs = tr.Publish(ctx, batch)
	if len(errs) == 0 {
		errs = make([]error, len(batch))
	}
	require.Len(t, errs, len(batch))
	for _, i := range run[:3] {
		if !c.Shared {
			require.NoError(t, errs[i], "the broken key's messages before the broken one are delivered")
		}
	}
	require.Error(t, errs[broken], "the broken message fails")
	for _, i := range run[4:] {
		require.Error(t, errs[i], "a message after the broken one is not delivered and reports an error")
		require.False(t, outbox.IsPermanent(errs[i]), "a message after the broken one is not at fault: %v", errs[i])
	}
	var delivered []outbox.Delivery
	for i := range batch {
		if errs[i] == nil {
			delivered = append(delivered, batch[i])
		} else if !c.Shared && batch[i].PartitionKey != key("two", 1) {
			require.NoError(t, errs[i], "another key's message is delivered")
		}
	}
	got = only(Consumed(t, delivered, c.Consume, 10*time.Second), batch)
	RequireSame(t, delivered, got)
	requireKeyOrder(t, batch, got)
}

// keyRuns returns runs[k] messages of each key k, interleaved in a varied pattern (keys in
// turn, with stretches where one key comes several times running), then unkeyed messages.
func keyRuns(c KeyOrderCase, name string, runs []int, unkeyed int) []outbox.Delivery {
	next := make([]int, len(runs))
	var msgs []outbox.Message
	add := func(k int) {
		pk := ""
		if k >= 0 {
			pk = key(name, k)
		}
		msgs = append(msgs, outbox.Message{Namespace: c.Namespace, Topic: c.Topic, PartitionKey: pk,
			Payload: json.RawMessage(fmt.Sprintf(`{"key":%q,"seq":%d}`, pk, len(msgs)))})
	}
	for step := 0; ; step++ {
		more := false
		for k := range runs {
			for n := 1 + (step+k)%3; n > 0 && next[k] < runs[k]; n-- {
				add(k)
				next[k]++
			}
			more = more || next[k] < runs[k]
		}
		if step < unkeyed {
			add(-1)
		}
		if !more && step >= unkeyed {
			break
		}
	}
	return Deliveries(msgs)
}

func key(name string, k int) string { return fmt.Sprintf("%s-key-%d", name, k) }

// only returns the messages of got that are in batch.
func only(got []Received, batch []outbox.Delivery) []Received {
	ids := make(map[uuid.UUID]bool, len(batch))
	for _, d := range batch {
		ids[d.ID] = true
	}
	var out []Received
	for _, g := range got {
		if ids[g.ID] {
			out = append(out, g)
		}
	}
	return out
}

// requireKeyOrder fails t unless, for every key, the messages of batch in got come in their
// order in batch and form the start of the key's run there: a key's message is never
// received without every one ahead of it.
func requireKeyOrder(t testing.TB, batch []outbox.Delivery, got []Received) {
	t.Helper()
	type k struct{ ns, pk string }
	pos := map[uuid.UUID]int{}
	runs := map[k][]uuid.UUID{}
	for _, d := range batch {
		if d.PartitionKey == "" {
			continue
		}
		kk := k{d.Namespace, d.PartitionKey}
		pos[d.ID] = len(runs[kk])
		runs[kk] = append(runs[kk], d.ID)
	}
	seen := map[k]int{}
	for _, g := range got {
		p, ok := pos[g.ID]
		if !ok {
			continue
		}
		kk := k{g.Namespace, g.PartitionKey}
		require.Equal(t, seen[kk], p, "key %q: message %s received at place %d of its run, after %d of them", g.PartitionKey, g.ID, p, seen[kk])
		seen[kk]++
	}
}
