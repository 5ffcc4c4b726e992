package outboxnats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxgo/outbox"
)

// Header names of an atomic batch publish (NATS Server 2.12 and later): every message of
// the batch carries its id and its place in it (1, 2, ...), the last one the commit.
const (
	headerBatchID     = "Nats-Batch-Id"
	headerBatchSeq    = "Nats-Batch-Sequence"
	headerBatchCommit = "Nats-Batch-Commit"
)

// DefaultMaxAtomicBatch is the most messages the transport puts in one atomic batch until
// the server says its limit is lower: NATS Server's default max_batch_size.
const DefaultMaxAtomicBatch = 1000

// The server's error codes for an atomic batch it refuses as a batch, whatever its
// messages.
const (
	errCodeAtomicDisabled      jetstream.ErrorCode = 10174 // the stream does not allow atomic publish
	errCodeAtomicIncomplete    jetstream.ErrorCode = 10176 // a message of the batch is missing
	errCodeAtomicUnsupported   jetstream.ErrorCode = 10177 // a header a batch cannot carry
	errCodeAtomicTooLarge      jetstream.ErrorCode = 10199 // more messages than max_batch_size
	errCodeAtomicDuplicate     jetstream.ErrorCode = 10201 // a message id the stream has seen
	errCodeAtomicTooManyOpen   jetstream.ErrorCode = 10210 // too many batches in flight
	errCodeDuplicateInProgress jetstream.ErrorCode = 10158 // a message id being stored right now
)

// unknownStreamFor is how long the transport keeps that a subject's stream does not allow
// atomic publish (or could not be looked up) before it asks again, so that a stream
// edited to allow it is used without a restart.
const unknownStreamFor = time.Minute

// streams caches, per subject, the stream that captures it and whether that stream allows
// atomic batch publish (stream info, asked once per subject).
type streams struct {
	mu    sync.Mutex
	subj  map[string]streamOf
	limit atomic.Int64 // the most messages in one batch; 0 until learned: DefaultMaxAtomicBatch
}

type streamOf struct {
	name   string
	atomic bool
	until  time.Time // when a negative answer is asked again
}

// maxBatch is the most messages the transport puts in one atomic batch.
func (s *streams) maxBatch() int {
	if n := s.limit.Load(); n > 0 {
		return int(n)
	}
	return DefaultMaxAtomicBatch
}

// atomicStream returns the stream that captures subject, and whether it allows atomic
// publish, from the cache or, once per subject, from the stream's info.
func (t *Transport) atomicStream(ctx context.Context, subject string) (string, bool) {
	s := &t.streams
	now := time.Now()
	s.mu.Lock()
	e, ok := s.subj[subject]
	s.mu.Unlock()
	if ok && (e.atomic || now.Before(e.until)) {
		return e.name, e.atomic
	}
	if nc := t.js.Conn(); nc != nil && !nc.IsConnected() {
		return "", false // no wait for an answer that cannot come; asked again once connected
	}
	e = streamOf{until: now.Add(unknownStreamFor)}
	ctx, cancel := context.WithTimeout(ctx, t.opts.AckTimeout)
	defer cancel()
	if name, err := t.js.StreamNameBySubject(ctx, subject); err == nil {
		if st, err := t.js.Stream(ctx, name); err == nil {
			e.name, e.atomic = name, st.CachedInfo().Config.AllowAtomicPublish
		}
	}
	s.mu.Lock()
	if s.subj == nil || len(s.subj) >= 4096 {
		s.subj = map[string]streamOf{} // subjects are few (one per topic); this bounds a map of many
	}
	s.subj[subject] = e
	s.mu.Unlock()
	return e.name, e.atomic
}

// forget drops what the cache holds of stream, which refused an atomic batch as not allowed.
func (s *streams) forget(stream string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, e := range s.subj {
		if e.name == stream {
			delete(s.subj, k)
		}
	}
}

// ordered is one ordered Publish call: keyRounds asks wait, for each message of a key, whether
// it must wait for the one of its key ahead of it; joined holds those that go in the same
// atomic batch as it instead, so that publish finds the batches in its round.
type ordered struct {
	t      *Transport
	ctx    context.Context
	joined map[uuid.UUID]bool
	length map[uuid.UUID]int // a joined message's place in its batch, from 2
}

func (t *Transport) ordered(ctx context.Context) *ordered {
	return &ordered{t: t, ctx: ctx, joined: map[uuid.UUID]bool{}, length: map[uuid.UUID]int{}}
}

// wait joins d to the batch of ahead when both are captured by the same stream, which
// allows atomic publish, and the batch has room: the server then stores the two in order
// or neither. Otherwise d waits for ahead's acknowledgement, in the next round.
func (o *ordered) wait(ahead, d *outbox.Delivery) bool {
	sa, sd := o.t.opts.Subject(*ahead), o.t.opts.Subject(*d)
	if !validSubject(sa) || !validSubject(sd) {
		return true
	}
	a, ok := o.t.atomicStream(o.ctx, sa)
	if !ok {
		return true
	}
	if b, ok := o.t.atomicStream(o.ctx, sd); !ok || b != a {
		return true
	}
	n := max(o.length[ahead.ID], 1)
	if n >= o.t.streams.maxBatch() {
		return true // the next batch starts once this one is committed
	}
	o.joined[d.ID], o.length[d.ID] = true, n+1
	return false
}

// publish sends a round: each key's joined messages as one atomic batch, the others one
// each, all pipelined.
func (o *ordered) publish(ctx context.Context, batch []outbox.Delivery) []error {
	var groups [][]int
	open := map[partKey]int{} // a key's message that is not joined: its group, or -1-its position
	for i := range batch {
		d := &batch[i]
		if d.PartitionKey == "" {
			continue
		}
		k := partKey{d.Namespace, d.PartitionKey}
		g, ok := open[k]
		switch {
		case !o.joined[d.ID] || !ok:
			open[k] = -1 - i
		case g < 0:
			groups = append(groups, []int{-1 - g, i})
			open[k] = len(groups) - 1
		default:
			groups[g] = append(groups[g], i)
		}
	}
	return o.t.send(ctx, batch, groups)
}

// partKey is a message's ordering key: its namespace and partition key.
type partKey struct{ ns, pk string }

// sendGroup sends the messages of one atomic batch: all but the last without a reply (the
// server answers only the commit), the last with the commit and a reply. It returns the
// commit's future, or the error that stopped it and whether the batch must go again one by
// one (nothing of it was sent).
func (t *Transport) sendGroup(batch []outbox.Delivery, g []int) (f jetstream.PubAckFuture, again bool, err error) {
	nc := t.js.Conn()
	msgs := make([]*nats.Msg, len(g))
	for n, i := range g {
		m, err := t.message(batch[i])
		if err != nil || nc == nil || msgSize(m) > nc.MaxPayload() {
			return nil, true, nil // one by one, each message meets its own fate
		}
		msgs[n] = m
	}
	id := uuid.NewString()
	for n, m := range msgs {
		m.Header[headerBatchID] = []string{id}
		m.Header[headerBatchSeq] = []string{strconv.Itoa(n + 1)}
		if n < len(msgs)-1 {
			if err := nc.PublishMsg(m); err != nil {
				// The server drops the incomplete batch once its timeout passed.
				return nil, false, t.classify(batch[g[n]], m.Subject, err)
			}
			continue
		}
		m.Header[headerBatchCommit] = []string{"1"}
		f, err := t.js.PublishMsgAsync(m)
		if err != nil {
			return nil, false, t.classify(batch[g[n]], m.Subject, err)
		}
		return f, false, nil
	}
	return nil, true, nil
}

// msgSize is the size of m on the wire as the client counts it against max_payload.
func msgSize(m *nats.Msg) int64 {
	n := len("NATS/1.0\r\n\r\n") + len(m.Data)
	for k, vs := range m.Header {
		for _, v := range vs {
			n += len(k) + len(": \r\n") + len(v)
		}
	}
	return int64(n)
}

// groupRefused tells what to do with an atomic batch the server refused with err (nothing
// of it was stored): again (true) when the refusal says nothing of its messages' fate, or
// may be one message's fault, so that, one by one or in smaller batches, each message
// meets its own; fail every message otherwise (a full stream, a timeout, an outage).
func (t *Transport) groupRefused(err error, stream string, n int) (again, smaller bool) {
	var jsErr jetstream.JetStreamError
	if errors.As(err, &jsErr) {
		if api := jsErr.APIError(); api != nil {
			switch api.ErrorCode {
			case errCodeAtomicDisabled:
				t.streams.forget(stream)
				return true, false
			case errCodeAtomicTooLarge:
				// "atomic publish batch is too large: 100": the server's max_batch_size.
				_, size, _ := strings.Cut(api.Description, ": ")
				if limit, err := strconv.Atoi(size); err == nil && limit > 0 && limit < n {
					t.streams.limit.Store(int64(limit))
					return true, true
				}
				return true, false
			case errCodeAtomicIncomplete, errCodeAtomicUnsupported, errCodeAtomicDuplicate,
				errCodeAtomicTooManyOpen, errCodeDuplicateInProgress:
				// A duplicate refuses the whole batch, where one message at a time stores
				// the new ones and acknowledges the seen ones as duplicates.
				return true, false
			}
		}
	}
	return outbox.IsPermanent(Classify(err)), false
}

// notStored is the outcome of d, a message of an atomic batch the server refused or did not
// acknowledge for cause, given to the batch's first message.
func notStored(d, first *outbox.Delivery, cause error) error {
	err := fmt.Errorf("outbox/nats: message %s not stored: the atomic batch of partition key %q that message %s starts failed: %v", d.ID, d.PartitionKey, first.ID, cause)
	if outbox.IsUnavailable(cause) {
		return outbox.Unavailable(err)
	}
	return err
}

// failGroup gives cause to the first message of g and [notStored] to the others.
func failGroup(errs []error, batch []outbox.Delivery, g []int, cause error) {
	errs[g[0]] = cause
	for _, i := range g[1:] {
		errs[i] = notStored(&batch[i], &batch[g[0]], cause)
	}
}

// again publishes the messages of groups anew, in smaller atomic batches when smaller, one
// by one otherwise, and puts their outcomes in errs.
func (t *Transport) again(ctx context.Context, batch []outbox.Delivery, groups [][]int, smaller []bool, errs []error) {
	for _, small := range []bool{false, true} {
		var sub []outbox.Delivery
		var at []int
		for n, g := range groups {
			if smaller[n] != small {
				continue
			}
			for _, i := range g {
				sub, at = append(sub, batch[i]), append(at, i)
			}
		}
		if len(sub) == 0 {
			continue
		}
		var out []error
		if small {
			o := t.ordered(ctx)
			out = outbox.PublishInKeyOrder(ctx, sub, o.wait, o.publish)
		} else {
			out = outbox.PublishInKeyOrder(ctx, sub, nil, t.publish)
		}
		for n, i := range at {
			errs[i] = out[n]
		}
	}
}
