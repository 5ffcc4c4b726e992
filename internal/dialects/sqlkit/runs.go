package sqlkit

import "github.com/google/uuid"

// RunRow is a row that follows a claimed head of its key, as a run claim
// ([dialect.ClaimParams.Runs]) reads it: Key numbers its head, OK says whether it can be
// claimed now (pending, due, below the attempt limit, in scope).
type RunRow struct {
	Key int
	ID  uuid.UUID
	OK  bool
}

// RunTake returns what a run claim takes of rows, which list each key's rows in sequence:
// per key, the rows before its first row that is not OK, taken in turns across the keys
// (every key's first row, then every key's second, ...) up to n in all. The result holds
// each key's share, in sequence, by key number.
func RunTake(rows []RunRow, keys, n int) [][]uuid.UUID {
	runs := make([][]uuid.UUID, keys)
	stopped := make([]bool, keys)
	for _, r := range rows {
		if stopped[r.Key] || !r.OK {
			stopped[r.Key] = true
			continue
		}
		runs[r.Key] = append(runs[r.Key], r.ID)
	}
	taken := make([][]uuid.UUID, keys)
	for rank, left := 0, n; left > 0; rank++ {
		more := false
		for k := range runs {
			if rank < len(runs[k]) && left > 0 {
				taken[k] = append(taken[k], runs[k][rank])
				left--
				more = true
			}
		}
		if !more {
			break
		}
	}
	return taken
}

// RunCut returns the rows of runs (RunTake's result) that the claim holds, held reporting
// whether its lock took a row: each key's run up to its first row not held. A run never
// skips a row that another transaction holds to take one after it.
func RunCut(runs [][]uuid.UUID, held func(uuid.UUID) bool) []uuid.UUID {
	var ids []uuid.UUID
	for _, run := range runs {
		for _, id := range run {
			if !held(id) {
				break
			}
			ids = append(ids, id)
		}
	}
	return ids
}
