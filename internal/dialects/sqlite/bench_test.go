package sqlite_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
)

// BenchmarkSQLiteClaimAnatomy takes the SQLite claim and ack apart: from the raw loop's one
// statement each (cmd/outbox-bench's baseline), it adds one at a time what the library does
// for its guarantees, then runs the library itself. It explains the SQLite burn-down gap
// (BENCHMARKS.md); run it with
//
//	go test -run '^$' -bench SQLiteClaimAnatomy -count 6 .
//
// Each op claims (or acks) 100 of 20 000 pending rows. synchronous=OFF keeps the fsync out:
// every variant commits exactly once, so the fsync it would add is the same for all, and
// without it the figures are the statements' own cost, repeatable to a few percent.
func BenchmarkSQLiteClaimAnatomy(b *testing.B) {
	const batch, rows = 100, 20_000
	ctx := context.Background()
	db := testdb.SQLite(b)
	if err := migrations.Up(ctx, db, "sqlite", migrations.Options{}); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Exec(`PRAGMA synchronous = OFF`); err != nil {
		b.Fatal(err)
	}
	store, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	if err != nil {
		b.Fatal(err)
	}
	msgs := make([]outbox.Message, 1000)
	for i := range msgs {
		msgs[i] = outbox.Message{Namespace: "bench", Topic: "order.paid", PartitionKey: "order-1",
			Payload: []byte(`{"order_id":1,"note":"` + strings.Repeat("x", 300) + `"}`)}
	}
	for range rows / len(msgs) {
		if _, err := store.EnqueueStandalone(ctx, msgs...); err != nil {
			b.Fatal(err)
		}
	}
	// reset puts every claimed or delivered row back to pending, outside the timer.
	reset := func(b *testing.B) {
		b.StopTimer()
		defer b.StartTimer()
		if _, err := db.Exec(`UPDATE outbox_events SET status = 'pending', attempts = 0, locked_by = NULL,
			locked_until = NULL, lease_token = NULL, delivered_at = NULL WHERE status IN ('processing', 'delivered')`); err != nil {
			b.Fatal(err)
		}
	}
	const eligible = `status IN ('pending', 'processing') AND ((status = 'pending' AND next_attempt_at <= ?)` +
		` OR (status = 'processing' AND locked_until < ?)) AND attempts < 10 AND namespace = 'bench'`
	claimSQL := func(returning string) string {
		return `UPDATE outbox_events SET status = 'processing', attempts = attempts + 1, locked_by = 'w', locked_until = ?,` +
			` lease_token = ?, updated_at = ? WHERE id IN (SELECT id FROM outbox_events WHERE ` + eligible +
			` ORDER BY created_at, id LIMIT ` + "100" + `) RETURNING ` + returning
	}
	const narrow = `id, topic, partition_key, headers, payload, attempts`
	const wide = `id, namespace, topic, tenant_id, dedupe_key, partition_key, headers, payload, payload_hash, status,` +
		` attempts, next_attempt_at, locked_by, locked_until, lease_token, last_error, created_at, updated_at, delivered_at`
	// onConn runs fn on one connection of the pool; inTx wraps it in BEGIN IMMEDIATE ...
	// COMMIT, fn reading the clock after BEGIN, as the library does.
	onConn := func(b *testing.B, inTx bool, fn func(conn *sql.Conn)) {
		conn, err := db.Conn(ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		if inTx {
			if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
				b.Fatal(err)
			}
		}
		fn(conn)
		if inTx {
			if _, err := conn.ExecContext(ctx, `COMMIT`); err != nil {
				b.Fatal(err)
			}
		}
	}
	// rawClaim runs the claim and returns the claimed ids (inTx: see onConn).
	rawClaim := func(b *testing.B, returning string, inTx bool) (ids []any, token []byte) {
		tok := uuid.New()
		onConn(b, inTx, func(conn *sql.Conn) {
			now := time.Now().UnixMicro()
			rs, err := conn.QueryContext(ctx, claimSQL(returning), now+30_000_000, tok[:], now, now, now)
			if err != nil {
				b.Fatal(err)
			}
			cols, _ := rs.Columns()
			dest := make([]any, len(cols))
			for i := range dest {
				dest[i] = new(any)
			}
			for rs.Next() {
				if err := rs.Scan(dest...); err != nil {
					b.Fatal(err)
				}
				ids = append(ids, *(dest[0].(*any)))
			}
			if err := rs.Close(); err != nil {
				b.Fatal(err)
			}
		})
		if len(ids) != batch {
			b.Fatalf("claimed %d rows", len(ids))
		}
		return ids, tok[:]
	}
	claimOpts := outbox.ClaimOptions{Scope: outbox.Scope{Namespace: "bench"}, Limit: batch, Lease: 30 * time.Second, MaxAttempts: 10, WorkerID: "w"}
	libClaim := func(b *testing.B) []outbox.Lease {
		recs, err := store.Claim(ctx, claimOpts)
		if err != nil || len(recs) != batch {
			b.Fatal(len(recs), err)
		}
		ls := make([]outbox.Lease, len(recs))
		for i, r := range recs {
			ls[i] = r.Lease()
		}
		return ls
	}

	for _, v := range []struct {
		name       string
		returning  string
		inTx, libr bool
	}{
		{"claim/1-raw", narrow, false, false},
		{"claim/2-raw+all-columns", wide, false, false},
		{"claim/3-raw+all-columns+BEGIN-IMMEDIATE", wide, true, false},
		{"claim/4-library", "", false, true},
	} {
		b.Run(v.name, func(b *testing.B) {
			for b.Loop() {
				if v.libr {
					libClaim(b)
				} else {
					rawClaim(b, v.returning, v.inTx)
				}
				reset(b)
			}
		})
	}

	// The acks settle a claim made outside the timer.
	ackSQL := func(n int, guarded bool) string {
		q := `UPDATE outbox_events SET status = 'delivered', delivered_at = ?, updated_at = ?, locked_by = NULL,` +
			` locked_until = NULL WHERE id IN (?` + strings.Repeat(`, ?`, n-1) + `)`
		if guarded {
			q += ` AND lease_token = ? AND status = 'processing' RETURNING id`
		}
		return q
	}
	rawAck := func(b *testing.B, ids []any, token []byte, guarded, inTx bool) {
		onConn(b, inTx, func(conn *sql.Conn) {
			now := time.Now().UnixMicro()
			args := append([]any{now, now}, ids...)
			if guarded {
				args = append(args, token)
			}
			rs, err := conn.QueryContext(ctx, ackSQL(len(ids), guarded), args...)
			if err != nil {
				b.Fatal(err)
			}
			var id []byte
			for rs.Next() {
				if err := rs.Scan(&id); err != nil {
					b.Fatal(err)
				}
			}
			if err := rs.Close(); err != nil {
				b.Fatal(err)
			}
		})
	}
	for _, v := range []struct {
		name                string
		guarded, inTx, libr bool
	}{
		{"ack/1-raw", false, false, false},
		{"ack/2-raw+lease-guard+RETURNING", true, false, false},
		{"ack/3-raw+lease-guard+RETURNING+BEGIN-IMMEDIATE", true, true, false},
		{"ack/4-library", false, false, true},
	} {
		b.Run(v.name, func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				var (
					ids    []any
					token  []byte
					leases []outbox.Lease
				)
				if v.libr {
					leases = libClaim(b)
				} else {
					ids, token = rawClaim(b, narrow, false)
				}
				b.StartTimer()
				if v.libr {
					if err := store.Ack(ctx, leases...); err != nil {
						b.Fatal(err)
					}
				} else {
					rawAck(b, ids, token, v.guarded, v.inTx)
				}
				reset(b)
			}
		})
	}
}
