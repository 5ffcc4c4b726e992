package outboxbinlog

import (
	"context"
	"fmt"
	"strings"

	"github.com/outboxgo/outbox"
)

// heldBack is the last_error of a row handed back to polling because an earlier row of
// its key was not delivered yet.
const heldBack = "held back for ordered delivery: an earlier message of its partition key is not delivered yet"

// publishOrdered publishes the deliveries of chunk (its rows at index) in rounds that hold
// at most one row per partition key, each key's rows in commit order, and hands back to
// polling every row of a key whose earlier row is undelivered: in the table (blockedKeys)
// or in this chunk (failed or held). Rows without a key all go in the first round.
//
// A transport that keeps key order ([outbox.TransportKeyOrder]) gets one round: each key's
// rows together, in commit order.
func (p *Publisher) publishOrdered(ctx context.Context, chunk []outbox.Record, deliveries []outbox.Delivery, index []int, outcomes []outbox.Outcome) error {
	stopped, err := p.blockedKeys(ctx, chunk, index)
	if err != nil {
		return err
	}
	if p.keyOrder {
		p.publishRuns(ctx, chunk, deliveries, index, outcomes, stopped)
		return nil
	}
	remaining := make([]int, len(index)) // positions in deliveries and index
	for j := range remaining {
		remaining[j] = j
	}
	for len(remaining) > 0 {
		var round, next []int
		inRound := map[string]bool{}
		for _, j := range remaining {
			r := chunk[index[j]]
			k := r.PartitionKey
			switch {
			case k == "":
				round = append(round, j)
			case stopped[k]:
				outcomes[index[j]] = outbox.Outcome{Lease: outbox.Lease{ID: r.ID, Token: r.LeaseToken},
					Status: outbox.StatusPending, Error: heldBack, RefundAttempt: true}
			case inRound[k]:
				next = append(next, j)
			default:
				inRound[k] = true
				round = append(round, j)
			}
		}
		ds, ix := make([]outbox.Delivery, len(round)), make([]int, len(round))
		for n, j := range round {
			ds[n], ix[n] = deliveries[j], index[j]
		}
		ok := p.publishInto(ctx, chunk, ds, ix, outcomes)
		for n, i := range ix {
			if k := chunk[i].PartitionKey; k != "" && !ok[n] {
				stopped[k] = true
			}
		}
		remaining = next
	}
	return nil
}

// publishRuns publishes every row of a key that is not stopped in one call, to a transport
// that keeps key order; the rows of a key after its first undelivered one (which that
// transport did not deliver) are handed back to polling with their attempt given back.
func (p *Publisher) publishRuns(ctx context.Context, chunk []outbox.Record, deliveries []outbox.Delivery, index []int, outcomes []outbox.Outcome, stopped map[string]bool) {
	var ds []outbox.Delivery
	var ix []int
	hold := func(r outbox.Record) outbox.Outcome {
		return outbox.Outcome{Lease: outbox.Lease{ID: r.ID, Token: r.LeaseToken}, Status: outbox.StatusPending, Error: heldBack, RefundAttempt: true}
	}
	for j, i := range index {
		if r := chunk[i]; r.PartitionKey != "" && stopped[r.PartitionKey] {
			outcomes[i] = hold(r)
			continue
		}
		ds, ix = append(ds, deliveries[j]), append(ix, i)
	}
	ok := p.publishInto(ctx, chunk, ds, ix, outcomes)
	for n, i := range ix {
		r := chunk[i]
		switch k := r.PartitionKey; {
		case k == "":
		case stopped[k]:
			outcomes[i] = hold(r)
		case !ok[n]:
			stopped[k] = true
		}
	}
}

// blockedKeys returns the partition keys of chunk's rows at index that have an earlier row
// (by created_at, id) in the table that is not delivered: pending, processing or, unless
// OrderedSkipDead, dead. Each key is checked from its first row in commit order. The
// ordered migration set's order_key (the partition key of a row that is pending,
// processing or dead) and its index (namespace, order_key, created_at, id) serve it.
func (p *Publisher) blockedKeys(ctx context.Context, chunk []outbox.Record, index []int) (map[string]bool, error) {
	var (
		b    strings.Builder
		args []any
	)
	seen := map[string]bool{}
	for _, i := range index {
		r := chunk[i]
		if r.PartitionKey == "" || seen[r.PartitionKey] {
			continue
		}
		if len(seen) == 0 {
			b.WriteString(`SELECT CAST(? AS BINARY) AS k, ` + epoch + ` + INTERVAL ? MICROSECOND AS c, CAST(? AS BINARY(16)) AS i`)
		} else {
			b.WriteString(` UNION ALL SELECT ?, ` + epoch + ` + INTERVAL ? MICROSECOND, ?`)
		}
		seen[r.PartitionKey] = true
		args = append(args, []byte(r.PartitionKey), r.CreatedAt.UnixMicro(), r.ID[:])
	}
	blocked := map[string]bool{}
	if len(seen) == 0 {
		return blocked, nil
	}
	dead := ``
	if p.o.OrderedSkipDead {
		dead = ` AND t.status <> 'dead'`
	}
	args = append(args, p.o.Namespace)
	rows, err := p.store.DB().QueryContext(ctx, `SELECT u.k FROM (`+b.String()+`) AS u WHERE EXISTS (SELECT 1 FROM `+
		quote(p.store.Table().Name())+` AS t WHERE t.namespace = ? AND t.order_key = u.k AND (t.created_at, t.id) < (u.c, u.i)`+dead+`)`,
		args...)
	if err != nil {
		return nil, fmt.Errorf("outboxbinlog: read the heads of partition keys (is the table made with the ordered migration set?): %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k []byte
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		blocked[string(k)] = true
	}
	return blocked, rows.Err()
}

// epoch is the Unix epoch as a DATETIME literal: arithmetic from it involves no time zone.
const epoch = "TIMESTAMP'1970-01-01 00:00:00'"
