package outboxbinlog

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/outboxgo/outbox"
)

// heldBack is the last_error of a row handed back to polling because an earlier row of
// its key was not delivered yet.
const heldBack = "held back for ordered delivery: an earlier message of its partition key is not delivered yet"

// publishOrdered publishes the deliveries of rows (the rows at index) so that each key's
// rows go in commit order, and hands back to polling, with their attempt given back, the
// rows of a key that is stopped: held back by an earlier row undelivered in the table
// (blockedKeys, read by the caller), or by a failure among the rows before them, which
// stops the key for the rest of the caller's batches too. A transport that keeps key order
// ([outbox.TransportKeyOrder]) gets them in one call, each key's rows together; any other
// gets them in rounds of at most one row per key ([outbox.PublishInKeyOrder]).
func (p *Publisher) publishOrdered(ctx context.Context, rows []outbox.Record, deliveries []outbox.Delivery, index []int, outcomes []outbox.Outcome, stopped map[string]bool) {
	hold := func(r outbox.Record) outbox.Outcome {
		return outbox.Outcome{Lease: r.Lease(), Status: outbox.StatusPending, Error: heldBack, RefundAttempt: true}
	}
	var ds []outbox.Delivery
	var ix []int
	for j, i := range index {
		if r := rows[i]; r.PartitionKey != "" && stopped[r.PartitionKey] {
			outcomes[i] = hold(r)
			continue
		}
		ds, ix = append(ds, deliveries[j]), append(ix, i)
	}
	publish := p.publish
	if !p.keyOrder {
		publish = func(ctx context.Context, batch []outbox.Delivery) []error {
			return outbox.PublishInKeyOrder(ctx, batch, nil, p.publish)
		}
	}
	ok := p.publishInto(ctx, publish, rows, ds, ix, outcomes)
	for n, i := range ix {
		r := rows[i]
		switch k := r.PartitionKey; {
		case k == "":
		case stopped[k]: // behind a failure: whatever the transport reported for it
			outcomes[i] = hold(r)
		case !ok[n]:
			stopped[k] = true
		}
	}
}

// blockedKeys returns the partition keys of rows at index that have an earlier row (by
// created_at, id) in the table that is not delivered: pending, processing or, unless
// OrderedSkipDead, dead. Each key is checked from its first row in commit order, up to
// outbox.MaxBatch keys a statement (a transaction's rows can hold any number of keys, and
// a statement takes at most 65,535 placeholders). The ordered migration set's order_key
// (the partition key of a row that is pending, processing or dead) and its index
// (namespace, order_key, created_at, id) serve it.
func (p *Publisher) blockedKeys(ctx context.Context, rows []outbox.Record, index []int) (map[string]bool, error) {
	var firsts []outbox.Record
	seen := map[string]bool{}
	for _, i := range index {
		if r := rows[i]; r.PartitionKey != "" && !seen[r.PartitionKey] {
			seen[r.PartitionKey] = true
			firsts = append(firsts, r)
		}
	}
	blocked := map[string]bool{}
	for part := range slices.Chunk(firsts, outbox.MaxBatch) {
		if err := p.readBlocked(ctx, part, blocked); err != nil {
			return nil, err
		}
	}
	return blocked, nil
}

// readBlocked adds to blocked the keys of firsts, each its key's first row, that an
// earlier row holds back.
func (p *Publisher) readBlocked(ctx context.Context, firsts []outbox.Record, blocked map[string]bool) error {
	var (
		b    strings.Builder
		args []any
	)
	for i, r := range firsts {
		if i == 0 {
			b.WriteString(`SELECT CAST(? AS BINARY) AS k, ` + epoch + ` + INTERVAL ? MICROSECOND AS c, CAST(? AS BINARY(16)) AS i`)
		} else {
			b.WriteString(` UNION ALL SELECT ?, ` + epoch + ` + INTERVAL ? MICROSECOND, ?`)
		}
		args = append(args, []byte(r.PartitionKey), r.CreatedAt.UnixMicro(), r.ID[:])
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
		return fmt.Errorf("outboxbinlog: read the heads of partition keys (is the table made with the ordered migration set?): %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k []byte
		if err := rows.Scan(&k); err != nil {
			return err
		}
		blocked[string(k)] = true
	}
	return rows.Err()
}

// epoch is the Unix epoch as a DATETIME literal: arithmetic from it involves no time zone.
const epoch = "TIMESTAMP'1970-01-01 00:00:00'"
