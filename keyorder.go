package outbox

import (
	"context"
	"fmt"
)

// waiveKeyOrder is the context key of [WithoutKeyOrder].
type waiveKeyOrder struct{}

// WithoutKeyOrder returns a context that tells a [TransportKeyOrder] that the batch it is
// handed needs no key order: a key's messages may go in any order, and one failing holds
// back none of the others. An unordered [Publisher] hands its batches over so; a loop or
// log reader of one's own that delivers without order should too, or a transport
// sequences a key's messages and fails the ones behind a failure unsent. Give it to a
// Publish call, not to a Run: an ordered Publisher drops it, the log readers do not.
func WithoutKeyOrder(ctx context.Context) context.Context {
	return context.WithValue(ctx, waiveKeyOrder{}, true)
}

// withKeyOrder returns ctx without a waiver of key order that a caller's context carried:
// an ordered Publisher's batches need their keys sequenced whatever its Run was given.
func withKeyOrder(ctx context.Context) context.Context {
	if !keyOrderWaived(ctx) {
		return ctx
	}
	return context.WithValue(ctx, waiveKeyOrder{}, false)
}

func keyOrderWaived(ctx context.Context) bool { w, _ := ctx.Value(waiveKeyOrder{}).(bool); return w }

// partKey is a message's ordering key: its namespace and partition key.
type partKey struct{ ns, pk string }

// keyRounds splits batch into rounds that keep each key's order: a message goes in the
// round after the one of its key ahead of it when wait says it must (wait nil: always),
// in the same round otherwise; messages without a partition key go in the first. It
// returns nil when no key repeats, the batch then going in one round as it is.
func keyRounds(batch []Delivery, wait func(ahead, d *Delivery) bool) [][]int {
	var last map[partKey]int
	var round []int
	rounds := 0
	for i := range batch {
		d := &batch[i]
		if d.PartitionKey == "" {
			continue
		}
		if last == nil {
			last = make(map[partKey]int, len(batch))
		}
		k := partKey{d.Namespace, d.PartitionKey}
		j, seen := last[k]
		last[k] = i
		if !seen {
			continue
		}
		if round == nil {
			round = make([]int, len(batch))
			rounds = 1
		}
		round[i] = round[j]
		if wait == nil || wait(&batch[j], d) {
			round[i]++
			rounds = max(rounds, round[i]+1)
		}
	}
	if rounds == 0 {
		return nil
	}
	out := make([][]int, rounds)
	for i := range batch {
		out[round[i]] = append(out[round[i]], i)
	}
	return out
}

// PublishInKeyOrder is how a transport keeps [TransportKeyOrder]'s promise: it calls publish
// with batch in rounds, so that a key's message is sent only once the one ahead of it was
// delivered, while different keys go together; once a key's message fails, its later
// messages are not sent and fail with an error that names the one that failed (never
// [Permanent], and [Unavailable] when that failure was). wait, when not nil, says whether d
// must wait for ahead, the message of its key before it; nil means always. Messages that
// share a round must be ones publish stops at the first failure of. A batch in which no key
// repeats, or one an unordered [Publisher] hands over, goes to publish in one call as it is.
func PublishInKeyOrder(ctx context.Context, batch []Delivery, wait func(ahead, d *Delivery) bool,
	publish func(context.Context, []Delivery) []error) []error {
	if keyOrderWaived(ctx) {
		return publish(ctx, batch)
	}
	return inKeyOrder(ctx, batch, wait, publish)
}

// inKeyOrder publishes batch with publish round by round ([keyRounds]), so that a key's
// message is sent only once the one ahead of it was delivered, while different keys go
// together; once a key's message fails, its later messages are not sent and fail with
// [behind] (with ctx's error once ctx is done, as in one call). A key's messages that share
// a round must be ones publish stops at the first failure of, and those that failed after
// it fail with [behind] too, since they are not at fault. A batch in which no key repeats
// goes to publish as it is.
func inKeyOrder(ctx context.Context, batch []Delivery, wait func(ahead, d *Delivery) bool,
	publish func(context.Context, []Delivery) []error) []error {
	rounds := keyRounds(batch, wait)
	if rounds == nil {
		return publish(ctx, batch)
	}
	errs := make([]error, len(batch))
	failed := map[partKey]int{} // a key's first failed message
	sub := make([]Delivery, 0, len(rounds[0]))
	idx := make([]int, 0, len(rounds[0]))
	for _, round := range rounds {
		sub, idx = sub[:0], idx[:0]
		cerr := ctx.Err()
		for _, i := range round {
			if cerr != nil { // what is not sent yet fails with ctx's error, as in one call
				errs[i] = cerr
				continue
			}
			if j, ok := failed[partKey{batch[i].Namespace, batch[i].PartitionKey}]; ok && batch[i].PartitionKey != "" {
				errs[i] = behind(&batch[i], &batch[j], errs[j])
				continue
			}
			sub, idx = append(sub, batch[i]), append(idx, i)
		}
		if len(sub) == 0 {
			continue
		}
		out := publish(ctx, sub)
		for n, i := range idx {
			if n >= len(out) || out[n] == nil {
				continue
			}
			errs[i] = out[n]
			if k := (partKey{batch[i].Namespace, batch[i].PartitionKey}); k.pk != "" {
				if j, ok := failed[k]; !ok {
					failed[k] = i
				} else {
					errs[i] = behind(&batch[i], &batch[j], errs[j])
				}
			}
		}
	}
	return errs
}

// behind is the outcome of d, not sent because ahead, a message of its key before it in
// the batch, failed with cause. It is never permanent (d itself is not at fault), and is
// an outage when cause is.
func behind(d, ahead *Delivery, cause error) error {
	err := fmt.Errorf("outbox: message %s not sent: message %s of partition key %q failed before it: %v", d.ID, ahead.ID, d.PartitionKey, cause)
	if IsUnavailable(cause) {
		return Unavailable(err)
	}
	return err
}
