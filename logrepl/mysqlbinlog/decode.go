package outboxbinlog

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

// decoder turns the write-rows events of the outbox table into records. Columns are found
// by name: from the table map event when the server sends names (binlog_row_metadata =
// FULL), else by the table's column order, read once per session.
type decoder struct {
	schema, table string
	scope         outbox.Scope
	order         []string // the table's columns by ordinal position
	status        []string // the status ENUM's values, 1-based as the binlog numbers them
}

// newDecoder reads the table's column order and its status values.
func (p *Publisher) newDecoder(ctx context.Context) (*decoder, error) {
	d := &decoder{table: p.store.Table().Name(), scope: p.o.Scope}
	db := p.store.DB()
	if err := db.QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&d.schema); err != nil {
		return nil, fmt.Errorf("outboxbinlog: read database: %w", err)
	}
	rows, err := db.QueryContext(ctx, `SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS`+
		` WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION`, d.table)
	if err != nil {
		return nil, fmt.Errorf("outboxbinlog: read columns: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			return nil, err
		}
		d.order = append(d.order, name)
		if name == "status" {
			d.status = enumValues(typ)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(d.order) == 0 {
		return nil, fmt.Errorf("outboxbinlog: table %s not found in the Store's database", d.table)
	}
	return d, nil
}

// enumValues parses "enum('a','b')" into its values.
func enumValues(typ string) []string {
	var out []string
	for i := 0; i < len(typ); i++ {
		if typ[i] != '\'' {
			continue
		}
		j := i + 1
		for j < len(typ) && typ[j] != '\'' {
			j++
		}
		out = append(out, typ[i+1:j])
		i = j
	}
	return out
}

// ours reports whether a rows event is of the outbox table.
func (d *decoder) ours(t *replication.TableMapEvent) bool {
	return t != nil && string(t.Table) == d.table && string(t.Schema) == d.schema
}

// positions reports whether a rows event is of the readers' position table.
func (d *decoder) positions(t *replication.TableMapEvent) bool {
	return t != nil && string(t.Table) == d.table+"_binlog_position" && string(t.Schema) == d.schema
}

// rows returns the records of a write-rows event's rows that the log's reader owns: rows
// inserted leased to outbox.LogWorkerID within the scope. Other rows (delayed ones, rows
// of a Store without LogLease, other scopes) are polling's.
func (d *decoder) rows(ev *replication.RowsEvent) ([]outbox.Record, error) {
	names := d.order
	if len(ev.Table.ColumnName) > 0 {
		names = make([]string, len(ev.Table.ColumnName))
		for i, n := range ev.Table.ColumnName {
			names[i] = string(n)
		}
	}
	var out []outbox.Record
	for _, row := range ev.Rows {
		col := func(name string) any {
			if i := slices.Index(names, name); i >= 0 && i < len(row) {
				return row[i]
			}
			return nil
		}
		r, ok, err := d.record(col)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, r)
		}
	}
	return out, nil
}

func (d *decoder) record(col func(string) any) (outbox.Record, bool, error) {
	var r outbox.Record
	status := text(col("status"))
	if n, ok := col("status").(int64); ok && n >= 1 && int(n) <= len(d.status) {
		status = d.status[n-1]
	}
	if status != string(outbox.StatusProcessing) || text(col("locked_by")) != outbox.LogWorkerID {
		return r, false, nil
	}
	tenant := fixed(col("tenant_id"), 16)
	if !d.inScope(text(col("namespace")), text(col("topic")), tenant) {
		return r, false, nil
	}
	r.Status, r.LockedBy = outbox.StatusProcessing, outbox.LogWorkerID
	r.Namespace, r.Topic = text(col("namespace")), text(col("topic"))
	r.DedupeKey, r.PartitionKey = text(col("dedupe_key")), text(col("partition_key"))
	r.Payload = blob(col("payload"))
	var err error
	if r.ID, err = uuid.FromBytes(fixed(col("id"), 16)); err != nil {
		return r, false, fmt.Errorf("outboxbinlog: row id: %w", err)
	}
	if tenant != nil {
		r.TenantID, _ = uuid.FromBytes(tenant)
	}
	if tok := fixed(col("lease_token"), 16); tok != nil {
		r.LeaseToken, _ = uuid.FromBytes(tok)
	}
	switch v := col("attempts").(type) {
	case int32:
		r.Attempts = int(v)
	case int64:
		r.Attempts = int(v)
	default:
		if r.Attempts, err = strconv.Atoi(text(v)); err != nil {
			return r, false, fmt.Errorf("outboxbinlog: row %s: attempts %v", r.ID, v)
		}
	}
	// A damaged hash or headers make the record fail its integrity check, which
	// dead-letters the row, as a claim's read does.
	r.PayloadHash = fixed(col("payload_hash"), 32)
	if h := blob(col("headers")); h != nil {
		_ = dialect.ScanHeaders(&r).Scan(h)
	}
	switch v := col("created_at").(type) {
	case time.Time:
		r.CreatedAt = v.UTC()
	case string:
		t, err := time.Parse("2006-01-02 15:04:05.999999", v)
		if err != nil {
			return r, false, fmt.Errorf("outboxbinlog: row %s: created_at %q: %w", r.ID, v, err)
		}
		r.CreatedAt = t
	}
	return r, true, nil
}

// inScope reports whether a row with these columns is in the publisher's scope.
func (d *decoder) inScope(namespace, topic string, tenant []byte) bool {
	if namespace != d.scope.Namespace {
		return false
	}
	if len(d.scope.Topics) > 0 && !slices.Contains(d.scope.Topics, topic) {
		return false
	}
	if d.scope.TenantID == uuid.Nil {
		return true
	}
	return tenant != nil && [16]byte(tenant) == [16]byte(d.scope.TenantID)
}

// text returns a string column's value, copied out of the event's buffer.
func text(v any) string {
	switch v := v.(type) {
	case string:
		return string([]byte(v))
	case []byte:
		return string(v)
	}
	return ""
}

// blob returns a BLOB column's value, copied out of the event's buffer; nil for NULL.
func blob(v any) []byte {
	switch v := v.(type) {
	case []byte:
		return append([]byte{}, v...)
	case string:
		return []byte(v)
	}
	return nil
}

// fixed returns a BINARY(n) column's value: the binlog leaves out its trailing zero bytes.
func fixed(v any, n int) []byte {
	b := blob(v)
	if b == nil || len(b) > n {
		return b
	}
	return append(b, make([]byte, n-len(b))...)
}
