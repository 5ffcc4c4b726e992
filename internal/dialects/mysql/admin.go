package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// mysqlAt binds a time as Unix microseconds, compared as a DATETIME(6) in UTC.
func mysqlAt(a *dialect.Args, t time.Time) string { return mysqlFromMicros(a.Add(t.UnixMicro())) }

// mysqlIndex renders FORCE INDEX for one of the table's named indexes.
func mysqlIndex(t dialect.Table, purpose string) string {
	return ` FORCE INDEX (` + sqlkit.QuoteIdent(t.Index(purpose), '`') + `)`
}

// Stats reads the live rows through the claim index (status, created_at, id,
// locked_until), the dead rows and the delivered sample through the retention index
// (status, updated_at), and estimates the delivered rows as InnoDB's estimate of the
// table's rows (information_schema, from its statistics: no scan) less the live and dead
// rows counted. An exact COUNT(*) of a million
// delivered rows reads every index entry (0.2 to 0.6 s here), and the optimizer's estimate
// for the index range is no help: InnoDB caps a range estimate at half the table.
func (Dialect) Stats(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.StatsParams) (dialect.StatsSample, error) {
	tbl := mysqlTable(t)
	due := `status = 'pending' AND next_attempt_at <= UTC_TIMESTAMP(6)`
	la, da := &dialect.Args{}, &dialect.Args{}
	r := sqlkit.StatsReads{
		Live: `SELECT namespace, topic, COALESCE(SUM(` + due + `), 0),` +
			` COALESCE(SUM(status = 'pending' AND next_attempt_at > UTC_TIMESTAMP(6)), 0), COALESCE(SUM(status = 'processing'), 0),` +
			` COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(CASE WHEN ` + due + ` THEN next_attempt_at END), UTC_TIMESTAMP(6)), 0),` +
			` COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(` + sqlkit.SQLFirstDue("UTC_TIMESTAMP(6)") + `), UTC_TIMESTAMP(6)), 0)` +
			` FROM ` + tbl + mysqlIndex(t, "claim") + ` WHERE status IN ('pending', 'processing')` + sqlkit.ScopeSQL(la, p.Scope, "", sqlkit.UUIDBytes) +
			` GROUP BY namespace, topic`,
		Dead: `SELECT namespace, topic, COUNT(*) FROM ` + tbl + mysqlIndex(t, "retention") + ` WHERE status = 'dead'` +
			sqlkit.ScopeSQL(da, p.Scope, "", sqlkit.UUIDBytes) + ` GROUP BY namespace, topic`,
		Sample: sqlkit.SampleSQL(`SELECT namespace, topic, tenant_id, updated_at FROM `+tbl+mysqlIndex(t, "retention")+
			` WHERE status = 'delivered' ORDER BY updated_at DESC LIMIT ?`,
			func(lo string) string { return `COALESCE(TIMESTAMPDIFF(MICROSECOND, ` + lo + `, UTC_TIMESTAMP(6)), 0)` }),
		SampleArgs: []any{p.DeliveredSample},
		Total: func(counted int64) (n int64, err error) {
			err = q.QueryRowContext(ctx, `SELECT COALESCE(TABLE_ROWS, 0) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`,
				t.Name()).Scan(&n)
			return n - counted, err
		},
	}
	r.LiveArgs, r.DeadArgs = la.Values, da.Values
	return sqlkit.RunStatsReads(ctx, q, p.Scope, p.DeliveredSample, r)
}

// ListDead walks the retention index (status, updated_at), whose entries end with the
// primary key, so (updated_at, id) descending is the index order: no sort.
func (Dialect) ListDead(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ListDeadParams) ([]dialect.Record, error) {
	a := &dialect.Args{}
	query := `SELECT ` + mysqlColumns + ` FROM ` + mysqlTable(t) + mysqlIndex(t, "retention") +
		` WHERE ` + sqlkit.DeadWhere(a, p, mysqlAt, sqlkit.UUIDBytes, mysqlContains) + ` ORDER BY updated_at DESC, id DESC LIMIT ` + a.Add(p.Limit)
	return sqlkit.QueryAll(ctx, q, query, a.Values, sqlkit.ScanRecord)
}

// mysqlInTx runs fn in a READ COMMITTED transaction on db (no gap locks, as for a claim),
// and runs it again after a deadlock or a lock wait timeout, like a claim.
func mysqlInTx[T any](ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) (T, error)) (T, error) {
	v, err := sqlkit.RetryLocked(ctx, mysqlRetryable, func() (T, error) {
		var zero T
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return zero, err
		}
		defer func() { _ = tx.Rollback() }()
		v, err := fn(tx)
		if err != nil {
			return zero, err
		}
		return v, tx.Commit()
	})
	return v, mysqlConflict(err)
}

// Replay updates the dead rows by primary key and, when not every id was dead, reads back
// which rows carry the replay's fresh token, in the same transaction: the rows it changed
// stay locked until the commit, so no claim can have moved them in between.
func (Dialect) Replay(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ReplayParams) ([]uuid.UUID, error) {
	tbl := mysqlTable(t)
	return mysqlInTx(ctx, db, func(tx *sql.Tx) ([]uuid.UUID, error) {
		a := &dialect.Args{}
		token := a.Add(sqlkit.UUIDBytes(p.Token))
		in := a.List(len(p.IDs), func(i int) any { return sqlkit.UUIDBytes(p.IDs[i]) })
		res, err := tx.ExecContext(ctx, `UPDATE `+tbl+` FORCE INDEX (PRIMARY) SET status = 'pending', attempts = 0,`+
			` next_attempt_at = UTC_TIMESTAMP(6), locked_by = NULL, locked_until = NULL, lease_token = `+token+
			`, replays = replays + 1, updated_at = UTC_TIMESTAMP(6) WHERE id IN `+in+` AND status = 'dead'`, a.Values...)
		if err != nil {
			return nil, err
		}
		n, err := res.RowsAffected()
		switch {
		case err != nil:
			return nil, err
		case n == 0:
			return nil, nil
		case n == int64(len(p.IDs)):
			return p.IDs, nil
		}
		a = &dialect.Args{}
		return dialect.QueryIDs(ctx, tx, `SELECT id FROM `+tbl+` WHERE id IN `+a.List(len(p.IDs), func(i int) any { return sqlkit.UUIDBytes(p.IDs[i]) })+
			` AND lease_token = `+a.Add(sqlkit.UUIDBytes(p.Token))+` AND status = 'pending'`, a.Values...)
	})
}

// mysqlDoomed is a row about to be deleted, with what it holds in <table>_dedupe.
type mysqlDoomed struct {
	id               uuid.UUID
	namespace, topic string
	dedupeKey        sql.NullString
}

// mysqlLockDoomed runs a locking read of id, namespace, topic, dedupe_key.
func mysqlLockDoomed(ctx context.Context, tx *sql.Tx, query string, vals []any) ([]mysqlDoomed, error) {
	return sqlkit.QueryAll(ctx, tx, query, vals, func(s sqlkit.RowScanner) (r mysqlDoomed, err error) {
		err = s.Scan(&r.id, &r.namespace, &r.topic, &r.dedupeKey)
		return r, err
	})
}

// mysqlDelete deletes locked rows and the dedupe keys they hold, in tx. A key is deleted
// only while it still names the deleted row's id.
func mysqlDelete(ctx context.Context, tx *sql.Tx, t dialect.Table, rows []mysqlDoomed) error {
	if len(rows) == 0 {
		return nil
	}
	a := &dialect.Args{}
	if _, err := tx.ExecContext(ctx, `DELETE FROM `+mysqlTable(t)+` WHERE id IN `+
		a.List(len(rows), func(i int) any { return sqlkit.UUIDBytes(rows[i].id) }), a.Values...); err != nil {
		return err
	}
	a = &dialect.Args{}
	var b strings.Builder
	for _, r := range rows {
		if !r.dedupeKey.Valid {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(` OR `)
		}
		b.WriteString(`(namespace = ` + a.Add(r.namespace) + ` AND topic = ` + a.Add(r.topic) +
			` AND dedupe_key = ` + a.Add(r.dedupeKey.String) + ` AND id = ` + a.Add(sqlkit.UUIDBytes(r.id)) + `)`)
	}
	if b.Len() == 0 {
		return nil
	}
	_, err := tx.ExecContext(ctx, `DELETE FROM `+mysqlDedupeTable(t)+` WHERE `+b.String(), a.Values...)
	return err
}

func mysqlDoomedIDs(rows []mysqlDoomed) []uuid.UUID {
	ids := make([]uuid.UUID, len(rows))
	for i := range rows {
		ids[i] = rows[i].id
	}
	return ids
}

// Discard locks the dead rows among the ids by primary key, then deletes them and their
// dedupe keys, in one transaction.
func (Dialect) Discard(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.DiscardParams) ([]uuid.UUID, error) {
	return mysqlInTx(ctx, db, func(tx *sql.Tx) ([]uuid.UUID, error) {
		a := &dialect.Args{}
		rows, err := mysqlLockDoomed(ctx, tx, `SELECT id, namespace, topic, dedupe_key FROM `+mysqlTable(t)+` FORCE INDEX (PRIMARY)`+
			` WHERE id IN `+a.List(len(p.IDs), func(i int) any { return sqlkit.UUIDBytes(p.IDs[i]) })+` AND status = 'dead' FOR UPDATE`, a.Values)
		if err != nil {
			return nil, err
		}
		return mysqlDoomedIDs(rows), mysqlDelete(ctx, tx, t, rows)
	})
}

// Purge locks the oldest rows of the status through the retention index with SKIP LOCKED
// (concurrent purgers take different rows, and none waits on a claim or an ack), then
// deletes them and their dedupe keys by primary key, in one short transaction.
func (Dialect) Purge(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.PurgeParams) (int64, error) {
	if p.Status != dialect.StatusDelivered && p.Status != dialect.StatusDead {
		return 0, fmt.Errorf("purge of %q rows: only delivered and dead rows may be purged", p.Status)
	}
	return mysqlInTx(ctx, db, func(tx *sql.Tx) (int64, error) {
		rows, err := mysqlLockDoomed(ctx, tx, mysqlPurgeSQL(t, p.Status), []any{sqlkit.Micros(p.OlderThan), p.Limit})
		if err != nil {
			return 0, err
		}
		return int64(len(rows)), mysqlDelete(ctx, tx, t, rows)
	})
}

// mysqlPurgeSQL renders the locking read of one purge batch.
func mysqlPurgeSQL(t dialect.Table, status dialect.Status) string {
	return `SELECT id, namespace, topic, dedupe_key FROM ` + mysqlTable(t) + mysqlIndex(t, "retention") +
		` WHERE status = '` + string(status) + `' AND updated_at < DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND)` +
		` ORDER BY updated_at LIMIT ? FOR UPDATE SKIP LOCKED`
}
