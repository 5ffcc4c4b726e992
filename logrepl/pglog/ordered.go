package outboxpglog

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxgo/outbox"
)

// heldBack is the last_error of a row handed back to polling because an earlier row of
// its key was not delivered yet.
const heldBack = "held back for ordered delivery: an earlier message of its partition key is not delivered yet"

// publishOrdered publishes the deliveries of chunk (its rows at index) so that each key's
// rows go in commit order, and hands back to polling, with their attempt given back, the
// rows of a key whose earlier row is undelivered: in the table (blockedKeys) or in this
// chunk (failed, or not sent behind a failure). A transport that keeps key order
// ([outbox.TransportKeyOrder]) gets them in one call, each key's rows together; any other
// gets them in rounds of at most one row per key ([outbox.PublishInKeyOrder]). The
// outcomes carried in c (rows not visible yet to their settle) are earlier rows too.
func (p *Publisher) publishOrdered(ctx context.Context, c *carry, chunk []outbox.Record, deliveries []outbox.Delivery, index []int, outcomes []outbox.Outcome) error {
	stopped, err := p.blockedKeys(ctx, c, chunk, index)
	if err != nil {
		return err
	}
	hold := func(r outbox.Record) outbox.Outcome {
		return outbox.Outcome{Lease: r.Lease(), Status: outbox.StatusPending, Error: heldBack, RefundAttempt: true}
	}
	var ds []outbox.Delivery
	var ix []int
	for j, i := range index {
		if r := chunk[i]; r.PartitionKey != "" && stopped[r.PartitionKey] {
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
	ok := p.publishInto(ctx, publish, chunk, ds, ix, outcomes)
	for n, i := range ix {
		r := chunk[i]
		switch k := r.PartitionKey; {
		case k == "":
		case stopped[k]: // behind a failure: whatever the transport reported for it
			outcomes[i] = hold(r)
		case !ok[n]:
			stopped[k] = true
		}
	}
	return nil
}

// blockedKeys returns the partition keys of chunk's rows at index that have an earlier row
// (by created_at, id) in the table that is not delivered: pending, processing or, unless
// OrderedSkipDead, dead. Each key is checked from its first row in commit order. A row
// whose outcome is carried in c counts by that outcome, not by the table, which may not
// show the row yet, or shows it processing under the log's lease.
func (p *Publisher) blockedKeys(ctx context.Context, c *carry, chunk []outbox.Record, index []int) (map[string]bool, error) {
	var (
		keys    []string
		created []time.Time
		ids     []string
	)
	seen := map[string]bool{}
	for _, i := range index {
		r := chunk[i]
		if r.PartitionKey == "" || seen[r.PartitionKey] {
			continue
		}
		seen[r.PartitionKey] = true
		keys, created, ids = append(keys, r.PartitionKey), append(created, r.CreatedAt), append(ids, r.ID.String())
	}
	blocked := map[string]bool{}
	if len(keys) == 0 {
		return blocked, nil
	}
	carried := make([]string, len(c.held))
	for i, h := range c.held {
		carried[i] = h.ID.String()
		undelivered := h.Status == outbox.StatusPending || h.Status == outbox.StatusDead && !p.o.OrderedSkipDead
		if h.key != "" && seen[h.key] && undelivered {
			blocked[h.key] = true
		}
	}
	statuses := `'pending', 'processing', 'dead'`
	if p.o.OrderedSkipDead {
		statuses = `'pending', 'processing'`
	}
	t := p.store.Table()
	tbl := quoteIdent(t.Name())
	if t.Schema() != "" {
		tbl = quoteIdent(t.Schema()) + "." + tbl
	}
	rows, err := p.store.DB().QueryContext(ctx, `SELECT u.key FROM unnest($1::text[], $2::timestamptz[], $3::uuid[]) AS u(key, created_at, id)`+
		` WHERE EXISTS (SELECT 1 FROM `+tbl+` AS t WHERE t.namespace = $4 AND t.partition_key = u.key`+
		` AND t.status IN (`+statuses+`) AND (t.created_at, t.id) < (u.created_at, u.id) AND t.id <> ALL($5::uuid[]))`,
		keys, created, ids, p.o.Namespace, carried)
	if err != nil {
		return nil, fmt.Errorf("outboxpglog: read the heads of partition keys: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		blocked[k] = true
	}
	return blocked, rows.Err()
}
