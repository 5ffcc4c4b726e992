package sqlite_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

// TestSQLiteRunsKeysAsText: the run read passes the heads' namespaces and keys through
// JSON; keys with quotes, backslashes, unicode or the look of JSON, in a namespace of the
// same, under a topic and tenant scope, each claim their whole run in sequence, and the
// same keys in another namespace stay pending.
func TestSQLiteRunsKeysAsText(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, db := newSQLiteStore(ctx, t)
	require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{Ordered: true}))
	const ns, other = `n'"\é😀`, `n'"\é😀 `
	tenant := uuid.New()
	keys := []string{`a"b`, `a'b`, `a\b`, `123`, `[1]`, `{"k":1}`, "é\u2028😀", `<&>`, `null`}
	var msgs []outbox.Message
	for i := range 4 {
		for _, k := range keys {
			for _, n := range []string{ns, other} {
				msgs = append(msgs, outbox.Message{Namespace: n, Topic: fmt.Sprintf("t%d", i%2), TenantID: tenant, PartitionKey: k,
					Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))})
			}
		}
		_, err := s.EnqueueStandalone(ctx, msgs...)
		require.NoError(t, err)
		msgs = msgs[:0]
	}
	o := outbox.ClaimOptions{Scope: outbox.Scope{Namespace: ns, Topics: []string{"t0", "t1"}, TenantID: tenant}, Limit: 100,
		Lease: time.Minute, MaxAttempts: 5, WorkerID: "w", Ordered: true, Runs: true}
	recs, err := s.Claim(ctx, o)
	require.NoError(t, err)
	require.Equal(t, 4*len(keys), len(recs), "every key's head and its whole run")
	seen := map[string][]string{}
	for _, r := range recs {
		require.Equal(t, ns, r.Namespace)
		seen[r.PartitionKey] = append(seen[r.PartitionKey], string(r.Payload))
	}
	for _, k := range keys {
		require.Equal(t, []string{`{"i":0}`, `{"i":1}`, `{"i":2}`, `{"i":3}`}, seen[k], "key %q in sequence", k)
	}
}
