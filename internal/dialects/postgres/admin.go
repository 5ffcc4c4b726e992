package postgres

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// pgAt binds a time for a comparison with a timestamptz column.
func pgAt(a *dialect.Args, t time.Time) string { return a.Add(t.UTC()) + `::timestamptz` }

// Stats reads the live rows through the partial claim index, the dead rows and the
// delivered sample through the partial retention index, and estimates the delivered rows
// from the planner's statistics (EXPLAIN), which cost no scan. Status values are literals,
// not parameters, so that a generic plan can still prove a partial index's predicate.
func (*Dialect) Stats(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.StatsParams) (dialect.StatsSample, error) {
	tbl := pgTable(t)
	due := `status = 'pending' AND next_attempt_at <= now()`
	la, da := &dialect.Args{Numbered: true}, &dialect.Args{Numbered: true}
	r := sqlkit.StatsReads{
		Live: `SELECT namespace, topic, count(*) FILTER (WHERE ` + due + `),` +
			` count(*) FILTER (WHERE status = 'pending' AND next_attempt_at > now()),` +
			` count(*) FILTER (WHERE status = 'processing'),` +
			` COALESCE((EXTRACT(EPOCH FROM now() - min(next_attempt_at) FILTER (WHERE ` + due + `)) * 1000000)::bigint, 0),` +
			` COALESCE((EXTRACT(EPOCH FROM now() - min(` + sqlkit.SQLFirstDue("now()") + `)) * 1000000)::bigint, 0)` +
			` FROM ` + tbl + ` WHERE status IN ('pending', 'processing')` + sqlkit.ScopeSQL(la, p.Scope, "", pgUUID) + ` GROUP BY namespace, topic`,
		Dead: `SELECT namespace, topic, count(*) FROM ` + tbl + ` WHERE status = 'dead'` + sqlkit.ScopeSQL(da, p.Scope, "", pgUUID) +
			` GROUP BY namespace, topic`,
		Sample: sqlkit.SampleSQL(`SELECT namespace, topic, tenant_id, updated_at FROM `+tbl+
			` WHERE status = 'delivered' ORDER BY updated_at DESC LIMIT $1::bigint`,
			func(lo string) string {
				return `COALESCE((EXTRACT(EPOCH FROM now() - ` + lo + `) * 1000000)::bigint, 0)`
			}),
		SampleArgs: []any{p.DeliveredSample},
		Total: func(int64) (int64, error) {
			return pgPlanRows(ctx, q, `SELECT 1 FROM `+tbl+` WHERE status = 'delivered'`)
		},
	}
	r.LiveArgs, r.DeadArgs = la.Values, da.Values
	return sqlkit.RunStatsReads(ctx, q, p.Scope, p.DeliveredSample, r)
}

// pgPlanRows returns the planner's estimate of the rows query returns.
func pgPlanRows(ctx context.Context, q dialect.DBTX, query string) (int64, error) {
	var out string
	if err := q.QueryRowContext(ctx, `EXPLAIN (FORMAT JSON) `+query).Scan(&out); err != nil {
		return 0, err
	}
	var plans []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		}
	}
	if err := json.Unmarshal([]byte(out), &plans); err != nil || len(plans) != 1 {
		return 0, fmt.Errorf("reading EXPLAIN output: %v", err)
	}
	return int64(math.Round(plans[0].Plan.Rows)), nil
}

// ListDead walks the partial retention index (status, updated_at) backwards.
func (d *Dialect) ListDead(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ListDeadParams) ([]dialect.Record, error) {
	a := &dialect.Args{Numbered: true}
	query := `SELECT ` + sqlkit.SelectList(sqlkit.RecordColumns, "", nil) + ` FROM ` + pgTable(t) +
		` WHERE ` + sqlkit.DeadWhere(a, p, pgAt, pgUUID, pgContains) + ` ORDER BY updated_at DESC, id DESC LIMIT ` + a.Add(p.Limit) + `::bigint`
	return sqlkit.QueryAll(ctx, q, query, a.Values, sqlkit.ScanRecord)
}

// Replay is one UPDATE ... RETURNING; the status = 'dead' term is checked again on the
// row's current version when a concurrent claim, purge or replay held it.
func (*Dialect) Replay(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ReplayParams) ([]uuid.UUID, error) {
	ids := pgUUIDArray(len(p.IDs), func(i int) uuid.UUID { return p.IDs[i] })
	return dialect.QueryIDs(ctx, db, `UPDATE `+pgTable(t)+` SET status = 'pending', attempts = 0, next_attempt_at = now(),`+
		` locked_by = NULL, locked_until = NULL, lease_token = $2, replays = replays + 1, updated_at = now()`+
		` WHERE id = ANY($1::uuid[]) AND status = 'dead' RETURNING id`, ids, pgUUID(p.Token))
}

// Discard is one DELETE ... RETURNING.
func (*Dialect) Discard(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.DiscardParams) ([]uuid.UUID, error) {
	ids := pgUUIDArray(len(p.IDs), func(i int) uuid.UUID { return p.IDs[i] })
	return dialect.QueryIDs(ctx, db, `DELETE FROM `+pgTable(t)+` WHERE id = ANY($1::uuid[]) AND status = 'dead' RETURNING id`, ids)
}

// pgPurgeSQL renders the purge of one status: the oldest rows by the partial retention
// index, locked with SKIP LOCKED so that concurrent purgers take different rows, in a
// materialized CTE that runs once.
func pgPurgeSQL(t dialect.Table, status dialect.Status) string {
	tbl := pgTable(t)
	return `WITH c AS MATERIALIZED (SELECT id FROM ` + tbl + ` WHERE status = '` + string(status) + `'` +
		` AND updated_at < now() - ` + pgMicros(`$1::bigint`) + ` ORDER BY updated_at LIMIT $2::bigint FOR UPDATE SKIP LOCKED)` +
		` DELETE FROM ` + tbl + ` AS t USING c WHERE t.id = c.id`
}

func (*Dialect) Purge(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.PurgeParams) (int64, error) {
	if p.Status != dialect.StatusDelivered && p.Status != dialect.StatusDead {
		return 0, fmt.Errorf("purge of %q rows: only delivered and dead rows may be purged", p.Status)
	}
	res, err := db.ExecContext(ctx, pgPurgeSQL(t, p.Status), sqlkit.Micros(p.OlderThan), p.Limit)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
