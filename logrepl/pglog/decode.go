package outboxpglog

import (
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
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
	relations     map[uint32]*layout
	types         *pgtype.Map
}

// The columns a record is read from, by their index in a layout.
const (
	colID = iota
	colStatus
	colLockedBy
	colNamespace
	colTopic
	colTenant
	colDedupe
	colPartition
	colPayload
	colHash
	colHeaders
	colToken
	colAttempts
	colCreated
	nCols
)

var colNames = [nCols]string{"id", "status", "locked_by", "namespace", "topic", "tenant_id", "dedupe_key",
	"partition_key", "payload", "payload_hash", "headers", "lease_token", "attempts", "created_at"}

// layout is what a relation message says of a table: whether it is the outbox table, and
// where each column a record needs sits in its tuples (-1 when missing). It is worked out
// once per relation message, not once per row.
type layout struct {
	ours bool
	at   [nCols]int
}

func newDecoder(t dialect.Table, scope outbox.Scope) *decoder {
	return &decoder{schema: t.Schema(), table: t.Name(), scope: scope, relations: map[uint32]*layout{}, types: pgtype.NewMap()}
}

// relation records a relation message: the server sends one before a table's first row in
// a session, and again when its columns change.
func (d *decoder) relation(m *pglogrepl.RelationMessage) {
	l := &layout{ours: m.RelationName == d.table && (d.schema == "" || m.Namespace == d.schema)}
	for i, name := range colNames {
		l.at[i] = slices.IndexFunc(m.Columns, func(c *pglogrepl.RelationMessageColumn) bool { return c.Name == name })
	}
	d.relations[m.RelationID] = l
}

// insert returns the record of an inserted row, and whether it is one the log's reader
// owns: a row of the outbox table inserted leased to outbox.LogWorkerID. Other rows
// (delayed ones, or rows of a Store without LogLease) are polling's.
func (d *decoder) insert(m *pglogrepl.InsertMessage) (outbox.Record, bool, error) {
	l, ok := d.relations[m.RelationID]
	if !ok {
		return outbox.Record{}, false, fmt.Errorf("outboxpglog: insert into relation %d before its description", m.RelationID)
	}
	if !l.ours {
		return outbox.Record{}, false, nil
	}
	raw := func(c int) []byte {
		if i := l.at[c]; i >= 0 && i < len(m.Tuple.Columns) && m.Tuple.Columns[i].DataType == pglogrepl.TupleDataTypeText {
			return m.Tuple.Columns[i].Data
		}
		return nil
	}
	text := func(c int) string { return string(raw(c)) }
	if string(raw(colStatus)) != string(outbox.StatusProcessing) || string(raw(colLockedBy)) != outbox.LogWorkerID {
		return outbox.Record{}, false, nil
	}
	if !d.inScope(raw(colNamespace), raw(colTopic), raw(colTenant)) {
		return outbox.Record{}, false, nil
	}
	var (
		r   outbox.Record
		err error
	)
	r.Status, r.LockedBy = outbox.StatusProcessing, outbox.LogWorkerID
	r.Namespace, r.Topic = text(colNamespace), text(colTopic)
	r.DedupeKey, r.PartitionKey = text(colDedupe), text(colPartition)
	r.Payload = slices.Clone(raw(colPayload))
	if r.ID, err = uuid.ParseBytes(raw(colID)); err != nil {
		return r, false, fmt.Errorf("outboxpglog: row id %q: %w", raw(colID), err)
	}
	if b := raw(colTenant); b != nil {
		if r.TenantID, err = uuid.ParseBytes(b); err != nil {
			return r, false, fmt.Errorf("outboxpglog: row %s: tenant_id: %w", r.ID, err)
		}
	}
	if b := raw(colToken); b != nil {
		if r.LeaseToken, err = uuid.ParseBytes(b); err != nil {
			return r, false, fmt.Errorf("outboxpglog: row %s: lease_token: %w", r.ID, err)
		}
	}
	if r.Attempts, err = strconv.Atoi(text(colAttempts)); err != nil {
		return r, false, fmt.Errorf("outboxpglog: row %s: attempts: %w", r.ID, err)
	}
	// A damaged hash or headers make the record fail its integrity check, which
	// dead-letters the row, as a claim's read does.
	if b := raw(colHash); len(b) >= 2 && b[0] == '\\' && b[1] == 'x' {
		r.PayloadHash = make([]byte, hex.DecodedLen(len(b)-2))
		if _, err := hex.Decode(r.PayloadHash, b[2:]); err != nil {
			r.PayloadHash = nil
		}
	}
	if s := text(colHeaders); s != "" {
		_ = dialect.ScanHeaders(&r).Scan(s)
	}
	if b := raw(colCreated); b != nil {
		var t time.Time
		if err := d.types.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, b, &t); err != nil {
			return r, false, fmt.Errorf("outboxpglog: row %s: created_at %q: %w", r.ID, b, err)
		}
		r.CreatedAt = t.UTC()
	}
	return r, true, nil
}

// inScope reports whether a row with these columns is in the publisher's scope.
func (d *decoder) inScope(namespace, topic, tenant []byte) bool {
	if string(namespace) != d.scope.Namespace {
		return false
	}
	if len(d.scope.Topics) > 0 && !slices.Contains(d.scope.Topics, string(topic)) {
		return false
	}
	return d.scope.TenantID == uuid.Nil || string(tenant) == d.scope.TenantID.String()
}
