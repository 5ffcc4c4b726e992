package outbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
)

// addHook adds the headers of add to every message, and records what it saw.
type addHook struct {
	add   outbox.Headers
	panic string // "start" or "end" panics there
	mu    sync.Mutex
	ended []outbox.Message
	errs  []error
}

type hookKey struct{}

func (h *addHook) StartEnqueue(ctx context.Context, m *outbox.Message) context.Context {
	if h.panic == "start" {
		panic("start hook")
	}
	if m.Headers == nil {
		m.Headers = outbox.Headers{}
	}
	for k, v := range h.add {
		m.Headers[k] = v
	}
	m.Topic = "changed by the hook" // discarded
	return context.WithValue(ctx, hookKey{}, m.Namespace)
}

func (h *addHook) EndEnqueue(ctx context.Context, m outbox.Message, res outbox.Result, err error) {
	if ctx.Value(hookKey{}) != m.Namespace {
		panic("EndEnqueue did not get StartEnqueue's context")
	}
	h.mu.Lock()
	h.ended = append(h.ended, m)
	h.errs = append(h.errs, err)
	h.mu.Unlock()
	if h.panic == "end" {
		panic("end hook")
	}
}

func TestEnqueueHook(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ctx := context.Background()
		h := &addHook{add: outbox.Headers{"traceparent": "from-hook", "x-hook": "1"}}
		s, err := outbox.New(e.db, pubDialect(e.backend), outbox.Options{Hooks: outbox.StoreHooks{Enqueue: h}})
		require.NoError(t, err)

		// The caller's own header is kept; the hook's additions are stored; the caller's map
		// is not touched.
		own := outbox.Headers{"traceparent": "callers"}
		msgs := []outbox.Message{
			{Namespace: "hk", Topic: "t", Headers: own, Payload: []byte(`{}`)},
			{Namespace: "hk", Topic: "t", Payload: []byte(`{}`)},
		}
		rs, err := s.EnqueueStandalone(ctx, msgs...)
		require.NoError(t, err)
		require.Equal(t, outbox.Headers{"traceparent": "callers"}, own)
		require.Nil(t, msgs[1].Headers)
		r0, r1 := e.get(t, rs[0].ID), e.get(t, rs[1].ID)
		require.Equal(t, outbox.Headers{"traceparent": "callers", "x-hook": "1"}, r0.Headers)
		require.Equal(t, outbox.Headers{"traceparent": "from-hook", "x-hook": "1"}, r1.Headers)
		require.Equal(t, "t", r0.Topic)
		require.Len(t, h.ended, 2)
		require.Equal(t, "callers", h.ended[0].Headers["traceparent"])
		require.NoError(t, h.errs[0])

		// What the hook adds is validated: a key it cannot store fails the enqueue.
		bad := &addHook{add: outbox.Headers{"": "x"}}
		s2, err := outbox.New(e.db, pubDialect(e.backend), outbox.Options{Hooks: outbox.StoreHooks{Enqueue: bad}})
		require.NoError(t, err)
		_, err = s2.EnqueueStandalone(ctx, outbox.Message{Namespace: "hk", Topic: "t", Payload: []byte(`{}`)})
		var ve *outbox.ValidationError
		require.ErrorAs(t, err, &ve)
		require.Equal(t, "headers", ve.Field)
		require.Len(t, bad.errs, 1)
		require.Error(t, bad.errs[0])

		// A panicking hook neither fails the enqueue nor adds anything.
		for _, where := range []string{"start", "end"} {
			p := &addHook{add: outbox.Headers{"x-hook": "1"}, panic: where}
			s3, err := outbox.New(e.db, pubDialect(e.backend), outbox.Options{Hooks: outbox.StoreHooks{Enqueue: p}})
			require.NoError(t, err)
			rs, err := s3.EnqueueStandalone(ctx, outbox.Message{Namespace: "hk", Topic: "t", Payload: []byte(`{}`)})
			require.NoError(t, err, where)
			want := outbox.Headers{"x-hook": "1"}
			if where == "start" {
				want = nil
			}
			require.Equal(t, want, e.get(t, rs[0].ID).Headers, where)
		}
	})
}

// obsRecorder is a PublisherObserver with every optional ability, recording all calls.
type obsRecorder struct {
	mu       sync.Mutex
	starts   int
	results  map[uuid.UUID][]outbox.AttemptOutcome
	settled  map[uuid.UUID][]outbox.AttemptOutcome
	claims   int
	panicEnd bool
}

type obsKey struct{}

func newObsRecorder() *obsRecorder {
	return &obsRecorder{results: map[uuid.UUID][]outbox.AttemptOutcome{}, settled: map[uuid.UUID][]outbox.AttemptOutcome{}}
}

func (o *obsRecorder) StartPublish(ctx context.Context, batch []outbox.Delivery) context.Context {
	o.mu.Lock()
	o.starts++
	o.mu.Unlock()
	return context.WithValue(ctx, obsKey{}, len(batch))
}

func (o *obsRecorder) EndPublish(ctx context.Context, batch []outbox.Delivery, results []outbox.AttemptResult) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if ctx.Value(obsKey{}) != len(batch) || len(results) != len(batch) {
		panic("EndPublish without StartPublish's context or one result per message")
	}
	for i, d := range batch {
		o.results[d.ID] = append(o.results[d.ID], results[i].Outcome)
	}
	if o.panicEnd {
		panic("observer")
	}
}

func (o *obsRecorder) Settled(_ context.Context, s []outbox.Settled) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, x := range s {
		o.settled[x.ID] = append(o.settled[x.ID], x.Outcome)
	}
}

func (o *obsRecorder) StartClaim(ctx context.Context) context.Context { return ctx }

func (o *obsRecorder) EndClaim(context.Context, int, error) {
	o.mu.Lock()
	o.claims++
	o.mu.Unlock()
}

func (o *obsRecorder) CircuitChanged(context.Context, bool) {}

var _ interface {
	outbox.PublisherObserver
	outbox.ClaimObserver
	outbox.CircuitObserver
} = (*obsRecorder)(nil)

func TestPublisherObserver(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ids := e.enqueue(t, "obs", 4)
		var mu sync.Mutex
		seen := map[uuid.UUID]int{}
		obs := newObsRecorder()
		obs.panicEnd = true // a panicking observer costs nothing but a log line and a counted error
		tr := outbox.PerMessage(func(ctx context.Context, d outbox.Delivery) error {
			if ctx.Value(obsKey{}) == nil {
				return outbox.Permanent(errors.New("the transport did not get the observer's context"))
			}
			mu.Lock()
			defer mu.Unlock()
			seen[d.ID]++
			switch {
			case d.ID == ids[0] && seen[d.ID] == 1:
				return errors.New("first attempt fails")
			case d.ID == ids[1]:
				return outbox.Permanent(errors.New("never"))
			case d.ID == ids[2] && seen[d.ID] == 1:
				return outbox.Unavailable(errors.New("broker away"))
			}
			return nil
		})
		o := fastOptions(t, "obs")
		o.Observer = obs
		p, err := outbox.NewPublisher(e.store, tr, o)
		require.NoError(t, err)
		start(t, p)
		e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool {
			return m[outbox.StatusDelivered] == 3 && m[outbox.StatusDead] == 1
		})
		deadline := time.Now().Add(10 * time.Second)
		for {
			obs.mu.Lock()
			n := len(obs.settled[ids[0]]) + len(obs.settled[ids[1]]) + len(obs.settled[ids[2]]) + len(obs.settled[ids[3]])
			obs.mu.Unlock()
			if n == 6 || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		obs.mu.Lock()
		defer obs.mu.Unlock()
		D, R, U, X := outbox.AttemptDelivered, outbox.AttemptRetried, outbox.AttemptUnavailable, outbox.AttemptDead
		want := map[uuid.UUID][]outbox.AttemptOutcome{ids[0]: {R, D}, ids[1]: {X}, ids[2]: {U, D}, ids[3]: {D}}
		require.Equal(t, want, obs.results)
		require.Equal(t, want, obs.settled)
		require.Positive(t, obs.claims)
		require.GreaterOrEqual(t, p.Stats().Errors, int64(obs.starts))
	})
}
