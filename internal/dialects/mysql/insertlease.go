package mysql

import (
	"context"
	"strings"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// This file holds the insert of rows leased to the binlog's reader (dialect.Row.Lease,
// outbox.Options.LogLease): the same INSERT as mysqlInsertRows, with the lease's columns.

var _ sqlkit.LeasedInserter = Dialect{}

// InsertsLeased implements sqlkit.LeasedInserter.
func (Dialect) InsertsLeased() bool { return true }

// mysqlWriteRows writes outbox rows whose keys, if any, are reserved: with the lease's
// columns when some row carries one, as the plain INSERT otherwise.
func mysqlWriteRows(ctx context.Context, q dialect.DBTX, t dialect.Table, rows []dialect.Row) error {
	for i := range rows {
		if rows[i].Lease.Duration > 0 {
			return mysqlInsertLeasedRows(ctx, q, t, rows)
		}
	}
	return mysqlInsertRows(ctx, q, t, rows)
}

// mysqlInsertLeasedRows writes rows of which some are leased: status processing, attempts
// 1, locked_by, lease_token and locked_until = now + the lease, from the statement's one
// UTC_TIMESTAMP(6), as created_at is; the others pending with NULL lease columns.
func mysqlInsertLeasedRows(ctx context.Context, q dialect.DBTX, t dialect.Table, rows []dialect.Row) error {
	shape := sqlkit.ShapeOf(rows)
	next := `UTC_TIMESTAMP(6)`
	if shape&sqlkit.WithDelay != 0 {
		next = mysqlLater(`?`)
	}
	marks := strings.Repeat(`?, `, len(shape.Columns()))
	pending := `(` + marks + `'pending', 0, ` + next + `, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), NULL, NULL, NULL)`
	leased := `(` + marks + `'processing', 1, ` + next + `, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), ?, ?, ` + mysqlLater(`?`) + `)`
	var b strings.Builder
	b.WriteString(`INSERT INTO ` + mysqlTable(t) + ` ` + strings.TrimSuffix(shape.ColumnList(), `)`) +
		`, locked_by, lease_token, locked_until) VALUES `)
	vals := make([]any, 0, len(rows)*(sqlkit.InsertColumnCount+4))
	for i := range rows {
		r := &rows[i]
		headers, err := r.Headers.Value()
		if err != nil {
			return err
		}
		vals = shape.RowValues(vals, r, headers, sqlkit.UUIDBytes, r.Payload)
		if shape&sqlkit.WithDelay != 0 {
			vals = append(vals, sqlkit.Micros(r.Delay))
		}
		if i > 0 {
			b.WriteString(`, `)
		}
		if r.Lease.Duration > 0 {
			b.WriteString(leased)
			vals = append(vals, r.Lease.WorkerID, sqlkit.UUIDBytes(r.Lease.Token), sqlkit.Micros(r.Lease.Duration))
		} else {
			b.WriteString(pending)
		}
	}
	_, err := q.ExecContext(ctx, b.String(), vals...)
	return err
}
