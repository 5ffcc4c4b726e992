// Package customdialect is a dialect written from scratch, outside the library, as a user
// would write one for a database of their own: PostgreSQL through database/sql and the pgx
// driver, with a schema, migrations and SQL of its own (see schema.go). It has every
// optional ability of package dialect (Checker, Admin, Notifier, OrderedClaimer,
// SettleClaimer) and passes the whole conformance suite with nothing skipped. It uses only the public API: the
// contract and helpers of package dialect, and package outbox to run it.
package customdialect

import (
	"context"
	"database/sql"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
)

// Dialect is the example dialect. Its zero value is ready to use.
type Dialect struct{}

// New returns the dialect.
func New() *Dialect { return &Dialect{} }

// Every ability, checked at compile time.
var (
	_ dialect.Dialect        = (*Dialect)(nil)
	_ dialect.Checker        = (*Dialect)(nil)
	_ dialect.Admin          = (*Dialect)(nil)
	_ dialect.Notifier       = (*Dialect)(nil)
	_ dialect.OrderedClaimer = (*Dialect)(nil)
	_ dialect.SettleClaimer  = (*Dialect)(nil)
)

// Name is the dialect's name. It names no directory of the migrations package: this
// dialect brings its own (Up, UpOrdered, Down).
func (*Dialect) Name() string { return "custom-postgres" }

// now is the database clock of one statement. statement_timestamp rather than now(): two
// statements of one transaction (a settle and the claim after it) get distinct times, so
// every change of state advances updated_at. (A variable only so that this package's
// mutation test can plant now() in its place, as lockRows: see export_test.go.)
var now = `statement_timestamp()`

// lockRows locks the claim's candidates: concurrent claimers pass over each other's rows
// instead of claiming them twice or queueing behind them.
var lockRows = ` FOR UPDATE SKIP LOCKED`

// selectCols is the column list every read returns, in the order scanRecord reads it.
const selectCols = `id, namespace, topic, tenant, dedupe_key, partition_key, headers, body, body_sha256,
	state, attempts, due_at, owner, lease_until, lease_token, error, created_at, updated_at, delivered_at, replays`

// prefixed returns selectCols with every column prefixed by alias.
func prefixed(alias string) string {
	cols := strings.Split(strings.ReplaceAll(selectCols, "\n\t", " "), ", ")
	for i, c := range cols {
		cols[i] = alias + "." + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}

var statusOf = map[int16]dialect.Status{
	statePending: dialect.StatusPending, stateProcessing: dialect.StatusProcessing,
	stateDelivered: dialect.StatusDelivered, stateDead: dialect.StatusDead,
}

func stateOf(s dialect.Status) int16 {
	for k, v := range statusOf {
		if v == s {
			return k
		}
	}
	return -1
}

type scanner interface{ Scan(dest ...any) error }

// scanRecord reads one row of selectCols. dialect.ScanHeaders keeps headers that do not
// decode into dialect.Headers (someone edited the table) from failing the read: the record
// carries the damage in HeadersErr, and Record.Integrity reports it, so one damaged row
// never fails a claim. dialect.ScanTime returns every time in UTC, NULL as the zero time.
func scanRecord(s scanner) (dialect.Record, error) {
	var (
		r                            dialect.Record
		tenant, token                uuid.NullUUID
		dedupe, pkey, owner, lastErr sql.NullString
		state                        int16
	)
	err := s.Scan(&r.ID, &r.Namespace, &r.Topic, &tenant, &dedupe, &pkey, dialect.ScanHeaders(&r), &r.Payload, &r.PayloadHash,
		&state, &r.Attempts, dialect.ScanTime(&r.NextAttemptAt), &owner, dialect.ScanTime(&r.LockedUntil), &token, &lastErr,
		dialect.ScanTime(&r.CreatedAt), dialect.ScanTime(&r.UpdatedAt), dialect.ScanTime(&r.DeliveredAt), &r.Replays)
	if err != nil {
		return dialect.Record{}, err
	}
	r.TenantID, r.LeaseToken = tenant.UUID, token.UUID
	r.DedupeKey, r.PartitionKey, r.LockedBy, r.LastError = dedupe.String, pkey.String, owner.String, lastErr.String
	r.Status = statusOf[state]
	return r, nil
}

// query runs a statement that returns rows and scans each with scan. The error of closing
// the rows counts: for an UPDATE ... RETURNING it can carry the statement's failure.
func query[T any](ctx context.Context, q dialect.DBTX, scan func(scanner) (T, error), stmt string, args ...any) (out []T, err error) {
	rows, err := q.QueryContext(ctx, stmt, args...)
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

// args binds arguments with PostgreSQL's $n placeholders (dialect.Args), and adds the
// forms of this schema: uuid arrays, intervals, scope filters.
type args struct{ dialect.Args }

func newArgs() *args { return &args{dialect.Args{Numbered: true}} }

// uuids binds ids as one uuid[] argument.
func (a *args) uuids(ids []uuid.UUID) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = id.String()
	}
	return a.Add(s) + "::uuid[]"
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func nullUUID(id uuid.UUID) any {
	if id == uuid.Nil {
		return nil
	}
	return id.String()
}

// interval binds d as a PostgreSQL interval, in whole microseconds.
func (a *args) interval(d time.Duration) string {
	return "(" + a.Add(d.Microseconds()) + "::bigint * interval '1 microsecond')"
}

// scope renders the optional filters of sc as " AND ..." terms on columns of alias.
func (a *args) scope(sc dialect.Scope, alias string) string {
	var b strings.Builder
	if sc.Namespace != "" {
		b.WriteString(" AND " + alias + "namespace = " + a.Add(sc.Namespace))
	}
	if len(sc.Topics) > 0 {
		b.WriteString(" AND " + alias + "topic = ANY(" + a.Add(sc.Topics) + "::text[])")
	}
	if sc.TenantID != uuid.Nil {
		b.WriteString(" AND " + alias + "tenant = " + a.Add(sc.TenantID.String()) + "::uuid")
	}
	return b.String()
}

// inTx runs fn in a transaction on db and commits it; any error rolls it back, with a
// context that cannot be cancelled.
func inTx(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}
