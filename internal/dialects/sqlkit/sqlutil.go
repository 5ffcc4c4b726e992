// Package sqlkit holds what the built-in dialects (packages postgres, mysql and sqlite
// beside it) share: the column lists and record scanners, the INSERT shapes, the prepared
// statement cache, the admin and inspection reads, the checks of a table and of a server,
// and the lock retry loop. It is internal, so its names change with the dialects that use
// them; a dialect of one's own uses the helpers of package dialect instead.
package sqlkit

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
)

// This file holds what the built-in dialects share: the column list, one record scanner,
// and small argument helpers. Custom dialects are free to use their own.

// RecordColumns is the order in which every built-in dialect selects a row; ScanRecord
// reads that order. MySQL wraps the time columns, the others select them as they are.
var RecordColumns = []string{
	"id", "namespace", "topic", "tenant_id", "dedupe_key", "partition_key", "headers",
	"payload", "payload_hash", "status", "attempts", "next_attempt_at", "locked_by",
	"locked_until", "lease_token", "last_error", "created_at", "updated_at", "delivered_at",
	"replays",
}

// timeColumns are the columns of RecordColumns that hold times.
var timeColumns = map[string]bool{
	"next_attempt_at": true, "locked_until": true, "created_at": true, "updated_at": true, "delivered_at": true,
}

// ClaimColumns are what a claim reads back (RETURNING, or MySQL's locking read), in the
// order ScanClaimed reads them: RecordColumns without those whose values the engine knows
// once the claim has written them (StampClaimed). status, locked_by and lease_token come
// from dialect.ClaimParams, updated_at is locked_until - Lease (both written from one now),
// delivered_at is NULL on every claimable row (only an ack sets it, and delivered is
// terminal). Reading those five back cost scan time on every claimed row and decided
// nothing.
var ClaimColumns = []string{
	"id", "namespace", "topic", "tenant_id", "dedupe_key", "partition_key", "headers",
	"payload", "payload_hash", "attempts", "next_attempt_at", "locked_until", "last_error", "created_at",
}

// SelectList renders cols with prefix before each name (a table alias such as "t."),
// passing time columns through wrapTime when it is not nil.
func SelectList(cols []string, prefix string, wrapTime func(col string) string) string {
	var b strings.Builder
	for i, c := range cols {
		if i > 0 {
			b.WriteString(", ")
		}
		if wrapTime != nil && timeColumns[c] {
			b.WriteString(wrapTime(prefix + c))
		} else {
			b.WriteString(prefix + c)
		}
	}
	return b.String()
}

// RowScanner is *sql.Row or *sql.Rows.
type RowScanner interface{ Scan(dest ...any) error }

// ScanRecord reads one row selected with SelectList.
func ScanRecord(s RowScanner) (dialect.Record, error) {
	var (
		r                                     dialect.Record
		tenant, token                         uuid.NullUUID
		dedupe, pkey, lockedBy, lastErr, stat sql.NullString
		payload                               []byte // database/sql converts a string only into []byte, not json.RawMessage
	)
	err := s.Scan(&r.ID, &r.Namespace, &r.Topic, &tenant, &dedupe, &pkey, dialect.ScanHeaders(&r),
		&payload, &r.PayloadHash, &stat, &r.Attempts, dialect.ScanTime(&r.NextAttemptAt), &lockedBy,
		dialect.ScanTime(&r.LockedUntil), &token, &lastErr, dialect.ScanTime(&r.CreatedAt),
		dialect.ScanTime(&r.UpdatedAt), dialect.ScanTime(&r.DeliveredAt), &r.Replays)
	if err != nil {
		return dialect.Record{}, err
	}
	r.TenantID, r.LeaseToken = tenant.UUID, token.UUID
	r.DedupeKey, r.PartitionKey, r.LockedBy, r.LastError = dedupe.String, pkey.String, lockedBy.String, lastErr.String
	r.Status = dialect.Status(stat.String)
	r.Payload = payload
	return r, nil
}

// ScanClaimed reads one row selected with ClaimColumns; StampClaimed completes it.
func ScanClaimed(s RowScanner) (dialect.Record, error) {
	var (
		r                     dialect.Record
		tenant                uuid.NullUUID
		dedupe, pkey, lastErr sql.NullString
		payload               []byte
	)
	err := s.Scan(&r.ID, &r.Namespace, &r.Topic, &tenant, &dedupe, &pkey, dialect.ScanHeaders(&r),
		&payload, &r.PayloadHash, &r.Attempts, dialect.ScanTime(&r.NextAttemptAt),
		dialect.ScanTime(&r.LockedUntil), &lastErr, dialect.ScanTime(&r.CreatedAt))
	if err != nil {
		return dialect.Record{}, err
	}
	r.TenantID = tenant.UUID
	r.DedupeKey, r.PartitionKey, r.LastError = dedupe.String, pkey.String, lastErr.String
	r.Payload = payload
	return r, nil
}

// StampClaimed sets on claimed records the columns that ClaimColumns leaves out, from the
// claim's parameters and each record's locked_until, and sorts them in claim order.
// DeliveredAt stays zero, as ScanClaimed left it.
func StampClaimed(recs []dialect.Record, p dialect.ClaimParams) {
	lease := time.Duration(Micros(p.Lease)) * time.Microsecond // as the dialects bind it
	for i := range recs {
		r := &recs[i]
		r.Status, r.LockedBy, r.LeaseToken = dialect.StatusProcessing, p.WorkerID, p.Token
		r.UpdatedAt = r.LockedUntil.Add(-lease)
	}
	dialect.SortClaimed(recs) // RETURNING has no order of its own
}

// QueryClaimed runs a claim whose RETURNING list is ClaimColumns and completes its records.
func QueryClaimed(ctx context.Context, q dialect.DBTX, p dialect.ClaimParams, query string, args ...any) ([]dialect.Record, error) {
	recs, err := QueryAll(ctx, q, query, args, ScanClaimed)
	StampClaimed(recs, p)
	return recs, err
}

// QueryAll runs query and scans every row with scan. The queries are often writes (UPDATE
// ... RETURNING), so the error of closing the rows counts too: SQLite commits an
// autocommit statement only when it completes, and may report a failed commit there.
func QueryAll[T any](ctx context.Context, q dialect.DBTX, query string, args []any, scan func(RowScanner) (T, error)) (out []T, err error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := rows.Close(); err == nil && cerr != nil {
			out, err = nil, cerr
		}
	}()
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// NullStr binds "" as NULL.
func NullStr(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// UUIDBytes binds a UUID as 16 bytes (MySQL BINARY(16), SQLite BLOB), uuid.Nil as NULL.
func UUIDBytes(id uuid.UUID) any {
	if id == uuid.Nil {
		return nil
	}
	b := make([]byte, 16)
	copy(b, id[:])
	return b
}

// Placeholders writes n comma-separated groups of the form "(?, ?, ?)".
func Placeholders(b *strings.Builder, n int, group string) {
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(group)
	}
}

// QuoteIdent quotes an identifier with q (a double quote or a backtick). Table names are
// validated already; quoting keeps reserved words and the dialect's case rules harmless.
func QuoteIdent(name string, q byte) string {
	return string(q) + name + string(q)
}

// Micros converts a duration to whole microseconds, the unit every built-in schema keeps.
func Micros(d time.Duration) int64 { return d.Microseconds() }

// ScopeSQL renders the optional scope filters as " AND ..." terms. col prefixes column
// names (an alias such as "t."); enc binds a UUID the way the dialect stores it.
func ScopeSQL(a *dialect.Args, sc dialect.Scope, col string, enc func(uuid.UUID) any) string {
	var b strings.Builder
	if sc.Namespace != "" {
		b.WriteString(" AND " + col + "namespace = " + a.Add(sc.Namespace))
	}
	if len(sc.Topics) > 0 {
		b.WriteString(" AND " + col + "topic IN " + a.List(len(sc.Topics), func(i int) any { return sc.Topics[i] }))
	}
	if sc.TenantID != uuid.Nil {
		b.WriteString(" AND " + col + "tenant_id = " + a.Add(enc(sc.TenantID)))
	}
	return b.String()
}

// BuryCandidates renders the WHERE terms of a sweep's candidate read: rows in scope at the
// attempt limit that no live lease protects, or with p.ExpiredOnly only the processing
// ones. Candidates are read in claim order (created_at, id). The leading status IN (...)
// term lets SQLite use the partial claim index, whose WHERE clause it must imply (without
// it the expired sweep scanned the table: 53 ms against 25 ms over 300 000 rows). now
// renders the dialect's clock (it may bind an argument); enc binds a UUID as ScopeSQL's does;
// intCast follows the attempt limit's placeholder (PostgreSQL's "::bigint", so that a limit
// beyond int4 is bound, not refused).
func BuryCandidates(a *dialect.Args, p dialect.BuryParams, now func() string, enc func(uuid.UUID) any, intCast string) string {
	if p.ExpiredOnly {
		return `status IN ('pending', 'processing') AND status = 'processing' AND locked_until < ` + now() +
			` AND attempts >= ` + a.Add(p.MaxAttempts) + intCast + ScopeSQL(a, p.Scope, "", enc)
	}
	return `status IN ('pending', 'processing') AND attempts >= ` + a.Add(p.MaxAttempts) + intCast +
		` AND (status = 'pending' OR locked_until < ` + now() + `)` + ScopeSQL(a, p.Scope, "", enc)
}

// UniformAck reports whether every outcome acks a row under one lease token: a publisher's
// batch that all went through, the common case. Dialects settle it with a plain
// "id IN (...) AND lease_token = ?" update, whose plan cannot degrade the way a join with a
// per-row outcome list can (BENCHMARKS.md, gap 1); mixed batches keep the join.
func UniformAck(outcomes []dialect.Outcome) (uuid.UUID, bool) {
	if len(outcomes) == 0 {
		return uuid.Nil, false
	}
	token := outcomes[0].Token
	for _, o := range outcomes {
		if o.Status != dialect.StatusDelivered || o.Token != token {
			return uuid.Nil, false
		}
	}
	return token, true
}

// InTx runs fn in a transaction on db and commits it. An error of fn, of the commit, or a
// panic rolls it back, so no transaction outlives the call.
func InTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	committed = true
	return nil
}

// Deadlocks and lock wait timeouts: a claim, or a write that is its own transaction, runs
// again after losing one, lockTries times in all (the first try and up to lockTries-1
// retries), pausing before try+1 uniformly between half and all of lockRetryPause doubled
// per try, so that claimers that collided do not collide again in step.
const (
	lockTries      = 4
	lockRetryPause = 4 * time.Millisecond
)

// RetryLocked runs fn, and runs it again while it fails with an error retryable accepts:
// lockTries tries in all, so up to lockTries-1 retries. fn must have done nothing when it fails so: a statement that
// was its own transaction, or a whole transaction, chosen as a deadlock's victim.
func RetryLocked[T any](ctx context.Context, retryable func(error) bool, fn func() (T, error)) (T, error) {
	for try := 1; ; try++ {
		v, err := fn()
		if err == nil || try == lockTries || !retryable(err) {
			if err != nil && try > 1 {
				err = fmt.Errorf("after %d tries: %w", try, err)
			}
			return v, err
		}
		d := lockRetryPause << (try - 1)
		if !Sleep(ctx, d/2+rand.N(d/2+1)) {
			return v, ctx.Err()
		}
	}
}

// Sleep waits d, and reports false when ctx ended first.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// InsertOutcome runs an INSERT that skips dedupe conflicts and reports which rows went in.
// Without dedupe keys every row went in or the statement failed; with one row the affected
// count tells; otherwise the ids are read back with returning (or, where the database has
// no INSERT ... RETURNING, by the caller's readBack).
func InsertOutcome(ctx context.Context, q dialect.DBTX, query string, vals []any, rows []dialect.Row, dedupe bool, returning string) ([]bool, error) {
	inserted := make([]bool, len(rows))
	if !dedupe || len(rows) == 1 {
		res, err := q.ExecContext(ctx, query, vals...)
		if err != nil {
			return nil, err
		}
		if !dedupe {
			for i := range inserted {
				inserted[i] = true
			}
			return inserted, nil
		}
		n, err := res.RowsAffected()
		if err != nil {
			return nil, err
		}
		inserted[0] = n == 1
		return inserted, nil
	}
	ids, err := dialect.QueryIDs(ctx, q, query+returning, vals...)
	if err != nil {
		return nil, err
	}
	markInserted(inserted, rows, ids)
	return inserted, nil
}

func markInserted(inserted []bool, rows []dialect.Row, ids []uuid.UUID) {
	got := make(map[uuid.UUID]bool, len(ids))
	for _, id := range ids {
		got[id] = true
	}
	for i := range rows {
		inserted[i] = got[rows[i].ID]
	}
}

// GetRecord reads the row a Get selected (SelectList of RecordColumns), or [dialect.ErrNotFound].
func GetRecord(row *sql.Row) (dialect.Record, error) {
	r, err := ScanRecord(row)
	if err == sql.ErrNoRows {
		return dialect.Record{}, dialect.ErrNotFound
	}
	return r, err
}

// MaxBatch is the engine's bound on one claim and one settle call (outbox.MaxBatch): the
// largest batch a dialect sees from a Store or a Publisher. A test of package outbox keeps
// the two equal.
const MaxBatch = 1000
