package dialect

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Args collects bind arguments and renders their placeholders in one pass, so that a
// statement's text and its arguments stay in step however the statement is assembled. The
// zero value renders "?" (MySQL, SQLite); set Numbered for "$1", "$2", ... (PostgreSQL).
//
//	var a dialect.Args
//	q := "UPDATE t SET status = 'dead' WHERE id IN " + a.List(len(ids), func(i int) any { return ids[i] })
//	_, err := db.ExecContext(ctx, q, a.Values...)
type Args struct {
	// Values are the arguments bound so far, in order: pass them with the statement.
	Values []any
	// Numbered renders "$n" placeholders instead of "?".
	Numbered bool
}

// Add binds v and returns its placeholder.
func (a *Args) Add(v any) string {
	a.Values = append(a.Values, v)
	if a.Numbered {
		return "$" + strconv.Itoa(len(a.Values))
	}
	return "?"
}

// List binds n values, v(0) to v(n-1), and returns their placeholders as "(p1, p2, ...)",
// the IN lists of ids and topics every dialect writes.
func (a *Args) List(n int, v func(i int) any) string {
	var b strings.Builder
	b.WriteString("(")
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(a.Add(v(i)))
	}
	b.WriteString(")")
	return b.String()
}

// ScanTime returns a [sql.Scanner] that stores a time column into *dst, whatever form the
// driver returns it in: a [time.Time] (converted to UTC), an integer of Unix microseconds
// (as int64, or as text: the form a schema that keeps times as integers returns), or text
// in RFC 3339 or "2006-01-02 15:04:05.999999" form, read as UTC. NULL stores the zero time.
// It is the [Dialect] checklist's rule 12 for times:
//
//	err := row.Scan(&r.ID, dialect.ScanTime(&r.CreatedAt))
func ScanTime(dst *time.Time) sql.Scanner { return timeDest{dst} }

type timeDest struct{ t *time.Time }

// timeLayouts are the text forms of a time that ScanTime reads, in the order it tries them.
var timeLayouts = []string{time.RFC3339Nano, "2006-01-02 15:04:05.999999999Z07:00", "2006-01-02 15:04:05.999999999"}

func (d timeDest) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*d.t = time.Time{}
	case time.Time:
		*d.t = v.UTC()
	case int64:
		*d.t = time.UnixMicro(v).UTC()
	case []byte: // some drivers return numbers and times as text
		return d.text(string(v))
	case string:
		return d.text(v)
	default:
		return fmt.Errorf("outbox: cannot scan %T into a time", src)
	}
	return nil
}

func (d timeDest) text(s string) error {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		*d.t = time.UnixMicro(n).UTC()
		return nil
	}
	for _, layout := range timeLayouts {
		if t, err := time.Parse(layout, s); err == nil {
			*d.t = t.UTC()
			return nil
		}
	}
	return fmt.Errorf("outbox: scan time %q: neither Unix microseconds nor a timestamp", s)
}

// ScanHeaders returns a [sql.Scanner] that decodes a headers column (a JSON object as text
// or bytes, or NULL) into r.Headers. It never fails: headers that do not decode leave
// r.Headers nil and set [Record.HeadersErr], so that one row damaged by hand does not fail
// a claim of many (the [Dialect] checklist's rule 11); [Record.Integrity] reports it.
//
//	err := row.Scan(&r.ID, dialect.ScanHeaders(&r), &r.Payload)
func ScanHeaders(r *Record) sql.Scanner { return headersDest{r} }

type headersDest struct{ r *Record }

func (d headersDest) Scan(src any) error {
	d.r.Headers, d.r.HeadersErr = nil, nil
	if err := d.r.Headers.Scan(src); err != nil {
		d.r.Headers, d.r.HeadersErr = nil, err
	}
	return nil
}

// QueryIDs runs query, which returns one column of ids (an UPDATE ... RETURNING id, say),
// and returns them in the order the database did. The error of closing the rows counts
// too: a database may report the failure of a write statement (SQLite: its autocommit)
// only when the rows are closed.
func QueryIDs(ctx context.Context, q DBTX, query string, args ...any) (ids []uuid.UUID, err error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := rows.Close(); err == nil && cerr != nil {
			ids, err = nil, cerr
		}
	}()
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// Leases returns the lease of each outcome, in order: what [Lost] compares against the ids
// a [Dialect.Complete] statement settled.
func Leases(outcomes []Outcome) []Lease {
	ls := make([]Lease, len(outcomes))
	for i, o := range outcomes {
		ls[i] = o.Lease
	}
	return ls
}

// Lost returns the ids of want that are not in got, in want's order: the leases a settle
// or extend statement did not apply because they were lost, which [Dialect.Complete] and
// [Dialect.Extend] return. got is the ids the statement reports it changed.
func Lost(want []Lease, got []uuid.UUID) []uuid.UUID {
	if len(got) == len(want) {
		return nil
	}
	seen := make(map[uuid.UUID]struct{}, len(got))
	for _, id := range got {
		seen[id] = struct{}{}
	}
	var lost []uuid.UUID
	for _, l := range want {
		if _, ok := seen[l.ID]; !ok {
			lost = append(lost, l.ID)
		}
	}
	return lost
}

// SortClaimed sorts records in claim order, (created_at, id): the order [Dialect.Claim]
// returns, which an UPDATE ... RETURNING does not keep by itself.
func SortClaimed(recs []Record) {
	slices.SortFunc(recs, func(a, b Record) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return bytes.Compare(a.ID[:], b.ID[:])
	})
}

// claimBase are the fields of [ClaimParams] that every [Dialect] handles; Runs, RunShare
// and Continue are requests that a dialect handles by ignoring them (heads only, every
// head, a search for heads at every claim).
var claimBase = []string{"Scope", "Limit", "Lease", "MaxAttempts", "WorkerID", "Token", "Runs", "RunShare", "Continue"}

// Unsupported is the recipe for the rule of [ClaimParams]: a dialect that does not
// understand a non-zero field must return [errors.ErrUnsupported]. Call it first in Claim
// (and CompleteAndClaim) with the names of the fields beyond the ones every dialect handles
// (Scope, Limit, Lease, MaxAttempts, WorkerID, Token, and Runs, RunShare and Continue,
// which may be ignored) that the dialect understands:
//
//	if err := p.Unsupported("Ordered", "OrderedSkipDead"); err != nil {
//		return nil, err
//	}
//
// It returns an error matching [errors.ErrUnsupported] that names the first other field
// that is set (not its zero value), nil when there is none; a field added to ClaimParams
// after the dialect was written is one of those. A name in known that ClaimParams does not
// have is the caller's mistake, reported as an error that does not match
// errors.ErrUnsupported.
func (p ClaimParams) Unsupported(known ...string) error {
	v := reflect.ValueOf(p)
	typ := v.Type()
	for _, k := range known {
		if _, ok := typ.FieldByName(k); !ok {
			return fmt.Errorf("dialect: ClaimParams has no field %q", k)
		}
	}
	for i := range typ.NumField() {
		f := typ.Field(i)
		if !f.IsExported() || slices.Contains(claimBase, f.Name) || slices.Contains(known, f.Name) {
			continue
		}
		if !v.Field(i).IsZero() {
			return fmt.Errorf("dialect: ClaimParams.%s is set and this dialect does not support it: %w", f.Name, errors.ErrUnsupported)
		}
	}
	return nil
}
