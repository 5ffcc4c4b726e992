package outboxpglog

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
)

// hider hides from settles the first n rows they settle, until released, as the server
// hides rows it has sent from other sessions for a moment after their commit.
type hider struct {
	mu       sync.Mutex
	n        int
	ids      []uuid.UUID
	released bool
}

func (h *hider) invisible(id uuid.UUID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.released:
		return false
	case slices.Contains(h.ids, id):
		return true
	case len(h.ids) < h.n:
		h.ids = append(h.ids, id)
		return true
	}
	return false
}

func (h *hider) hidden() []uuid.UUID {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.ids)
}

func (h *hider) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.released = true
}

// TestCarriedSettleDoesNotHoldUpNextBatch: a settle that does not find a row yet carries its
// outcome, and the next batch is published and settled meanwhile; once the row shows, its
// outcome is settled, and each outcome counted once.
func TestCarriedSettleDoesNotHoldUpNextBatch(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	p := b.publisher(t, Options{Slot: "carry_next"})
	h := &hider{n: 1}
	p.invisible = h.invisible
	b.start(t, p)
	x := b.enqueue(t, msg(0))[0]
	b.wait(t, "the settle carries the first row", func() bool { return p.unseenRetries.Load() > 0 })
	require.Equal(t, []uuid.UUID{x}, h.hidden())
	y := b.enqueue(t, msg(1))[0]
	b.waitDelivered(t, "the next row is delivered while the first is carried", []uuid.UUID{y})
	b.wait(t, "the publisher counts it", func() bool { return p.Stats().Delivered == 1 })
	require.Zero(t, p.Stats().LeaseLost, "the first row's outcome was not given up on to get here")
	require.Equal(t, outbox.StatusProcessing, b.status(t)[x], "the first row's outcome is still carried")
	h.release()
	b.waitDelivered(t, "the carried outcome is settled", []uuid.UUID{x})
	b.wait(t, "the publisher counts it", func() bool { return p.Stats().Delivered == 2 })
	st := p.Stats()
	require.Zero(t, st.LeaseLost+st.Retried+st.Dead)
	require.Equal(t, []uuid.UUID{x, y}, deliveredIDs(b.tr.deliveries()), "each published once")
}

// TestConfirmWaitsForCarried: the slot's position does not pass a transaction whose outcome
// is carried: a publisher killed after a later batch, with the outcome still carried, leaves
// the transaction to the next reader, which publishes and settles it.
func TestConfirmWaitsForCarried(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	first := b.publisher(t, Options{Slot: "carry_kill", StatusInterval: 10 * time.Millisecond})
	h := &hider{n: 1} // never released: the first row stays carried
	first.invisible = h.invisible
	killed := killAt(t, b, first, "confirm", func() bool { return len(b.tr.deliveries()) >= 2 })
	done := make(chan error, 1)
	go func() { done <- first.Run(b.ctx) }()
	b.wait(t, "the first publisher reads its slot", func() bool { return first.Stats().Reading })
	x := b.enqueue(t, msg(0))[0]
	b.wait(t, "the settle carries the first row", func() bool { return first.unseenRetries.Load() > 0 })
	y := b.enqueue(t, msg(1))[0]
	<-killed
	require.ErrorIs(t, <-done, errKilled)
	require.Equal(t, outbox.StatusProcessing, b.status(t)[x], "carried, not settled")

	// The second row may have been settled, or carried too if its settle ran before it
	// was visible: either way the next reader gets both again.
	second := b.publisher(t, Options{Slot: "carry_kill"})
	b.start(t, second)
	b.waitDelivered(t, "the next reader settles the carried row", []uuid.UUID{x, y})
	b.wait(t, "the second counts both", func() bool { s := second.Stats(); return s.Delivered+s.LeaseLost == 2 })
	require.Equal(t, []uuid.UUID{x, y, x, y}, deliveredIDs(b.tr.deliveries()), "the carried row published again")
}

// TestCarriedRowLostAfterPatience: a row that never shows (removed after its publish) is
// settled again on a timer while no batch comes, counted lost once patience runs out, and
// the position then passes it.
func TestCarriedRowLostAfterPatience(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	p := b.publisher(t, Options{Slot: "carry_lost", StatusInterval: 10 * time.Millisecond})
	p.patience = 300 * time.Millisecond
	var once sync.Once
	b.tr.setFail(func(d outbox.Delivery) error {
		once.Do(func() {
			_, err := b.db.ExecContext(b.ctx, `DELETE FROM outbox_events WHERE id = $1`, d.ID)
			require.NoError(t, err)
		})
		return nil
	})
	b.start(t, p)
	b.enqueue(t, msg(0))
	var after string
	require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&after))
	b.wait(t, "the removed row counts as lost", func() bool { return p.Stats().LeaseLost == 1 })
	require.Greater(t, p.unseenRetries.Load(), int64(2), "settled again on the timer")
	st := p.Stats()
	require.Zero(t, st.Delivered+st.Retried+st.Dead)
	b.wait(t, "the slot confirms past the row", func() bool {
		var past bool
		err := b.db.QueryRowContext(b.ctx, `SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = 'carry_lost'`, after).Scan(&past)
		return err == nil && past
	})
	require.Equal(t, int64(1), p.Stats().LeaseLost, "counted once")
}

// TestOrderedCarriedOutcomeHoldsItsKey: with Ordered, a carried outcome counts as its row's
// state, whatever the table shows: a carried failure holds its key's later row back, and a
// carried delivery does not.
func TestOrderedCarriedOutcomeHoldsItsKey(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute, true)
	var once sync.Once
	b.tr.setFail(func(d outbox.Delivery) error {
		var err error
		if string(d.Payload) == `{"n":0}` {
			once.Do(func() { err = errors.New("broker said no") })
		}
		return err
	})
	p := b.publisher(t, Options{Slot: "carry_ordered", Ordered: true})
	h := &hider{n: 2}
	p.invisible = h.invisible
	b.start(t, p)
	keyed := func(from int) []outbox.Message {
		ms := msgs(from, 2)
		ms[0].PartitionKey, ms[1].PartitionKey = "a", "b"
		return ms
	}
	tx, err := b.db.BeginTx(b.ctx, nil)
	require.NoError(t, err)
	_, err = b.store.EnqueueBatch(b.ctx, tx, keyed(0)) // a fails, b is delivered: both carried
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	b.wait(t, "the settle carries both", func() bool { return p.unseenRetries.Load() > 0 })
	tx, err = b.db.BeginTx(b.ctx, nil)
	require.NoError(t, err)
	later, err := b.store.EnqueueBatch(b.ctx, tx, keyed(2))
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	b.wait(t, "the later rows are settled", func() bool { s := p.Stats(); return s.Delivered+s.Retried == 2 })
	require.Equal(t, int64(1), p.Stats().Retried, "a's later row handed back")
	var sent []string
	for _, d := range b.tr.deliveries() {
		sent = append(sent, string(d.Payload))
	}
	require.Equal(t, []string{`{"n":0}`, `{"n":1}`, `{"n":3}`}, sent, "b's later row sent, a's held back")
	r, err := b.store.Get(b.ctx, later[0].ID)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, r.Status)
	require.Equal(t, heldBack, r.LastError)
	h.release()
	b.wait(t, "the carried outcomes are settled", func() bool { s := p.Stats(); return s.Delivered == 2 && s.Retried == 2 })
}

// TestShutdownSettlesCarried: a shutdown writes the carried outcomes once more, and
// confirms the position past them when they are written: the next reader of the slot does
// not publish them again.
func TestShutdownSettlesCarried(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	p := b.publisher(t, Options{Slot: "carry_stop"})
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	h := &hider{n: 1}
	p.invisible = func(id uuid.UUID) bool { return ctx.Err() == nil && h.invisible(id) } // visible once stopping
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	b.wait(t, "the publisher reads its slot", func() bool { return p.Stats().Reading })
	x := b.enqueue(t, msg(0))[0]
	b.wait(t, "the settle carries the row", func() bool { return p.unseenRetries.Load() > 0 })
	cancel()
	require.NoError(t, <-done)
	require.Equal(t, outbox.StatusDelivered, b.status(t)[x])
	require.Equal(t, int64(1), p.Stats().Delivered)

	next := b.publisher(t, Options{Slot: "carry_stop"})
	b.start(t, next)
	y := b.enqueue(t, msg(1))[0]
	b.waitDelivered(t, "the next reader delivers a later row", []uuid.UUID{y})
	require.Equal(t, []uuid.UUID{x, y}, deliveredIDs(b.tr.deliveries()), "the carried row was not sent again")
}
