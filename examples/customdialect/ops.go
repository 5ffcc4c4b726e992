package customdialect

import (
	"context"
	"database/sql"
	"strings"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
)

// insertChunk keeps one INSERT well below PostgreSQL's 65 535 bind arguments.
const insertChunk = 1000

// Insert writes rows with ON CONFLICT DO NOTHING on the dedupe index, so a duplicate key
// neither fails nor aborts the caller's transaction; RETURNING tells which rows went in.
func (*Dialect) Insert(ctx context.Context, q dialect.DBTX, t dialect.Table, rows []dialect.Row) ([]bool, error) {
	inserted := make([]bool, len(rows))
	for start := 0; start < len(rows); start += insertChunk {
		chunk := rows[start:min(start+insertChunk, len(rows))]
		a := newArgs()
		var b strings.Builder
		b.WriteString(`INSERT INTO ` + quote(t.Name()) + ` (id, namespace, topic, tenant, dedupe_key, partition_key, headers,
			body, body_sha256, state, attempts, due_at, created_at, updated_at) VALUES `)
		for i, r := range chunk {
			if i > 0 {
				b.WriteString(", ")
			}
			var headers any
			if len(r.Headers) > 0 {
				v, err := r.Headers.Value()
				if err != nil {
					return nil, err
				}
				headers = v
			}
			b.WriteString("(" + a.Add(r.ID.String()) + "::uuid, " + a.Add(r.Namespace) + ", " + a.Add(r.Topic) + ", " +
				a.Add(nullUUID(r.TenantID)) + "::uuid, " + a.Add(nullable(r.DedupeKey)) + ", " + a.Add(nullable(r.PartitionKey)) + ", " +
				a.Add(headers) + "::jsonb, " + a.Add(r.Payload) + "::bytea, " + a.Add(r.PayloadHash) + "::bytea, 0, 0, " +
				now + " + " + a.interval(r.Delay) + ", " + now + ", " + now + ")")
		}
		b.WriteString(` ON CONFLICT (namespace, topic, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING RETURNING id`)
		got, err := dialect.QueryIDs(ctx, q, b.String(), a.Values...)
		if err != nil {
			return nil, err
		}
		for i, r := range chunk {
			for _, id := range got {
				if id == r.ID {
					inserted[start+i] = true
					break
				}
			}
		}
	}
	return inserted, nil
}

// claimSQL renders the claim: the eligible rows in claim order, locked with SKIP LOCKED so
// that concurrent claimers pass each other, leased in the same statement.
func claimSQL(t dialect.Table, p dialect.ClaimParams) (string, *args) {
	a := newArgs()
	tbl := quote(t.Name())
	head := ""
	if p.Ordered {
		live := "0, 1, 3"
		if p.OrderedSkipDead {
			live = "0, 1"
		}
		// A keyed row is claimable only while no earlier row of its key is live.
		head = ` AND (c.partition_key IS NULL OR NOT EXISTS (SELECT 1 FROM ` + tbl + ` e
			WHERE e.namespace = c.namespace AND e.partition_key = c.partition_key AND e.state IN (` + live + `)
			AND (e.created_at, e.id) < (c.created_at, c.id)))`
	}
	// Unordered claims take rows in the order they became due (a pending row's due_at, an
	// expired lease's lease_until); ordered ones walk the keys' creation order.
	order := `CASE c.state WHEN 0 THEN c.due_at ELSE c.lease_until END, c.id`
	if p.Ordered {
		order = `c.created_at, c.id`
	}
	sel := `SELECT c.id FROM ` + tbl + ` c
		WHERE c.state IN (0, 1) AND ((c.state = 0 AND c.due_at <= ` + now + `) OR (c.state = 1 AND c.lease_until < ` + now + `))
		AND c.attempts < ` + a.Add(p.MaxAttempts) + a.scope(p.Scope, "c.") + head + `
		ORDER BY ` + order + ` LIMIT ` + a.Add(p.Limit) + lockRows
	stmt := `WITH picked AS (` + sel + `)
		UPDATE ` + tbl + ` o SET state = 1, attempts = o.attempts + 1, owner = ` + a.Add(p.WorkerID) + `,
			lease_until = ` + now + ` + ` + a.interval(p.Lease) + `, lease_token = ` + a.Add(p.Token.String()) + `::uuid,
			updated_at = ` + now + `
		FROM picked WHERE o.id = picked.id RETURNING ` + prefixed("o")
	return stmt, a
}

func claim(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ClaimParams) ([]dialect.Record, error) {
	// A field added to ClaimParams after this dialect was written is refused, not ignored.
	if err := p.Unsupported("Ordered", "OrderedSkipDead"); err != nil {
		return nil, err
	}
	stmt, a := claimSQL(t, p)
	recs, err := query(ctx, q, scanRecord, stmt, a.Values...)
	dialect.SortClaimed(recs)
	return recs, err
}

// Claim runs as one statement on the pool: its own short transaction.
func (*Dialect) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]dialect.Record, error) {
	return claim(ctx, db, t, p)
}

// Complete applies every outcome in one UPDATE joined to a VALUES list, only where the row
// is still processing under the outcome's token.
func (*Dialect) Complete(ctx context.Context, q dialect.DBTX, t dialect.Table, outcomes []dialect.Outcome) ([]uuid.UUID, error) {
	if len(outcomes) == 0 {
		return nil, nil
	}
	a := newArgs()
	var vals strings.Builder
	for i, o := range outcomes {
		if i > 0 {
			vals.WriteString(", ")
		}
		vals.WriteString("(" + a.Add(o.ID.String()) + "::uuid, " + a.Add(o.Token.String()) + "::uuid, " +
			a.Add(stateOf(o.Status)) + "::smallint, " + a.Add(o.Delay.Microseconds()) + "::bigint, " +
			a.Add(nullable(o.Error)) + "::text, " + a.Add(o.RefundAttempt) + "::boolean)")
	}
	stmt := `UPDATE ` + quote(t.Name()) + ` o SET
			state = v.state, owner = NULL, lease_until = NULL, updated_at = ` + now + `,
			due_at = CASE WHEN v.state = 0 THEN ` + now + ` + v.delay * interval '1 microsecond' ELSE o.due_at END,
			error = CASE WHEN v.state IN (0, 3) THEN v.err ELSE o.error END,
			delivered_at = CASE WHEN v.state = 2 THEN ` + now + ` ELSE o.delivered_at END,
			attempts = CASE WHEN v.refund THEN greatest(o.attempts - 1, 0) ELSE o.attempts END
		FROM (VALUES ` + vals.String() + `) AS v(id, token, state, delay, err, refund)
		WHERE o.id = v.id AND o.state = 1 AND o.lease_token = v.token RETURNING o.id`
	done, err := dialect.QueryIDs(ctx, q, stmt, a.Values...)
	if err != nil {
		return nil, err
	}
	return dialect.Lost(dialect.Leases(outcomes), done), nil
}

// Extend renews the leases still held under their tokens; updated_at moves with them, so
// that locked_until - updated_at is the lease.
func (*Dialect) Extend(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ExtendParams) ([]uuid.UUID, error) {
	if len(p.Leases) == 0 {
		return nil, nil
	}
	a := newArgs()
	var vals strings.Builder
	for i, l := range p.Leases {
		if i > 0 {
			vals.WriteString(", ")
		}
		vals.WriteString("(" + a.Add(l.ID.String()) + "::uuid, " + a.Add(l.Token.String()) + "::uuid)")
	}
	stmt := `UPDATE ` + quote(t.Name()) + ` o SET lease_until = ` + now + ` + ` + a.interval(p.Lease) + `, updated_at = ` + now + `
		FROM (VALUES ` + vals.String() + `) AS v(id, token)
		WHERE o.id = v.id AND o.state = 1 AND o.lease_token = v.token RETURNING o.id`
	done, err := dialect.QueryIDs(ctx, q, stmt, a.Values...)
	if err != nil {
		return nil, err
	}
	return dialect.Lost(p.Leases, done), nil
}

// Bury dead-letters exhausted rows that no live lease protects.
func (*Dialect) Bury(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.BuryParams) ([]uuid.UUID, error) {
	a := newArgs()
	tbl := quote(t.Name())
	which := `(c.state = 0 OR (c.state = 1 AND c.lease_until < ` + now + `))`
	if p.ExpiredOnly {
		which = `c.state = 1 AND c.lease_until < ` + now
	}
	stmt := `WITH picked AS (SELECT c.id FROM ` + tbl + ` c WHERE c.state IN (0, 1) AND ` + which +
		` AND c.attempts >= ` + a.Add(p.MaxAttempts) + a.scope(p.Scope, "c.") +
		` ORDER BY c.created_at, c.id LIMIT ` + a.Add(p.Limit) + ` FOR UPDATE SKIP LOCKED)
		UPDATE ` + tbl + ` o SET state = 3, error = ` + a.Add(nullable(p.Reason)) + `, lease_token = ` + a.Add(p.Token.String()) + `::uuid,
			owner = NULL, lease_until = NULL, updated_at = ` + now + `
		FROM picked WHERE o.id = picked.id RETURNING o.id`
	return dialect.QueryIDs(ctx, q, stmt, a.Values...)
}

// Get reads one row.
func (*Dialect) Get(ctx context.Context, q dialect.DBTX, t dialect.Table, id uuid.UUID) (dialect.Record, error) {
	r, err := scanRecord(q.QueryRowContext(ctx, `SELECT `+selectCols+` FROM `+quote(t.Name())+` WHERE id = $1::uuid`, id.String()))
	if err == sql.ErrNoRows {
		return dialect.Record{}, dialect.ErrNotFound
	}
	return r, err
}

// CompleteAndClaim settles and claims in one transaction: the claim's statement sees the
// outcomes applied, and a settled row's old lease can no longer make it claimable.
func (d *Dialect) CompleteAndClaim(ctx context.Context, db *sql.DB, t dialect.Table, outcomes []dialect.Outcome, p dialect.ClaimParams) (claimed []dialect.Record, lostIDs []uuid.UUID, err error) {
	err = inTx(ctx, db, func(tx *sql.Tx) error {
		var err error
		if lostIDs, err = d.Complete(ctx, tx, t, outcomes); err != nil {
			return err
		}
		claimed, err = claim(ctx, tx, t, p)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return claimed, lostIDs, nil
}

// BlockedKeys lists the keys whose head (first live row) is dead while rows wait behind it.
func (*Dialect) BlockedKeys(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.BlockedKeysParams) ([]dialect.BlockedKey, error) {
	a := newArgs()
	tbl := quote(t.Name())
	stmt := `SELECT h.namespace, h.partition_key, h.id, h.topic, coalesce(h.error, ''), w.n FROM ` + tbl + ` h,
		LATERAL (SELECT count(*) AS n FROM ` + tbl + ` x WHERE x.namespace = h.namespace AND x.partition_key = h.partition_key AND x.state IN (0, 1)) w
		WHERE h.state = 3 AND h.partition_key IS NOT NULL` + a.scope(p.Scope, "h.") + ` AND w.n > 0
		AND NOT EXISTS (SELECT 1 FROM ` + tbl + ` e WHERE e.namespace = h.namespace AND e.partition_key = h.partition_key
			AND e.state IN (0, 1, 3) AND (e.created_at, e.id) < (h.created_at, h.id))
		ORDER BY h.created_at, h.id LIMIT ` + a.Add(p.Limit)
	return query(ctx, q, func(s scanner) (k dialect.BlockedKey, err error) {
		err = s.Scan(&k.Namespace, &k.PartitionKey, &k.HeadID, &k.Topic, &k.LastError, &k.Waiting)
		return k, err
	}, stmt, a.Values...)
}
