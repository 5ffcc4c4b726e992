package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/testdb"
)

// TestPublisherRetention: three publishers purge delivered rows together while they
// deliver; the dead row (Dead is zero) and the scheduled row stay, and no publisher reports
// an error.
func TestPublisherRetention(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ctx := context.Background()
		ids := e.enqueue(t, "ret", 120)
		later, err := e.store.EnqueueStandalone(ctx, outbox.Message{Namespace: "ret", Topic: "t", Payload: []byte(`{}`), Delay: time.Hour})
		require.NoError(t, err)
		rec := newRecorder(func(d outbox.Delivery) error {
			if d.ID == ids[0] {
				return outbox.Permanent(errors.New("rejected"))
			}
			return nil
		})
		var pubs []*outbox.Publisher
		for range 3 {
			o := fastOptions(t, "ret")
			o.Retention = outbox.Retention{Delivered: time.Millisecond, Interval: 20 * time.Millisecond}
			p, err := outbox.NewPublisher(e.store, rec.transport("p"), o)
			require.NoError(t, err)
			start(t, p)
			pubs = append(pubs, p)
		}
		e.waitCounts(t, 30*time.Second, func(m map[outbox.Status]int) bool {
			return m[outbox.StatusDelivered] == 0 && m[outbox.StatusDead] == 1 && m[outbox.StatusPending] == 1 && len(m) == 2
		})
		require.Equal(t, outbox.StatusDead, e.get(t, ids[0]).Status, "dead rows stay when Dead is zero")
		require.Equal(t, outbox.StatusPending, e.get(t, later[0].ID).Status, "pending rows are never purged")
		// A publisher counts a batch once its settle has committed, which another publisher's
		// purge can follow before the count: wait for the counts, within a deadline.
		testdb.Poll(t, 30*time.Second, "119 deliveries counted", func() bool { return sumStats(pubs).Delivered == 119 })
		require.Zero(t, sumStats(pubs).Errors, "purging together is no error")
	})
}

// abilitiesHidden wraps a dialect and hides its optional abilities.
type abilitiesHidden struct{ outbox.Dialect }

func TestPublisherRetentionOptions(t *testing.T) {
	t.Parallel()
	e := pubSetup(t, "sqlite")
	tr := newRecorder(nil).transport("p")
	for name, r := range map[string]outbox.Retention{
		"negative delivered": {Delivered: -time.Second},
		"negative dead":      {Dead: -time.Second},
		"negative interval":  {Delivered: time.Hour, Interval: -time.Second},
	} {
		o := fastOptions(t, "ret")
		o.Retention = r
		_, err := outbox.NewPublisher(e.store, tr, o)
		require.ErrorIs(t, err, outbox.ErrInvalid, name)
	}
	plain := e.newStore(t, e.db, abilitiesHidden{outbox.SQLite()})
	o := fastOptions(t, "ret")
	_, err := outbox.NewPublisher(plain, tr, o)
	require.NoError(t, err, "no retention needs no ability")
	o.Retention = outbox.DefaultRetention()
	_, err = outbox.NewPublisher(plain, tr, o)
	require.ErrorIs(t, err, outbox.ErrInvalid, "retention on a dialect that cannot purge is refused up front")
	require.ErrorContains(t, err, "Retention")
	_, err = plain.Purge(context.Background(), outbox.PurgeOptions{DeadOlderThan: time.Hour})
	require.ErrorIs(t, err, errors.ErrUnsupported)
	_, err = plain.Stats(context.Background(), outbox.Scope{})
	require.ErrorIs(t, err, errors.ErrUnsupported)
}
