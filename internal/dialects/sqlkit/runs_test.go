package sqlkit_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// TestRunTakeAndCut: each key's run ends at its first row that cannot be claimed, the
// batch's rest is shared in turns across the keys, and a run is cut at its first row the
// lock did not take, never skipping it.
func TestRunTakeAndCut(t *testing.T) {
	t.Parallel()
	id := func(k, i int) uuid.UUID { return uuid.UUID{byte(k), byte(i)} }
	rows := []sqlkit.RunRow{
		{Key: 0, ID: id(0, 1), OK: true}, {Key: 0, ID: id(0, 2), OK: true}, {Key: 0, ID: id(0, 3), OK: true},
		{Key: 1, ID: id(1, 1), OK: true}, {Key: 1, ID: id(1, 2), OK: false}, {Key: 1, ID: id(1, 3), OK: true},
		{Key: 2, ID: id(2, 1), OK: false},
	}
	require.Equal(t, [][]uuid.UUID{{id(0, 1), id(0, 2)}, {id(1, 1)}, nil}, sqlkit.RunTake(rows, 3, 3), "turns: every key's first, then the seconds")
	require.Equal(t, [][]uuid.UUID{{id(0, 1), id(0, 2), id(0, 3)}, {id(1, 1)}, nil}, sqlkit.RunTake(rows, 3, 10))
	require.Equal(t, [][]uuid.UUID{nil, nil, nil}, sqlkit.RunTake(rows, 3, 0))

	runs := sqlkit.RunTake(rows, 3, 10)
	skipped := id(0, 2)
	require.Equal(t, []uuid.UUID{id(0, 1), id(1, 1)}, sqlkit.RunCut(runs, func(x uuid.UUID) bool { return x != skipped }),
		"the run of key 0 ends before the row the lock skipped")
}
