package sqlkit

import (
	"bytes"

	"github.com/google/uuid"
)

// SettledRow is a row that a settle just applied, as the settle left it: its key, its
// place in the key's sequence (At is created_at in microseconds), and whether it is
// delivered now.
type SettledRow struct {
	Namespace, PartitionKey string
	At                      int64
	ID                      uuid.UUID
	Delivered               bool
}

// ContinueHeads returns where a claim with [dialect.ClaimParams.Continue] reads runs from,
// given the rows a settle applied: for each key whose rows there are all delivered, its last
// row (every row of the key before it is delivered, so its next row is the key's head), keys
// in the order rows first name them. Rows without a key are passed over. rows must hold
// every outcome's row: a settle that lost a lease cannot tell that row's key, which a
// continuation past it would claim while another claimer holds it, so it continues none.
func ContinueHeads(rows []SettledRow) []RunHead {
	type key struct{ ns, pk string }
	at := map[key]int{}
	var heads []RunHead
	var blocked []bool
	for _, r := range rows {
		if r.PartitionKey == "" {
			continue
		}
		k := key{r.Namespace, r.PartitionKey}
		i, seen := at[k]
		if !seen {
			i = len(heads)
			at[k] = i
			heads = append(heads, RunHead{Namespace: r.Namespace, PartitionKey: r.PartitionKey, At: r.At, ID: r.ID})
			blocked = append(blocked, false)
		}
		blocked[i] = blocked[i] || !r.Delivered
		if h := &heads[i]; r.At > h.At || r.At == h.At && bytes.Compare(r.ID[:], h.ID[:]) > 0 {
			h.At, h.ID = r.At, r.ID
		}
	}
	out := heads[:0]
	for i, h := range heads {
		if !blocked[i] {
			out = append(out, h)
		}
	}
	return out
}
