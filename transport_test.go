package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
)

// TestPerMessageKeyOrder: the per-message adapter keeps key order: once a key's message
// fails, its later messages in the batch are not passed to fn and fail with an error (an
// outage when the first failure was one), never a permanent one, while other keys, the
// same key in another namespace and messages without a key go on.
func TestPerMessageKeyOrder(t *testing.T) {
	t.Parallel()
	msg := func(ns, key string) outbox.Delivery {
		return outbox.Delivery{ID: uuid.New(), Namespace: ns, PartitionKey: key}
	}
	batch := []outbox.Delivery{
		msg("a", "k"), msg("a", "j"), msg("a", "k"), msg("a", ""), msg("b", "k"),
		msg("a", "k"), msg("a", "j"), msg("a", ""), msg("a", "k"),
	}
	bad := batch[2].ID // the second message of key k
	var called []uuid.UUID
	tr := outbox.PerMessage(func(_ context.Context, d outbox.Delivery) error {
		called = append(called, d.ID)
		if d.ID == bad || d.PartitionKey == "" {
			return outbox.Permanent(errors.New("refused"))
		}
		return nil
	})
	ko, ok := tr.(outbox.TransportKeyOrder)
	require.True(t, ok, "PerMessage implements TransportKeyOrder")
	require.True(t, ko.KeepsKeyOrder())

	errs := tr.Publish(context.Background(), batch)
	require.Len(t, errs, len(batch))
	for i, want := range []string{"ok", "ok", "refused", "refused", "ok", "behind", "ok", "refused", "behind"} {
		switch want {
		case "ok":
			require.NoError(t, errs[i], "message %d", i)
		case "refused":
			require.True(t, outbox.IsPermanent(errs[i]), "message %d: %v", i, errs[i])
		case "behind":
			require.Error(t, errs[i], "message %d", i)
			require.False(t, outbox.IsPermanent(errs[i]), "message %d is not at fault: %v", i, errs[i])
			require.Contains(t, errs[i].Error(), bad.String(), "message %d names the one that failed", i)
		}
	}
	require.Equal(t, []uuid.UUID{batch[0].ID, batch[1].ID, bad, batch[3].ID, batch[4].ID, batch[6].ID, batch[7].ID}, called,
		"fn never sees a key's message after one that failed")

	// After an outage, the key's later messages are an outage too: they spend no attempt.
	down := outbox.PerMessage(func(_ context.Context, d outbox.Delivery) error {
		return outbox.Unavailable(errors.New("down"))
	})
	errs = down.Publish(context.Background(), []outbox.Delivery{msg("a", "k"), msg("a", "k")})
	require.True(t, outbox.IsUnavailable(errs[1]), "%v", errs[1])
}
