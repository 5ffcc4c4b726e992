package outbox

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// TestKeyRounds: a batch whose keys do not repeat goes to publish in one call, as it is;
// otherwise each round holds at most one message of a key, in order, a key stops at its
// first failure, and its later messages fail without being sent, never permanently.
func TestKeyRounds(t *testing.T) {
	t.Parallel()
	msg := func(ns, key string) Delivery {
		return Delivery{ID: uuid.New(), Namespace: ns, PartitionKey: key}
	}
	var calls [][]Delivery
	var refuse uuid.UUID
	publish := func(_ context.Context, b []Delivery) []error {
		calls = append(calls, b)
		errs := make([]error, len(b))
		for i := range b {
			if b[i].ID == refuse {
				errs[i] = Permanent(errors.New("refused"))
			}
		}
		return errs
	}

	unordered := []Delivery{msg("a", "k"), msg("a", "j"), msg("b", "k"), msg("a", ""), msg("a", "")}
	require.Nil(t, keyRounds(unordered, nil))
	require.Empty(t, nonNilErrs(inKeyOrder(context.Background(), unordered, nil, publish)))
	require.Len(t, calls, 1)
	require.Equal(t, unordered, calls[0], "a batch without repeated keys goes as it is")

	calls = nil
	batch := []Delivery{msg("a", "k"), msg("a", "j"), msg("a", "k"), msg("a", ""), msg("a", "k"), msg("a", "j"), msg("a", "k")}
	require.Equal(t, [][]int{{0, 1, 3}, {2, 5}, {4}, {6}}, keyRounds(batch, nil))
	refuse = batch[2].ID
	errs := inKeyOrder(context.Background(), batch, nil, publish)
	require.Len(t, calls, 2, "key k stops at its failure: rounds 3 and 4 are not sent")
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.True(t, IsPermanent(errs[2]))
	require.NoError(t, errs[3])
	require.NoError(t, errs[5])
	for _, i := range []int{4, 6} {
		require.Error(t, errs[i])
		require.False(t, IsPermanent(errs[i]), "%v", errs[i])
		require.Contains(t, errs[i].Error(), refuse.String())
	}

	// With wait saying no, a key's messages share a round; those after a failure in it fail
	// as not at fault.
	calls = nil
	require.Equal(t, [][]int{{0, 1, 2, 3, 4, 5, 6}}, keyRounds(batch, func(_, _ *Delivery) bool { return false }))
	errs = inKeyOrder(context.Background(), batch, func(_, _ *Delivery) bool { return false },
		func(_ context.Context, b []Delivery) []error {
			calls = append(calls, b)
			errs := make([]error, len(b))
			for i := 2; i < len(b); i++ {
				if b[i].PartitionKey == "k" {
					errs[i] = Permanent(errors.New("refused")) // as a partition's later records fail
				}
			}
			return errs
		})
	require.Len(t, calls, 1)
	require.True(t, IsPermanent(errs[2]))
	require.False(t, IsPermanent(errs[4]), "%v", errs[4])
	require.False(t, IsPermanent(errs[6]), "%v", errs[6])

	// Once ctx is done, what is not sent yet fails with ctx's error.
	ctx, cancel := context.WithCancel(context.Background())
	errs = inKeyOrder(ctx, []Delivery{msg("a", "k"), msg("a", "j"), msg("a", "k")}, nil,
		func(_ context.Context, b []Delivery) []error { cancel(); return make([]error, len(b)) })
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[2], context.Canceled)

	// An outage ahead is an outage behind: no attempt spent.
	down := errors.New("down")
	errs = inKeyOrder(context.Background(), []Delivery{msg("a", "k"), msg("a", "k")}, nil,
		func(_ context.Context, b []Delivery) []error { return []error{Unavailable(down)} })
	require.True(t, IsUnavailable(errs[1]), "%v", errs[1])
}

// nonNilErrs returns the errors of errs that are not nil.
func nonNilErrs(errs []error) []error {
	var out []error
	for _, err := range errs {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// TestKeyOrderWaived: a batch an unordered Publisher hands over goes in one call even when
// a key repeats, and a key's failure holds nothing back.
func TestKeyOrderWaived(t *testing.T) {
	t.Parallel()
	k := func() Delivery { return Delivery{ID: uuid.New(), Namespace: "a", PartitionKey: "k"} }
	batch := []Delivery{k(), k(), k()}
	var calls int
	errs := PublishInKeyOrder(WithoutKeyOrder(context.Background()), batch, nil, func(_ context.Context, b []Delivery) []error {
		calls++
		return []error{errors.New("no"), nil, nil}
	})
	require.Equal(t, 1, calls)
	require.Error(t, errs[0])
	require.NoError(t, errs[1])
	require.NoError(t, errs[2])

	calls = 0
	PublishInKeyOrder(context.Background(), batch, nil, func(_ context.Context, b []Delivery) []error {
		calls++
		return make([]error, len(b))
	})
	require.Equal(t, 3, calls, "in key order unless waived")

	var fails int
	pm := PerMessage(func(context.Context, Delivery) error { fails++; return errors.New("no") })
	errs = pm.Publish(WithoutKeyOrder(context.Background()), batch)
	require.Equal(t, 3, fails, "PerMessage tries every message when key order is waived")
	require.Len(t, errs, 3)
}
