// Package customdialect is an outbox.Dialect written from scratch, outside the library, as
// a user would write one for a database of their own: PostgreSQL through database/sql and
// the pgx driver, with a schema, migrations and SQL of its own (see schema.go). It has every
// optional ability (Checker, Notifier, AdminDialect, InspectDialect, RetentionDialect,
// OrderedClaimer, SettleClaimer) and passes the whole conformance suite with nothing skipped.
// It uses only the public API of package outbox.
package customdialect

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
)

// Dialect is the example dialect. Its zero value is ready to use.
type Dialect struct{}

// New returns the dialect.
func New() *Dialect { return &Dialect{} }

// Every ability, checked at compile time.
var (
	_ outbox.Dialect          = (*Dialect)(nil)
	_ outbox.Checker          = (*Dialect)(nil)
	_ outbox.Notifier         = (*Dialect)(nil)
	_ outbox.AdminDialect     = (*Dialect)(nil)
	_ outbox.InspectDialect   = (*Dialect)(nil)
	_ outbox.RetentionDialect = (*Dialect)(nil)
	_ outbox.OrderedClaimer   = (*Dialect)(nil)
	_ outbox.SettleClaimer    = (*Dialect)(nil)
)

// Name is the dialect's name. It names no directory of the migrations package: this
// dialect brings its own (Up, UpOrdered, Down).
func (*Dialect) Name() string { return "custom-postgres" }

// now is the database clock of one statement. statement_timestamp rather than now(): two
// statements of one transaction (a settle and the claim after it) get distinct times, so
// every change of state advances updated_at.
const now = `statement_timestamp()`

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

var statusOf = map[int16]outbox.Status{
	statePending: outbox.StatusPending, stateProcessing: outbox.StatusProcessing,
	stateDelivered: outbox.StatusDelivered, stateDead: outbox.StatusDead,
}

func stateOf(s outbox.Status) int16 {
	for k, v := range statusOf {
		if v == s {
			return k
		}
	}
	return -1
}

type scanner interface{ Scan(dest ...any) error }

// scanRecord reads one row of selectCols. Headers that do not decode into outbox.Headers
// (someone edited the table) do not fail the read: the record carries the damage in
// HeadersErr, and Record.Integrity reports it, so one damaged row never fails a claim.
func scanRecord(s scanner) (outbox.Record, error) {
	var (
		r                            outbox.Record
		tenant, token                uuid.NullUUID
		dedupe, pkey, owner, lastErr sql.NullString
		headers                      []byte
		state                        int16
		until, delivered             sql.NullTime
		due, created, updated        time.Time
	)
	err := s.Scan(&r.ID, &r.Namespace, &r.Topic, &tenant, &dedupe, &pkey, &headers, &r.Payload, &r.PayloadHash,
		&state, &r.Attempts, &due, &owner, &until, &token, &lastErr, &created, &updated, &delivered, &r.Replays)
	if err != nil {
		return outbox.Record{}, err
	}
	r.TenantID, r.LeaseToken = tenant.UUID, token.UUID
	r.DedupeKey, r.PartitionKey, r.LockedBy, r.LastError = dedupe.String, pkey.String, owner.String, lastErr.String
	r.Status = statusOf[state]
	r.NextAttemptAt, r.CreatedAt, r.UpdatedAt = due.UTC(), created.UTC(), updated.UTC()
	if until.Valid {
		r.LockedUntil = until.Time.UTC()
	}
	if delivered.Valid {
		r.DeliveredAt = delivered.Time.UTC()
	}
	if headers != nil {
		var h map[string]string
		if err := json.Unmarshal(headers, &h); err != nil {
			r.HeadersErr = err
		} else if len(h) > 0 {
			r.Headers = h
		}
	}
	return r, nil
}

// query runs a statement that returns rows and scans each with scan. The error of closing
// the rows counts: for an UPDATE ... RETURNING it can carry the statement's failure.
func query[T any](ctx context.Context, q outbox.DBTX, scan func(scanner) (T, error), stmt string, args ...any) (out []T, err error) {
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

func scanID(s scanner) (id uuid.UUID, err error) {
	err = s.Scan(&id)
	return id, err
}

// byClaimOrder sorts records by (created_at, id): RETURNING has no order of its own.
func byClaimOrder(recs []outbox.Record) {
	slices.SortFunc(recs, func(a, b outbox.Record) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return bytes.Compare(a.ID[:], b.ID[:])
	})
}

// args collects bind arguments and returns their $n placeholders.
type args []any

func (a *args) add(v any) string {
	*a = append(*a, v)
	return "$" + strconv.Itoa(len(*a))
}

// uuids binds ids as one uuid[] argument.
func (a *args) uuids(ids []uuid.UUID) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = id.String()
	}
	return a.add(s) + "::uuid[]"
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
	return "(" + a.add(d.Microseconds()) + "::bigint * interval '1 microsecond')"
}

// scope renders the optional filters of sc as " AND ..." terms on columns of alias.
func (a *args) scope(sc outbox.Scope, alias string) string {
	var b strings.Builder
	if sc.Namespace != "" {
		b.WriteString(" AND " + alias + "namespace = " + a.add(sc.Namespace))
	}
	if len(sc.Topics) > 0 {
		b.WriteString(" AND " + alias + "topic = ANY(" + a.add(sc.Topics) + "::text[])")
	}
	if sc.TenantID != uuid.Nil {
		b.WriteString(" AND " + alias + "tenant = " + a.add(sc.TenantID.String()) + "::uuid")
	}
	return b.String()
}

// lost returns the ids of want that are not in got.
func lost(want []outbox.Lease, got []uuid.UUID) []uuid.UUID {
	var out []uuid.UUID
	for _, l := range want {
		if !slices.Contains(got, l.ID) {
			out = append(out, l.ID)
		}
	}
	return out
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
