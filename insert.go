package outbox

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

// insertShape is the set of optional columns an INSERT binds.
type insertShape uint8

const (
	withTenant insertShape = 1 << iota
	withDedupe
	withPartition
	withHeaders
	// withDelay binds a per-row delay; without it next_attempt_at is the insert's now.
	withDelay

	// shapeCount is the number of shapes, for per-shape statement tables.
	shapeCount = 1 << iota
)

// shapeOf returns the shape that binds every column some row of rows sets.
func shapeOf(rows []dialect.Row) insertShape {
	var s insertShape
	for i := range rows {
		r := &rows[i]
		if r.TenantID != uuid.Nil {
			s |= withTenant
		}
		if r.DedupeKey != "" {
			s |= withDedupe
		}
		if r.PartitionKey != "" {
			s |= withPartition
		}
		if len(r.Headers) > 0 {
			s |= withHeaders
		}
		if micros(r.Delay) != 0 { // what the dialects bind; Store rejects negative delays
			s |= withDelay
		}
	}
	return s
}

// insertColumn is one bound column of an INSERT: its name, its PostgreSQL array type (for
// unnest), and the shape bit that includes it (0: always bound).
type insertColumn struct {
	name, pgType string
	bit          insertShape
}

// insertColumns are the bound columns in bind order. delay is not a column: dialects
// turn it into next_attempt_at.
var insertColumns = []insertColumn{
	{"id", "uuid", 0},
	{"namespace", "text", 0},
	{"topic", "text", 0},
	{"tenant_id", "uuid", withTenant},
	{"dedupe_key", "text", withDedupe},
	{"partition_key", "text", withPartition},
	{"headers", "json", withHeaders},
	{"payload", "json", 0},
	{"payload_hash", "bytea", 0},
}

// columns returns the bound columns of shape s, in bind order.
func (s insertShape) columns() []insertColumn {
	cols := make([]insertColumn, 0, len(insertColumns))
	for _, c := range insertColumns {
		if c.bit == 0 || s&c.bit != 0 {
			cols = append(cols, c)
		}
	}
	return cols
}

// columnList renders "(id, namespace, ..., status, attempts, next_attempt_at, created_at,
// updated_at)": the bound columns, then those every dialect writes itself.
func (s insertShape) columnList() string {
	var b strings.Builder
	b.WriteString("(")
	for _, c := range s.columns() {
		b.WriteString(c.name + ", ")
	}
	b.WriteString("status, attempts, next_attempt_at, created_at, updated_at)")
	return b.String()
}

// rowGroup renders one VALUES group "(?, ?, ..., 'pending', 0, <next>, <now>, <now>)" with
// a "?" per bound column; next and now are the dialect's expressions for next_attempt_at
// and for the insert's time.
func (s insertShape) rowGroup(next, now string) string {
	var b strings.Builder
	b.WriteString("(")
	for range s.columns() {
		b.WriteString("?, ")
	}
	b.WriteString("'pending', 0, " + next + ", " + now + ", " + now + ")")
	return b.String()
}

// rowValues appends the bound values of r for shape s, in columns order. uuidArg and
// payload encode the values whose bound form differs between dialects; headers is r's
// encoded Headers.
func (s insertShape) rowValues(vals []any, r *dialect.Row, headers any, uuidArg func(uuid.UUID) any, payload any) []any {
	vals = append(vals, uuidArg(r.ID), r.Namespace, r.Topic)
	if s&withTenant != 0 {
		vals = append(vals, uuidArg(r.TenantID))
	}
	if s&withDedupe != 0 {
		vals = append(vals, nullStr(r.DedupeKey))
	}
	if s&withPartition != 0 {
		vals = append(vals, nullStr(r.PartitionKey))
	}
	if s&withHeaders != 0 {
		vals = append(vals, headers)
	}
	return append(vals, payload, r.PayloadHash)
}

// valuesStatement renders head followed by n copies of group separated by ", ", then
// tail, in one allocation.
func valuesStatement(head string, n int, group, tail string) string {
	var b strings.Builder
	b.Grow(len(head) + n*(len(group)+2) + len(tail))
	b.WriteString(head)
	placeholders(&b, n, group)
	b.WriteString(tail)
	return b.String()
}
