package outboxpglog

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
)

// TestDeliversRightAfterStart: rows committed as soon as Stats().Reading holds are
// delivered from the log, not left to polling: with a new slot (created by this first
// session, with its publication, on a table migrated a moment before), beside a polling
// Publisher started at the same moment and a Store that notifies, as the relay runs them,
// and with a slot that exists already. The insert lease outlasts the test's wait, so
// polling cannot deliver them.
func TestDeliversRightAfterStart(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		existingSlot, beside bool
	}{
		{name: "new slot"},
		{name: "new slot beside polling", beside: true},
		{name: "existing slot", existingSlot: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leakCheck(t)
			b := setup(t, time.Minute)
			if tc.existingSlot {
				first := b.publisher(t, Options{})
				stop := b.start(t, first)
				require.NoError(t, stop())
				confirmed, _ := b.slot(t, first.Slot())
				require.NotEmpty(t, confirmed, "the first publisher created the slot")
			}
			if tc.beside {
				s, err := outbox.New(b.db, outbox.Postgres(), outbox.Options{LogLease: time.Minute})
				require.NoError(t, err)
				b.store = s
				b.poll(t)
			}
			p := b.publisher(t, Options{})
			b.start(t, p)
			ids := b.enqueue(t, msgs(0, 10)...)
			deadline := time.Now().Add(10 * time.Second)
			for p.Stats().Delivered < int64(len(ids)) {
				if time.Now().After(deadline) {
					t.Fatalf("the log reader settled %d of %d rows committed once it reported Reading; the rest wait for polling", p.Stats().Delivered, len(ids))
				}
				time.Sleep(5 * time.Millisecond)
			}
			b.waitDelivered(t, "every row is delivered", ids)
			requireAttempts(t, b, ids, 1)
		})
	}
}

// requireAttempts fails unless each row counts want attempts.
func requireAttempts(t *testing.T, b *bundle, ids []uuid.UUID, want int) {
	t.Helper()
	for _, id := range ids {
		r, err := b.store.Get(b.ctx, id)
		require.NoError(t, err)
		require.Equal(t, want, r.Attempts, "row %s", id)
	}
}
