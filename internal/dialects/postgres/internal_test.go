package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// TestPGUUIDArray: the array literal holds every id in uuid.UUID.String's form.
func TestPGUUIDArray(t *testing.T) {
	ids := []uuid.UUID{uuid.Nil, uuid.Max, uuid.New(), uuid.New()}
	want := make([]string, len(ids))
	for i, id := range ids {
		want[i] = id.String()
	}
	require.Equal(t, "{"+strings.Join(want, ",")+"}", pgUUIDArray(len(ids), func(i int) uuid.UUID { return ids[i] }))
	require.Equal(t, "{}", pgUUIDArray(0, nil))
}

// sqlStateError is an error with a SQLSTATE, as pgx's and lib/pq's errors are.
type sqlStateError string

func (e sqlStateError) Error() string { return "ERROR: (SQLSTATE " + string(e) + ")" }

func (e sqlStateError) SQLState() string { return string(e) }

// TestPgRetryDeadlock: a claim chosen as a deadlock's victim runs again, up to four times;
// any other error, and success, return at once.
func TestPgRetryDeadlock(t *testing.T) {
	t.Parallel()
	calls := 0
	fail := func(errs ...error) func() (int, error) {
		calls = 0
		return func() (int, error) {
			calls++
			if calls <= len(errs) {
				return 0, errs[calls-1]
			}
			return calls, nil
		}
	}
	deadlock := fmt.Errorf("outbox: claim: %w", sqlStateError("40P01"))
	v, err := pgRetryDeadlock(context.Background(), fail(deadlock, deadlock))
	require.NoError(t, err)
	require.Equal(t, 3, v, "two deadlocks, then the claim")

	_, err = pgRetryDeadlock(context.Background(), fail(deadlock, deadlock, deadlock, deadlock, deadlock))
	require.ErrorIs(t, err, sqlStateError("40P01"))
	require.Equal(t, 4, calls, "four tries at most")

	_, err = pgRetryDeadlock(context.Background(), fail(sqlStateError("40001")))
	require.Error(t, err)
	require.Equal(t, 1, calls, "a serialization failure is not retried here")
}
