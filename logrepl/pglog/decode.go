package outboxpglog

import (
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

// decoder turns the pgoutput tuples of the outbox table's inserts into records. pgoutput
// sends every column of an inserted row in text form, TOASTed values included (only an
// UPDATE leaves unchanged ones out).
type decoder struct {
	schema, table string // the table the publisher serves; schema "" matches any
	scope         outbox.Scope
	relations     map[uint32]*pglogrepl.RelationMessage
	types         *pgtype.Map
}

func newDecoder(t dialect.Table, scope outbox.Scope) *decoder {
	return &decoder{schema: t.Schema(), table: t.Name(), scope: scope, relations: map[uint32]*pglogrepl.RelationMessage{}, types: pgtype.NewMap()}
}

// insert returns the record of an inserted row, and whether it is one the log's reader
// owns: a row of the outbox table inserted leased to outbox.LogWorkerID. Other rows
// (delayed ones, or rows of a Store without LogLease) are polling's.
func (d *decoder) insert(m *pglogrepl.InsertMessage) (outbox.Record, bool, error) {
	rel, ok := d.relations[m.RelationID]
	if !ok {
		return outbox.Record{}, false, fmt.Errorf("outboxpglog: insert into relation %d before its description", m.RelationID)
	}
	if rel.RelationName != d.table || (d.schema != "" && rel.Namespace != d.schema) {
		return outbox.Record{}, false, nil
	}
	cols := map[string]*pglogrepl.TupleDataColumn{}
	for i, c := range m.Tuple.Columns {
		if i < len(rel.Columns) {
			cols[rel.Columns[i].Name] = c
		}
	}
	text := func(name string) string {
		if c := cols[name]; c != nil && c.DataType == pglogrepl.TupleDataTypeText {
			return string(c.Data)
		}
		return ""
	}
	if text("status") != string(outbox.StatusProcessing) || text("locked_by") != outbox.LogWorkerID {
		return outbox.Record{}, false, nil
	}
	if !d.inScope(text("namespace"), text("topic"), text("tenant_id")) {
		return outbox.Record{}, false, nil
	}
	var (
		r   outbox.Record
		err error
	)
	r.Status, r.LockedBy = outbox.StatusProcessing, outbox.LogWorkerID
	r.Namespace, r.Topic = text("namespace"), text("topic")
	r.DedupeKey, r.PartitionKey = text("dedupe_key"), text("partition_key")
	r.Payload = []byte(text("payload"))
	if r.ID, err = uuid.Parse(text("id")); err != nil {
		return r, false, fmt.Errorf("outboxpglog: row id %q: %w", text("id"), err)
	}
	if s := text("tenant_id"); s != "" {
		if r.TenantID, err = uuid.Parse(s); err != nil {
			return r, false, fmt.Errorf("outboxpglog: row %s: tenant_id: %w", r.ID, err)
		}
	}
	if s := text("lease_token"); s != "" {
		if r.LeaseToken, err = uuid.Parse(s); err != nil {
			return r, false, fmt.Errorf("outboxpglog: row %s: lease_token: %w", r.ID, err)
		}
	}
	if r.Attempts, err = strconv.Atoi(text("attempts")); err != nil {
		return r, false, fmt.Errorf("outboxpglog: row %s: attempts: %w", r.ID, err)
	}
	// A damaged hash or headers make the record fail its integrity check, which
	// dead-letters the row, as a claim's read does.
	r.PayloadHash, _ = hex.DecodeString(strings.TrimPrefix(text("payload_hash"), `\x`))
	if s := text("headers"); s != "" {
		_ = dialect.ScanHeaders(&r).Scan(s)
	}
	if s := text("created_at"); s != "" {
		var t time.Time
		if err := d.types.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, []byte(s), &t); err != nil {
			return r, false, fmt.Errorf("outboxpglog: row %s: created_at %q: %w", r.ID, s, err)
		}
		r.CreatedAt = t.UTC()
	}
	return r, true, nil
}

// inScope reports whether a row with these columns is in the publisher's scope.
func (d *decoder) inScope(namespace, topic, tenant string) bool {
	if namespace != d.scope.Namespace {
		return false
	}
	if len(d.scope.Topics) > 0 && !slices.Contains(d.scope.Topics, topic) {
		return false
	}
	return d.scope.TenantID == uuid.Nil || tenant == d.scope.TenantID.String()
}
