package outbox_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
)

// The fuzz targets below run their seed corpus (testdata/fuzz) with every go test, and are
// fuzzed by make fuzz. They hold the library to invariants rather than to examples: no
// input panics, a refused message writes nothing, what is stored reads back byte for byte,
// headers round-trip, and the table names accepted are exactly those every dialect can use.

// fuzzMaxPayload is the payload bound of the fuzzed store: small, so that inputs reach it.
const fuzzMaxPayload = 64 << 10

// fuzzGrowLimit bounds the size of an inflated field, to keep one execution fast.
const fuzzGrowLimit = 300 << 10

// fuzzGrow returns s repeated n times, capped near fuzzGrowLimit bytes.
func fuzzGrow(s string, n uint16) string {
	if len(s) == 0 || n < 2 {
		return s
	}
	return strings.Repeat(s, min(int(n), fuzzGrowLimit/len(s)+1))
}

// fuzzMessage builds a message from fuzzer inputs; field names the one to inflate n times
// (1 namespace, 2 topic, 3 dedupe key, 4 partition key, 5 header key, 6 header value,
// 7 payload as a JSON array of n copies, 8 many headers).
func fuzzMessage(ns, topic, dedupe, partition string, tenant []byte, hk, hv string, payload []byte, delay int64, field uint8, n uint16) outbox.Message {
	switch field % 9 {
	case 1:
		ns = fuzzGrow(ns, n)
	case 2:
		topic = fuzzGrow(topic, n)
	case 3:
		dedupe = fuzzGrow(dedupe, n)
	case 4:
		partition = fuzzGrow(partition, n)
	case 5:
		hk = fuzzGrow(hk, n)
	case 6:
		hv = fuzzGrow(hv, n)
	case 7:
		if len(payload) > 0 && n > 1 {
			payload = []byte("[" + strings.TrimSuffix(fuzzGrow(string(payload)+",", n), ",") + "]")
		}
	}
	m := outbox.Message{Namespace: ns, Topic: topic, DedupeKey: dedupe, PartitionKey: partition,
		Payload: payload, Delay: time.Duration(delay)}
	if len(tenant) >= 16 {
		m.TenantID = uuid.UUID(tenant[:16])
		if len(tenant) > 16 && tenant[16]%2 == 0 && dedupe != "" {
			m.DedupeKey = m.TenantID.String() + "/" + dedupe // the valid form, most of the time
		}
	}
	if hk != "" || hv != "" {
		m.Headers = outbox.Headers{hk: hv}
	}
	if field%9 == 8 {
		m.Headers = outbox.Headers{}
		for i := range min(int(n), 5000) {
			m.Headers[fmt.Sprintf("%s%d", hk, i)] = hv
		}
	}
	return m
}

// fuzzText reports whether a text field is fuzzAcceptable: bounded, valid UTF-8, no NUL.
func fuzzText(v string, minLen, maxLen int) bool {
	return len(v) >= minLen && len(v) <= maxLen && utf8.ValidString(v) && !strings.Contains(v, "\x00")
}

// fuzzAcceptable is the documented contract of a message, written independently of the
// library's validation: it says whether Enqueue must accept m.
func fuzzAcceptable(m outbox.Message) bool {
	if !fuzzText(m.Namespace, 1, outbox.MaxNamespaceBytes) || !fuzzText(m.Topic, 1, outbox.MaxTopicBytes) ||
		!fuzzText(m.DedupeKey, 0, outbox.MaxDedupeKeyBytes) || !fuzzText(m.PartitionKey, 0, outbox.MaxPartitionKeyBytes) {
		return false
	}
	if m.TenantID != uuid.Nil && m.DedupeKey != "" && !strings.HasPrefix(m.DedupeKey, m.TenantID.String()+"/") {
		return false
	}
	for k, v := range m.Headers {
		if !fuzzText(k, 1, outbox.MaxHeadersBytes) || !fuzzText(v, 0, outbox.MaxHeadersBytes) {
			return false
		}
	}
	if len(m.Headers) > 0 {
		b, err := json.Marshal(map[string]string(m.Headers))
		if err != nil || len(b) > outbox.MaxHeadersBytes {
			return false
		}
	}
	return len(m.Payload) > 0 && len(m.Payload) <= fuzzMaxPayload && utf8.Valid(m.Payload) && json.Valid(m.Payload) &&
		m.Delay >= 0
}

// fuzzStore returns a store on a fresh migrated SQLite database.
func fuzzStore(f *testing.F, opts outbox.Options) (*outbox.Store, *sql.DB) {
	db := testdb.SQLite(f)
	require.NoError(f, migrations.Up(context.Background(), db, "sqlite", migrations.Options{Table: opts.Table}))
	s, err := outbox.New(db, outbox.SQLite(), opts)
	require.NoError(f, err)
	return s, db
}

func fuzzCountRows(t *testing.T, db *sql.DB) int {
	var n int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM outbox_events`).Scan(&n))
	return n
}

// FuzzEnqueue enqueues a fuzzed message behind a valid one, in one batch, on SQLite. The
// library must accept exactly the messages the contract allows; a refused message is a
// *ValidationError matching ErrInvalid that names it and writes nothing (not even the valid
// message of its batch, though the transaction commits); an accepted one reads back with
// Store.Get byte for byte, with a payload that passes its integrity check.
func FuzzEnqueue(f *testing.F) {
	store, db := fuzzStore(f, outbox.Options{MaxPayloadBytes: fuzzMaxPayload})
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, ns, topic, dedupe, partition string, tenant []byte, hk, hv string, payload []byte, delay int64, field uint8, n uint16) {
		m := fuzzMessage(ns, topic, dedupe, partition, tenant, hk, hv, payload, delay, field, n)
		good := outbox.Message{Namespace: "fuzz", Topic: "good", Payload: []byte(`{}`)}
		before := fuzzCountRows(t, db)
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		res, err := store.EnqueueBatch(ctx, tx, []outbox.Message{good, m})
		want := fuzzAcceptable(m)
		if err != nil {
			var ve *outbox.ValidationError
			require.ErrorAs(t, err, &ve, "a refused message is a *ValidationError")
			require.ErrorIs(t, err, outbox.ErrInvalid)
			require.Equal(t, 1, ve.Index)
			require.False(t, want, "refused a message the contract accepts: %v", err)
			require.NoError(t, tx.Commit())
			require.Equal(t, before, fuzzCountRows(t, db), "a refused message wrote rows")
			return
		}
		require.True(t, want, "accepted a message the contract refuses")
		require.NoError(t, tx.Commit())
		require.Len(t, res, 2)
		require.False(t, res[0].Duplicate)
		added := 2
		if res[1].Duplicate {
			added = 1 // the same (namespace, topic, dedupe key) came in an earlier input
			require.NotEmpty(t, m.DedupeKey)
			require.Equal(t, uuid.Nil, res[1].ID)
		}
		require.Equal(t, before+added, fuzzCountRows(t, db))
		if res[1].Duplicate {
			return
		}
		r, err := store.Get(ctx, res[1].ID)
		require.NoError(t, err)
		require.Equal(t, m.Namespace, r.Namespace)
		require.Equal(t, m.Topic, r.Topic)
		require.Equal(t, m.TenantID, r.TenantID)
		require.Equal(t, m.DedupeKey, r.DedupeKey)
		require.Equal(t, m.PartitionKey, r.PartitionKey)
		if len(m.Headers) == 0 {
			require.Empty(t, r.Headers)
		} else {
			require.Equal(t, m.Headers, r.Headers)
		}
		require.True(t, bytes.Equal(m.Payload, r.Payload), "payload changed: stored %d bytes, read %d", len(m.Payload), len(r.Payload))
		sum := sha256.Sum256(m.Payload)
		require.Equal(t, sum[:], r.PayloadHash)
		require.NoError(t, r.Integrity())
		require.Equal(t, outbox.StatusPending, r.Status)
		require.Zero(t, r.Attempts)
	})
}

// FuzzHeaders decodes arbitrary bytes with Headers.Scan and encodes what decoded with
// Value: decoding that encoding gives the same headers back, and a map of valid UTF-8 keys
// and values survives Value then Scan unchanged. Nothing panics.
func FuzzHeaders(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte, k, v string) {
		var h outbox.Headers
		if err := h.Scan(data); err == nil {
			var hs outbox.Headers
			require.NoError(t, hs.Scan(string(data)), "bytes decode but the same string does not")
			require.Equal(t, h, hs)
			val, err := h.Value()
			require.NoError(t, err)
			var back outbox.Headers
			require.NoError(t, back.Scan(val))
			if len(h) == 0 {
				require.Empty(t, back)
			} else {
				require.Equal(t, h, back)
			}
		}

		m := outbox.Headers{k: v}
		val, err := m.Value()
		require.NoError(t, err)
		s, ok := val.(string)
		require.True(t, ok, "Value returns %T, want string", val)
		require.True(t, json.Valid([]byte(s)))
		var back outbox.Headers
		require.NoError(t, back.Scan(s))
		if utf8.ValidString(k) && utf8.ValidString(v) {
			require.Equal(t, m, back)
		}
	})
}

// fuzzTableName is the documented table-name rule.
var fuzzTableName = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// fuzzTables counts the tables FuzzNewTable created, to give each a namespace of its own.
var fuzzTables atomic.Int64

// FuzzNewTable checks that dialect.NewTable accepts exactly the names [a-z_][a-z0-9_]* of at
// most dialect.MaxTableBytes bytes that do not begin with SQLite's reserved prefix sqlite_,
// that New refuses the others with a *ValidationError, and that an accepted name works end
// to end on SQLite: migrate, enqueue, claim, ack, read back.
func FuzzNewTable(f *testing.F) {
	db := testdb.SQLite(f)
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, name string) {
		tbl, err := dialect.NewTable(name)
		want := len(name) <= dialect.MaxTableBytes && fuzzTableName.MatchString(name) && !strings.HasPrefix(name, "sqlite_")
		if err != nil {
			require.False(t, want, "refused %q: %v", name, err)
			if name != "" { // the empty name means the default table to New
				_, err := outbox.New(db, outbox.SQLite(), outbox.Options{Table: name})
				var ve *outbox.ValidationError
				require.ErrorAs(t, err, &ve, "New accepts a table name NewTable refuses")
				require.ErrorIs(t, err, outbox.ErrInvalid)
				require.Equal(t, "table", ve.Field)
			}
			return
		}
		require.True(t, want, "accepted %q", name)
		require.Equal(t, name, tbl.Name())

		sum := sha256.Sum256([]byte(name))
		version := "v_" + hex.EncodeToString(sum[:10])
		err = migrations.Up(ctx, db, "sqlite", migrations.Options{Table: name, VersionTable: version})
		require.NoError(t, err, "migrate table %q", name)
		store, err := outbox.New(db, outbox.SQLite(), outbox.Options{Table: name})
		require.NoError(t, err)
		ns := fmt.Sprintf("ns%d", fuzzTables.Add(1))
		res, err := store.EnqueueStandalone(ctx, outbox.Message{Namespace: ns, Topic: "t", Payload: []byte(`{"table":true}`)})
		require.NoError(t, err)
		recs, err := store.Claim(ctx, outbox.ClaimOptions{Scope: outbox.Scope{Namespace: ns}, Limit: 10, Lease: time.Minute, MaxAttempts: 3, WorkerID: "fuzz"})
		require.NoError(t, err)
		require.Len(t, recs, 1)
		require.Equal(t, res[0].ID, recs[0].ID)
		require.NoError(t, store.Ack(ctx, recs[0].Lease()))
		r, err := store.Get(ctx, res[0].ID)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusDelivered, r.Status)
	})
}
