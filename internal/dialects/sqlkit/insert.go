package sqlkit

import (
	"strings"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
)

// This file holds the one mechanism every built-in dialect uses to shape its INSERT: a
// batch binds only the optional columns that some row of it sets.
//
// Most events carry no tenant, dedupe key, headers or delay. Binding those columns anyway
// costs a parameter per row and column (on PostgreSQL an array of NULLs; on MariaDB 40% more
// parameters per row), which the benchmarks measured at 5-25% of a batch insert's
// throughput (BENCHMARKS.md, batch enqueue). So each statement is rendered for its batch's
// shape: a column that is empty in every row is left out of the column list and the
// database writes its default (NULL; now for next_attempt_at). With the tables of package
// migrations, which give the optional columns no other default, the rows' contents are the
// same either way, which the conformance suite checks for every combination of fields. A
// table altered to give one of them a DEFAULT would see it only in batches that leave the
// column unset everywhere: create the table with the migrations.

// InsertShape is the set of optional columns an INSERT binds.
type InsertShape uint8

const (
	WithTenant InsertShape = 1 << iota
	WithDedupe
	WithPartition
	WithHeaders
	// WithDelay binds a per-row delay; without it next_attempt_at is the insert's now.
	WithDelay

	// ShapeCount is the number of shapes, for per-shape statement tables.
	ShapeCount = 1 << iota
)

// ShapeOf returns the shape that binds every column some row of rows sets.
func ShapeOf(rows []dialect.Row) InsertShape {
	var s InsertShape
	for i := range rows {
		r := &rows[i]
		if r.TenantID != uuid.Nil {
			s |= WithTenant
		}
		if r.DedupeKey != "" {
			s |= WithDedupe
		}
		if r.PartitionKey != "" {
			s |= WithPartition
		}
		if len(r.Headers) > 0 {
			s |= WithHeaders
		}
		if Micros(r.Delay) != 0 { // what the dialects bind; Store rejects negative delays
			s |= WithDelay
		}
	}
	return s
}

// InsertColumn is one bound column of an INSERT: its name, its PostgreSQL array type (for
// unnest), and the shape bit that includes it (0: always bound).
type InsertColumn struct {
	Name, PGType string
	Bit          InsertShape
}

// insertColumns are the bound columns in bind order. delay is not a column: dialects
// turn it into next_attempt_at.
var insertColumns = []InsertColumn{
	{"id", "uuid", 0},
	{"namespace", "text", 0},
	{"topic", "text", 0},
	{"tenant_id", "uuid", WithTenant},
	{"dedupe_key", "text", WithDedupe},
	{"partition_key", "text", WithPartition},
	{"headers", "json", WithHeaders},
	{"payload", "json", 0},
	{"payload_hash", "bytea", 0},
}

// InsertColumnCount is the number of bound columns of the widest shape.
var InsertColumnCount = len(insertColumns)

// Columns returns the bound columns of shape s, in bind order.
func (s InsertShape) Columns() []InsertColumn {
	cols := make([]InsertColumn, 0, len(insertColumns))
	for _, c := range insertColumns {
		if c.Bit == 0 || s&c.Bit != 0 {
			cols = append(cols, c)
		}
	}
	return cols
}

// columnList renders "(id, namespace, ..., status, attempts, next_attempt_at, created_at,
// updated_at)": the bound columns, then those every dialect writes itself.
func (s InsertShape) ColumnList() string {
	var b strings.Builder
	b.WriteString("(")
	for _, c := range s.Columns() {
		b.WriteString(c.Name + ", ")
	}
	b.WriteString("status, attempts, next_attempt_at, created_at, updated_at)")
	return b.String()
}

// rowGroup renders one VALUES group "(?, ?, ..., 'pending', 0, <next>, <now>, <now>)" with
// a "?" per bound column; next and now are the dialect's expressions for next_attempt_at
// and for the insert's time.
func (s InsertShape) RowGroup(next, now string) string {
	var b strings.Builder
	b.WriteString("(")
	for range s.Columns() {
		b.WriteString("?, ")
	}
	b.WriteString("'pending', 0, " + next + ", " + now + ", " + now + ")")
	return b.String()
}

// rowValues appends the bound values of r for shape s, in columns order. uuidArg and
// payload encode the values whose bound form differs between dialects; headers is r's
// encoded Headers.
func (s InsertShape) RowValues(vals []any, r *dialect.Row, headers any, uuidArg func(uuid.UUID) any, payload any) []any {
	vals = append(vals, uuidArg(r.ID), r.Namespace, r.Topic)
	if s&WithTenant != 0 {
		vals = append(vals, uuidArg(r.TenantID))
	}
	if s&WithDedupe != 0 {
		vals = append(vals, NullStr(r.DedupeKey))
	}
	if s&WithPartition != 0 {
		vals = append(vals, NullStr(r.PartitionKey))
	}
	if s&WithHeaders != 0 {
		vals = append(vals, headers)
	}
	return append(vals, payload, r.PayloadHash)
}

// ValuesStatement renders head followed by n copies of group separated by ", ", then
// tail, in one allocation.
func ValuesStatement(head string, n int, group, tail string) string {
	var b strings.Builder
	b.Grow(len(head) + n*(len(group)+2) + len(tail))
	b.WriteString(head)
	Placeholders(&b, n, group)
	b.WriteString(tail)
	return b.String()
}
