package mysql

import (
	"context"
	"database/sql"
	"slices"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// mysqlContinueShare is the least share of a claim's Limit per key that a continued claim
// reads runs for: with more keys to continue than Limit over it, the claim searches for
// heads as though it did not continue ([dialect.ClaimParams.Continue] may be ignored).
const mysqlContinueShare = 2

// mysqlContinuable returns where the runs of a continued claim start
// ([dialect.ClaimParams.Continue]): of the keys of outcomes, just settled on tx, the last
// row of each key whose rows there are all delivered now, in the order of first appearance.
// It reads the rows by primary key in the settle's own transaction, which sees what the
// settle wrote under either isolation level: a row put back for a retry, buried, or whose
// lease was lost (another claimer's row, or not delivered) keeps its key from being
// continued. Each row returned is one this transaction changed and holds locked until it
// commits, so every other claimer still sees it processing and none takes the row after it
// as a head; the run read after it (mysqlRunsAfter) is then safe as after a head this
// transaction holds.
func mysqlContinuable(ctx context.Context, tx *sql.Tx, t dialect.Table, outcomes []dialect.Outcome, lost []uuid.UUID) ([]sqlkit.RunHead, error) {
	a := &dialect.Args{}
	type row struct {
		head      sqlkit.RunHead
		delivered bool
	}
	rows, err := sqlkit.QueryAll(ctx, tx, `SELECT namespace, partition_key, `+mysqlMicros(`created_at`)+`, id, status = 'delivered' FROM `+mysqlTable(t)+
		` FORCE INDEX (PRIMARY) WHERE id IN `+a.List(len(outcomes), func(i int) any { return sqlkit.UUIDBytes(outcomes[i].ID) })+
		` AND partition_key IS NOT NULL`, a.Values, func(s sqlkit.RowScanner) (row, error) {
		var r row
		err := s.Scan(&r.head.Namespace, &r.head.PartitionKey, &r.head.At, &r.head.ID, &r.delivered)
		return r, err
	})
	if err != nil {
		return nil, err
	}
	type key struct{ ns, pk string }
	last := make(map[key]int, len(rows)) // index into from; -1 once a row of the key was not delivered
	var from []sqlkit.RunHead
	for _, r := range rows {
		k := key{r.head.Namespace, r.head.PartitionKey}
		i, seen := last[k]
		switch {
		case !r.delivered || slices.Contains(lost, r.head.ID):
			last[k] = -1
		case !seen:
			last[k] = len(from)
			from = append(from, r.head)
		case i >= 0 && mysqlAfter(r.head, from[i]):
			from[i] = r.head
		}
	}
	return slices.DeleteFunc(from, func(h sqlkit.RunHead) bool { return last[key{h.Namespace, h.PartitionKey}] < 0 }), nil
}

// mysqlAfter reports whether x comes after y in claim order, (created_at, id).
func mysqlAfter(x, y sqlkit.RunHead) bool {
	if x.At != y.At {
		return x.At > y.At
	}
	return slices.Compare(x.ID[:], y.ID[:]) > 0
}
