package sqlkit

import (
	"bytes"
	"cmp"
	"slices"

	"github.com/google/uuid"
	"github.com/outboxgo/outbox/dialect"
)

// RunRow is a row that follows a claimed head of its key, as a run claim
// ([dialect.ClaimParams.Runs]) reads it: Key numbers its head, OK says whether it can be
// claimed now (pending, due, below the attempt limit, in scope).
type RunRow struct {
	Key int
	ID  uuid.UUID
	OK  bool
	At  int64 // created_at in microseconds
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

// RunHead is where a run claim reads a key's rows from: after the row (At, ID) of the key
// (At is created_at in microseconds).
type RunHead struct {
	Namespace, PartitionKey string
	At                      int64
	ID                      uuid.UUID
}

// RunRead reads, for each from[i], up to limit rows of its key after it, in sequence, each
// with Key = keys[i] and At set.
type RunRead func(from []RunHead, keys []int, limit int) ([]RunRow, error)

// ReadRuns returns what a run claim of heads takes, up to n rows in all ([RunTake]), read
// through read: first each key's share of n, so that many keys cost a read of about n rows
// rather than n rows each; then, only when some keys' runs ended short of their share, what
// is left, for the keys whose share was all claimable (a hot key among cold ones).
func ReadRuns(heads []RunHead, n int, read RunRead) ([][]uuid.UUID, error) {
	k := len(heads)
	if k == 0 || n <= 0 {
		return make([][]uuid.UUID, k), nil
	}
	share := (n + k - 1) / k
	keys := make([]int, k)
	for i := range keys {
		keys[i] = i
	}
	rows, err := read(heads, keys, share)
	if err != nil {
		return nil, err
	}
	runs, full := runPrefixes(rows, k, share)
	taken := RunTake(runRows(runs), k, n)
	if count(taken) == n {
		return taken, nil
	}
	var from []RunHead
	keys = keys[:0]
	for key, run := range runs {
		if full[key] {
			last := run[len(run)-1]
			from = append(from, RunHead{Namespace: heads[key].Namespace, PartitionKey: heads[key].PartitionKey, At: last.At, ID: last.ID})
			keys = append(keys, key)
		}
	}
	if len(from) == 0 {
		return taken, nil
	}
	more, err := read(from, keys, n-count(taken))
	if err != nil {
		return nil, err
	}
	extra, _ := runPrefixes(more, k, 0)
	for key := range runs {
		runs[key] = append(runs[key], extra[key]...)
	}
	return RunTake(runRows(runs), k, n), nil
}

// runPrefixes groups rows, which list each key's rows in sequence, into each key's
// claimable prefix; full reports the keys whose share rows were all read and claimable.
func runPrefixes(rows []RunRow, keys, share int) (runs [][]RunRow, full []bool) {
	runs, full = make([][]RunRow, keys), make([]bool, keys)
	read := make([]int, keys)
	stopped := make([]bool, keys)
	for _, r := range rows {
		read[r.Key]++
		if stopped[r.Key] || !r.OK {
			stopped[r.Key] = true
			continue
		}
		runs[r.Key] = append(runs[r.Key], r)
	}
	for key := range full {
		full[key] = share > 0 && read[key] == share && !stopped[key]
	}
	return runs, full
}

func runRows(runs [][]RunRow) []RunRow {
	var out []RunRow
	for _, run := range runs {
		out = append(out, run...)
	}
	return out
}

func count(runs [][]uuid.UUID) int {
	n := 0
	for _, r := range runs {
		n += len(r)
	}
	return n
}

// RunHeads returns where the runs of heads, claimed records with a partition key, start.
func RunHeads(heads []dialect.Record) []RunHead {
	out := make([]RunHead, len(heads))
	for i, h := range heads {
		out[i] = RunHead{Namespace: h.Namespace, PartitionKey: h.PartitionKey, At: h.CreatedAt.UnixMicro(), ID: h.ID}
	}
	return out
}

// SortRuns puts rows in each key's sequence: a UNION ALL of one range per key keeps no order
// of its own.
func SortRuns(rows []RunRow) {
	slices.SortFunc(rows, func(x, y RunRow) int {
		if c := cmp.Compare(x.Key, y.Key); c != 0 {
			return c
		}
		if c := cmp.Compare(x.At, y.At); c != 0 {
			return c
		}
		return bytes.Compare(x.ID[:], y.ID[:])
	})
}
