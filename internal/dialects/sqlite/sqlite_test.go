package sqlite_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/conformance"
	"github.com/outboxgo/outbox/internal/dialects/dialecttest"
	"github.com/outboxgo/outbox/internal/dialects/sqlite"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
)

func TestSQLiteConformance(t *testing.T) {
	t.Parallel()
	conformance.Run(t, conformance.Harness{
		Dialect:     outbox.SQLite(),
		OpenDB:      func(t testing.TB) *sql.DB { return testdb.SQLite(t) },
		OtherServer: func(t testing.TB) *sql.DB { return testdb.Postgres(t) },
	})
}

// TestEnqueueBatchOnDBIsAtomic: a batch enqueued with EnqueueStandalone spans several
// statements (SQLite takes 500 rows per INSERT); when a later one fails, none of the batch
// stays, because the store runs it in one transaction of its own.
func TestEnqueueBatchOnDBIsAtomic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.SQLite(t)
	require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{}))
	_, err := db.Exec(`CREATE TRIGGER boom BEFORE INSERT ON outbox_events WHEN NEW.topic = 'boom'
		BEGIN SELECT RAISE(ABORT, 'injected failure'); END`)
	require.NoError(t, err)
	s, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	require.NoError(t, err)
	msgs := make([]outbox.Message, 800)
	for i := range msgs {
		msgs[i] = outbox.Message{Namespace: "n", Topic: "ok", Payload: json.RawMessage(`{}`)}
	}
	msgs[700].Topic = "boom" // in the second statement
	_, err = s.EnqueueStandalone(ctx, msgs...)
	require.ErrorContains(t, err, "injected failure")
	var n int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM outbox_events`).Scan(&n))
	require.Zero(t, n, "the first statement's 500 rows were rolled back too")
}

// TestSQLiteSettleNeverMovesUpdatedAtBack: the SQLite ack and nack are autocommit statements
// whose clock is read before the write lock, so another writer may have stamped the row
// later meanwhile (another process, a clock read after ours). Their updated_at must still
// move forward. Here rows stamped an hour ahead are settled through both statements of
// Complete: the uniform ack, and the outcome join (an ack and a nack in one call).
func TestSQLiteSettleNeverMovesUpdatedAtBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, db := newSQLiteStore(ctx, t)
	policy := outbox.RetryPolicy{BaseDelay: time.Second, MaxDelay: time.Second, MaxAttempts: 5}
	for _, tc := range []struct {
		name     string
		outcomes func(recs []outbox.Record) []outbox.Outcome
	}{
		{"uniform-ack", func(recs []outbox.Record) []outbox.Outcome {
			return []outbox.Outcome{{Lease: recs[0].Lease(), Status: outbox.StatusDelivered}}
		}},
		{"ack-and-nack", func(recs []outbox.Record) []outbox.Outcome {
			return []outbox.Outcome{{Lease: recs[0].Lease(), Status: outbox.StatusDelivered},
				policy.Outcome(outbox.Failure{Lease: recs[1].Lease(), Attempts: 1, Err: errors.New("boom")})}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msgs := []outbox.Message{{Namespace: "n", Topic: tc.name, Payload: json.RawMessage(`{}`)},
				{Namespace: "n", Topic: tc.name, Payload: json.RawMessage(`{}`)}}
			_, err := s.EnqueueStandalone(ctx, msgs...)
			require.NoError(t, err)
			recs, err := s.Claim(ctx, outbox.ClaimOptions{Scope: outbox.Scope{Topics: []string{tc.name}}, Limit: 2,
				Lease: time.Minute, MaxAttempts: 5, WorkerID: "w"})
			require.NoError(t, err)
			require.Len(t, recs, 2)
			ahead := time.Now().Add(time.Hour).UnixMicro()
			_, err = db.Exec(`UPDATE outbox_events SET updated_at = ? WHERE topic = ?`, ahead, tc.name)
			require.NoError(t, err)
			outcomes := tc.outcomes(recs)
			require.NoError(t, s.Complete(ctx, outcomes...))
			for _, o := range outcomes {
				got, err := s.Get(ctx, o.ID)
				require.NoError(t, err)
				require.Equal(t, o.Status, got.Status)
				require.Equal(t, time.UnixMicro(ahead+1).UTC(), got.UpdatedAt, "updated_at moved forward by 1µs, not back to now")
				if o.Status == outbox.StatusDelivered {
					require.Equal(t, got.UpdatedAt, got.DeliveredAt, "delivered_at is the same stamp")
				} else {
					require.WithinDuration(t, time.Now().Add(time.Second), got.NextAttemptAt, 2*time.Second, "the retry follows the clock, not the stamp")
				}
			}
		})
	}
}

// TestSQLiteClaimReadsClockAfterLock: the claim is one autocommit statement that takes
// SQLite's write lock before it reads the clock (SQLite's own, in the statement), so a
// claim that waited for the lock still leases for the whole Lease from when it got it.
// Another pool holds the write lock while a claim starts; the claim's updated_at (the clock
// it read) must not be earlier than the millisecond in which the lock was let go (SQLite's
// clock has a millisecond's resolution). A clock read before the lock fails this unless the
// claim goroutine stayed unscheduled for the whole hold.
func TestSQLiteClaimReadsClockAfterLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "outbox.db")
	open := func() *sql.DB {
		db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(30000)")
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		return db
	}
	db, other := open(), open()
	require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{}))
	s, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	require.NoError(t, err)
	_, err = dialecttest.EnqueueOne(s, ctx, outbox.Message{Namespace: "n", Topic: "t", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)

	holder, err := other.Conn(ctx)
	require.NoError(t, err)
	defer holder.Close()
	_, err = holder.ExecContext(ctx, `BEGIN IMMEDIATE`)
	require.NoError(t, err)
	type result struct {
		recs []outbox.Record
		err  error
	}
	done := make(chan result, 1)
	go func() {
		recs, err := s.Claim(ctx, outbox.ClaimOptions{Limit: 10, Lease: time.Minute, MaxAttempts: 5, WorkerID: "w"})
		done <- result{recs, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("the claim did not wait for the write lock: %v, %v", r.recs, r.err)
	case <-time.After(300 * time.Millisecond): // the hold; see the test's comment
	}
	released := time.Now().Truncate(time.Millisecond)
	_, err = holder.ExecContext(ctx, `COMMIT`)
	require.NoError(t, err)
	r := <-done
	require.NoError(t, r.err)
	require.Len(t, r.recs, 1)
	require.False(t, r.recs[0].UpdatedAt.Before(released), "clock read at %v, before the lock was let go at %v", r.recs[0].UpdatedAt, released)
	require.Equal(t, r.recs[0].UpdatedAt.Add(time.Minute), r.recs[0].LockedUntil)
	got, err := s.Get(ctx, r.recs[0].ID)
	require.NoError(t, err)
	require.Equal(t, r.recs[0].LockedUntil, got.LockedUntil)
	require.Equal(t, r.recs[0].UpdatedAt, got.UpdatedAt)
}

// TestSQLiteAckPaddedList: the SQLite uniform ack binds its ids padded to a power of two by
// repeating the last one, so that it stays prepared. Acks of 3, 5 and 3 rows (padded to 4,
// 8 and 4) settle exactly their rows, and a repeated id never hides a lost lease.
func TestSQLiteAckPaddedList(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, db := newSQLiteStore(ctx, t)
	leases := enqueueAndClaim(ctx, t, s, db, 9)
	delivered := func() (n int) {
		require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM outbox_events WHERE status = 'delivered'`).Scan(&n))
		return n
	}
	require.NoError(t, s.Ack(ctx, leases[:3]...))
	require.Equal(t, 3, delivered())
	require.NoError(t, s.Ack(ctx, leases[3:8]...))
	require.Equal(t, 8, delivered())
	// Two rows already delivered and the last one, padded to 4 by repeating the last: the
	// delivered ones are lost leases, and only they.
	err := s.Ack(ctx, leases[1], leases[0], leases[8])
	var lle *outbox.LeaseLostError
	require.ErrorAs(t, err, &lle)
	require.ElementsMatch(t, []uuid.UUID{leases[1].ID, leases[0].ID}, lle.IDs)
	require.Equal(t, 9, delivered())
}

// TestSQLiteOneConnectionPool: a pool of one connection (common advice for SQLite) runs
// every library write, and the prepared statements get made. No library call may need a
// second connection while it holds one: an earlier design prepared statements inside the
// claim's transaction and waited for itself until the context ended.
func TestSQLiteOneConnectionPool(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	db := testdb.SQLite(t)
	db.SetMaxOpenConns(1)
	require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{}))
	s, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	require.NoError(t, err)
	for range 3 { // the first round prepares, the later ones run prepared
		leases := enqueueAndClaim(ctx, t, s, db, 2)
		require.NoError(t, s.Extend(ctx, time.Minute, leases...))
		require.NoError(t, s.Ack(ctx, leases...))
		_, err = s.BuryExpired(ctx, outbox.Scope{}, 5, 10)
		require.NoError(t, err)
	}
	// The probe, the claim and the ack of two rows.
	require.Equal(t, 3, sqlite.PreparedStatements(s.Dialect()))

	// 600 rows: the claim is the same statement; the ack's list is padded to 1 024 ids,
	// a new statement that stays prepared too.
	require.NoError(t, s.Ack(ctx, enqueueAndClaim(ctx, t, s, db, 600)...))
	require.Equal(t, 4, sqlite.PreparedStatements(s.Dialect()))
	var n int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox_events WHERE status = 'delivered'`).Scan(&n))
	require.Equal(t, 606, n)
}

// enqueueAndClaim enqueues n messages and claims them in one claim, returning the leases.
func enqueueAndClaim(ctx context.Context, t *testing.T, s *outbox.Store, db *sql.DB, n int) []outbox.Lease {
	t.Helper()
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Namespace: "n", Topic: "t", Payload: json.RawMessage(`{}`)}
	}
	_, err := s.EnqueueStandalone(ctx, msgs...)
	require.NoError(t, err)
	recs, err := s.Claim(ctx, outbox.ClaimOptions{Limit: n, Lease: time.Minute, MaxAttempts: 5, WorkerID: "w"})
	require.NoError(t, err)
	require.Len(t, recs, n)
	leases := make([]outbox.Lease, len(recs))
	for i, r := range recs {
		leases[i] = r.Lease()
	}
	return leases
}

// newSQLiteStore returns a Store on a new, migrated SQLite database, and the database.
func newSQLiteStore(ctx context.Context, t *testing.T) (*outbox.Store, *sql.DB) {
	t.Helper()
	db := testdb.SQLite(t)
	require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{}))
	s, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	require.NoError(t, err)
	return s, db
}
