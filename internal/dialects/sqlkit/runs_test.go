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

// TestReadRuns: many keys cost a read of each key's share, not of the batch each; a hot key
// among cold ones still fills the batch, from a second read of what is left; a key whose
// run stops inside its share is not read again.
func TestReadRuns(t *testing.T) {
	t.Parallel()
	id := func(k, i int) uuid.UUID { return uuid.UUID{byte(k), byte(i)} }
	// rows[k] are key k's rows after its head, in sequence; false marks one not claimable.
	table := map[int][]bool{0: {true, true, true, true, true, true, true, true}, 1: {true}, 2: {true, false, true}, 3: {}}
	var reads [][2]int // per read: keys asked for, limit
	read := func(from []sqlkit.RunHead, keys []int, limit int) ([]sqlkit.RunRow, error) {
		reads = append(reads, [2]int{len(keys), limit})
		var out []sqlkit.RunRow
		for i, k := range keys {
			after := int(from[i].At)
			for j := after; j < len(table[k]) && j < after+limit; j++ {
				out = append(out, sqlkit.RunRow{Key: k, ID: id(k, j+1), OK: table[k][j], At: int64(j + 1)})
			}
		}
		return out, nil
	}
	heads := make([]sqlkit.RunHead, 4)
	runs, err := sqlkit.ReadRuns(heads, 8, read)
	require.NoError(t, err)
	require.Equal(t, [][2]int{{4, 2}, {1, 4}}, reads, "each key's share of 8, then what is left for the one key that had more")
	require.Equal(t, [][]uuid.UUID{{id(0, 1), id(0, 2), id(0, 3), id(0, 4), id(0, 5), id(0, 6)}, {id(1, 1)}, {id(2, 1)}, nil}, runs)

	reads = nil
	runs, err = sqlkit.ReadRuns(heads, 4, read)
	require.NoError(t, err)
	require.Equal(t, [][2]int{{4, 1}, {3, 1}}, reads, "keys 0, 1 and 2 read their whole share")
	require.Equal(t, [][]uuid.UUID{{id(0, 1), id(0, 2)}, {id(1, 1)}, {id(2, 1)}, nil}, runs)
}
