package conformance_test

import (
	"context"
	"database/sql"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/conformance"
	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/testdb"
)

// The suite must catch broken adapters, not only pass good ones. Each broken dialect below
// wraps the SQLite dialect with one bug; the suite runs against it in a child process (a
// failing *testing.T cannot be contained in-process), and the parent requires the child
// to fail on the tests that guard against that bug.

// leaseBlindDialect claims rows whatever their lease: the double-claim bug.
type leaseBlindDialect struct{ outbox.Dialect }

func (d leaseBlindDialect) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]outbox.Record, error) {
	// Forget every lease first, then claim as usual: live leases no longer protect rows.
	if _, err := db.ExecContext(ctx, `UPDATE `+t.Name()+` SET locked_until = 0 WHERE status = 'processing'`); err != nil {
		return nil, err
	}
	return d.Dialect.Claim(ctx, db, t, p)
}

// tokenBlindDialect settles rows without checking the lease token: a stale worker
// overwrites the new owner's outcome.
type tokenBlindDialect struct{ outbox.Dialect }

func (d tokenBlindDialect) Complete(ctx context.Context, q dialect.DBTX, t dialect.Table, outcomes []outbox.Outcome) ([]uuid.UUID, error) {
	for i := range outcomes {
		var token []byte
		if err := q.QueryRowContext(ctx, `SELECT lease_token FROM `+t.Name()+` WHERE id = ?`, outcomes[i].ID[:]).Scan(&token); err == nil {
			copy(outcomes[i].Token[:], token)
		}
	}
	return d.Dialect.Complete(ctx, q, t, outcomes)
}

// scopeBlindDialect sweeps every exhausted row, whatever the publisher's scope: one
// module's publisher would dead-letter another module's events.
type scopeBlindDialect struct{ outbox.Dialect }

func (d scopeBlindDialect) Bury(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.BuryParams) ([]uuid.UUID, error) {
	p.Scope = outbox.Scope{}
	return d.Dialect.Bury(ctx, q, t, p)
}

// refundBlindDialect ignores RefundAttempt, as a dialect written before it existed would:
// every outage spends an attempt, and a long one dead-letters the backlog.
type refundBlindDialect struct{ outbox.Dialect }

func noRefunds(outcomes []outbox.Outcome) []outbox.Outcome {
	out := append([]outbox.Outcome(nil), outcomes...)
	for i := range out {
		out[i].RefundAttempt = false
	}
	return out
}

func (d refundBlindDialect) Complete(ctx context.Context, q dialect.DBTX, t dialect.Table, outcomes []outbox.Outcome) ([]uuid.UUID, error) {
	return d.Dialect.Complete(ctx, q, t, noRefunds(outcomes))
}

var _ dialect.SettleClaimer = refundBlindDialect{}

func (d refundBlindDialect) CompleteAndClaim(ctx context.Context, db *sql.DB, t dialect.Table, outcomes []outbox.Outcome, p dialect.ClaimParams) ([]outbox.Record, []uuid.UUID, error) {
	return d.Dialect.(dialect.SettleClaimer).CompleteAndClaim(ctx, db, t, noRefunds(outcomes), p)
}

// withAbilities forwards the optional abilities of the dialect it wraps, which embedding
// the Dialect interface alone would hide from the engine's type assertions.
type withAbilities struct{ outbox.Dialect }

func (d withAbilities) admin() dialect.Administrator { return d.Dialect.(dialect.Administrator) }

func (d withAbilities) Stats(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.StatsParams) (dialect.StatsSample, error) {
	return d.admin().Stats(ctx, q, t, p)
}

func (d withAbilities) ListDead(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ListDeadParams) ([]outbox.Record, error) {
	return d.admin().ListDead(ctx, q, t, p)
}

func (d withAbilities) Replay(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ReplayParams) ([]uuid.UUID, error) {
	return d.admin().Replay(ctx, db, t, p)
}

func (d withAbilities) Discard(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.DiscardParams) ([]uuid.UUID, error) {
	return d.admin().Discard(ctx, db, t, p)
}

func (d withAbilities) Purge(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.PurgeParams) (int64, error) {
	return d.Dialect.(dialect.Purger).Purge(ctx, db, t, p)
}

// purgeAllDialect purges the oldest rows whatever their status: pending events vanish.
type purgeAllDialect struct{ withAbilities }

func (purgeAllDialect) Purge(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.PurgeParams) (int64, error) {
	res, err := db.ExecContext(ctx, `DELETE FROM `+t.Name()+` WHERE id IN (SELECT id FROM `+t.Name()+` ORDER BY updated_at LIMIT ?)`, p.Limit)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// replayAnyDialect replays rows in any state: a delivered event is sent again, a row in
// flight loses its lease.
type replayAnyDialect struct{ withAbilities }

func (replayAnyDialect) Replay(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ReplayParams) ([]uuid.UUID, error) {
	var out []uuid.UUID
	for _, id := range p.IDs {
		res, err := db.ExecContext(ctx, `UPDATE `+t.Name()+` SET status = 'pending', attempts = 0, lease_token = ?, replays = replays + 1 WHERE id = ?`, p.Token[:], id[:])
		if err != nil {
			return nil, err
		}
		if n, _ := res.RowsAffected(); n == 1 {
			out = append(out, id)
		}
	}
	return out, nil
}

// cursorBlindDialect ignores the keyset and serves the first page again and again.
type cursorBlindDialect struct{ withAbilities }

func (d cursorBlindDialect) ListDead(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ListDeadParams) ([]outbox.Record, error) {
	p.AfterID = uuid.Nil
	return d.withAbilities.ListDead(ctx, q, t, p)
}

// orderBlindDialect says it claims in order but ignores the order: it claims every due
// row, whatever its partition key.
type orderBlindDialect struct{ outbox.Dialect }

func (d orderBlindDialect) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]outbox.Record, error) {
	p.Ordered, p.OrderedSkipDead = false, false
	return d.Dialect.Claim(ctx, db, t, p)
}

func (d orderBlindDialect) BlockedKeys(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.BlockedKeysParams) ([]outbox.BlockedKey, error) {
	return d.Dialect.(dialect.OrderedClaimer).BlockedKeys(ctx, q, t, p)
}

func (d orderBlindDialect) CheckOrdered(ctx context.Context, db *sql.DB, t dialect.Table) error {
	return d.Dialect.(dialect.OrderedClaimer).CheckOrdered(ctx, db, t)
}

// indexBlindDialect claims in order but never finds the order index missing: on a table
// without it, ordered claims fail with the database's error about an unknown index (on
// PostgreSQL they would read the whole table) instead of saying what to migrate.
type indexBlindDialect struct{ outbox.Dialect }

func (d indexBlindDialect) BlockedKeys(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.BlockedKeysParams) ([]outbox.BlockedKey, error) {
	return d.Dialect.(dialect.OrderedClaimer).BlockedKeys(ctx, q, t, p)
}

func (indexBlindDialect) CheckOrdered(context.Context, *sql.DB, dialect.Table) error { return nil }

// staleExtendDialect extends leases but forgets to advance updated_at: locked_until -
// updated_at no longer equals the lease, and the row looks older than its last change.
type staleExtendDialect struct{ outbox.Dialect }

func (d staleExtendDialect) Extend(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ExtendParams) ([]uuid.UUID, error) {
	var lost []uuid.UUID
	for _, l := range p.Leases {
		var before int64
		if err := q.QueryRowContext(ctx, `SELECT updated_at FROM `+t.Name()+` WHERE id = ?`, l.ID[:]).Scan(&before); err != nil {
			return nil, err
		}
		ids, err := d.Dialect.Extend(ctx, q, t, dialect.ExtendParams{Leases: []outbox.Lease{l}, Lease: p.Lease})
		if err != nil {
			return nil, err
		}
		lost = append(lost, ids...)
		if _, err := q.ExecContext(ctx, `UPDATE `+t.Name()+` SET updated_at = ? WHERE id = ?`, before, l.ID[:]); err != nil {
			return nil, err
		}
	}
	return lost, nil
}

// passingOrderedCheckDialect claims in order but its ordered check always passes, whatever
// the table lacks.
type passingOrderedCheckDialect struct{ orderedSQLite }

func (passingOrderedCheckDialect) CheckOrdered(context.Context, *sql.DB, dialect.Table) error {
	return nil
}

// orderedSQLite forwards the SQLite dialect's checks and ordered claims.
type orderedSQLite struct{ outbox.Dialect }

func (d orderedSQLite) Check(ctx context.Context, db *sql.DB, t dialect.Table) error {
	return d.Dialect.(dialect.Checker).Check(ctx, db, t)
}

func (d orderedSQLite) BlockedKeys(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.BlockedKeysParams) ([]outbox.BlockedKey, error) {
	return d.Dialect.(dialect.OrderedClaimer).BlockedKeys(ctx, q, t, p)
}

func (d orderedSQLite) CheckOrdered(ctx context.Context, db *sql.DB, t dialect.Table) error {
	return d.Dialect.(dialect.OrderedClaimer).CheckOrdered(ctx, db, t)
}

// columnBlindDialect's Check finds a missing table and a server of another kind, but takes
// a table that lacks a column for a ready one.
type columnBlindDialect struct{ outbox.Dialect }

func (d columnBlindDialect) Check(ctx context.Context, db *sql.DB, t dialect.Table) error {
	err := d.Dialect.(dialect.Checker).Check(ctx, db, t)
	if err != nil && strings.Contains(err.Error(), "lacks column") {
		return nil
	}
	return err
}

var broken = map[string]outbox.Dialect{
	"stale-extend":  staleExtendDialect{outbox.SQLite()},
	"ordered-check": passingOrderedCheckDialect{orderedSQLite{outbox.SQLite()}},
	"column-blind":  columnBlindDialect{outbox.SQLite()},
	"order-blind":   orderBlindDialect{outbox.SQLite()},
	"index-blind":   indexBlindDialect{outbox.SQLite()},
	"lease-blind":   leaseBlindDialect{outbox.SQLite()},
	"token-blind":   tokenBlindDialect{outbox.SQLite()},
	"scope-blind":   scopeBlindDialect{outbox.SQLite()},
	"purge-all":     purgeAllDialect{withAbilities{outbox.SQLite()}},
	"replay-any":    replayAnyDialect{withAbilities{outbox.SQLite()}},
	"cursor-blind":  cursorBlindDialect{withAbilities{outbox.SQLite()}},
	"claim-first":   claimFirstDialect{outbox.SQLite()},
	"refund-blind":  refundBlindDialect{outbox.SQLite()},
	// broken_notify_test.go: on PostgreSQL
	"silent":       silentDialect{pgNotifier{outbox.Postgres()}},
	"eager-signal": eagerSignalDialect{pgNotifier{outbox.Postgres()}},
	"never-ready":  neverReadyDialect{pgNotifier{outbox.Postgres()}},
	"table-blind":  tableBlindDialect{pgNotifier{outbox.Postgres()}},
	"schema-blind": schemaBlindDialect{pgNotifier{outbox.Postgres()}},
	"deaf":         deafDialect{pgNotifier{outbox.Postgres()}},
}

// TestBrokenDialectChild runs the suite against one broken dialect; it does something
// only when re-executed by TestSuiteCatchesBrokenDialects.
func TestBrokenDialectChild(t *testing.T) {
	name := os.Getenv("OUTBOX_BROKEN_DIALECT")
	if name == "" {
		t.Skip("run by TestSuiteCatchesBrokenDialects")
	}
	h := conformance.Harness{
		Dialect:     broken[name],
		OpenDB:      func(t testing.TB) *sql.DB { return testdb.SQLite(t) },
		OtherServer: func(t testing.TB) *sql.DB { return testdb.Postgres(t) },
		DSN:         func(t testing.TB, db *sql.DB) (string, string) { return "sqlite", testdb.DSN(t, "sqlite", db) },
	}
	if h.Dialect.Name() == "postgres" {
		h.DSN = func(t testing.TB, db *sql.DB) (string, string) { return "pgx", testdb.DSN(t, "postgres", db) }
		h.OpenDB, h.OtherServer, h.Reopen = h.OtherServer, h.OpenDB, testdb.Reopen
	}
	conformance.Run(t, h)
}

func TestSuiteCatchesBrokenDialects(t *testing.T) {
	t.Parallel()
	cases := []struct {
		dialect  string
		mustFail []string
	}{
		{"lease-blind", []string{"Concurrency/NoDoubleClaim", "Lease/ExtendKeepsTheRow", "Claim/Fields"}},
		{"token-blind", []string{"Lease/ExpiredLeaseIsReclaimed", "Settle/AckReportsOnlyLostRows"}},
		{"scope-blind", []string{"Claim/BuryRespectsScope"}},
		{"purge-all", []string{"Retention/PurgeNeverTouchesLiveRows", "Retention/PurgeInBatches", "Retention/PurgeConcurrently"}},
		{"replay-any", []string{"Admin/ReplayOnlyDeadRows", "Admin/ReplayedRowIsDelivered"}},
		{"cursor-blind", []string{"Admin/ListDeadPages"}},
		{"claim-first", []string{"SettleAndClaim/ExpiredLeaseNotReclaimed"}},
		{"order-blind", []string{"Ordered/HeadOnly", "Ordered/RetryHoldsKey", "Ordered/DeadHeadBlocks", "Ordered/SkipDead", "Ordered/Publishers"}},
		{"index-blind", []string{"Ordered/NeedsOrderedMigrations"}},
		{"stale-extend", []string{"Lease/ExtendKeepsTheRow"}},
		{"ordered-check", []string{"Ordered/NeedsOrderedMigrations"}},
		{"column-blind", []string{"Check/MissingColumn"}},
		{"refund-blind", []string{"Settle/UnavailableRefundsAttempt", "Settle/UnavailableNeverDies", "SettleAndClaim/UnavailableRefundsAttempt"}},
		{"silent", []string{"Notify/CommitWakes", "Notify/PublisherWokenAcrossPools", "Notify/PublisherWokenAcrossProcesses"}},
		{"eager-signal", []string{"Notify/RollbackWakesNobody", "Notify/BatchWakesAfterCommit"}},
		{"never-ready", []string{"Notify/CommitWakes", "Notify/ListenReturnsOnCancel", "Notify/PublisherWokenAcrossPools"}},
		{"table-blind", []string{"Notify/OtherTableWakesNobody"}},
		{"schema-blind", []string{"Notify/OtherDatabaseWakesNobody"}},
		{"deaf", []string{"Notify/ListenReturnsOnCancel", "Notify/PublisherWokenAcrossPools"}},
	}
	// only limits a child to some subtests (a -test.run pattern below TestBrokenDialectChild)
	// where the bug cannot show elsewhere, with Enqueue/CommitLeavesExactlyOne as the
	// healthy one.
	only := map[string]string{
		"index-blind":   "^(Enqueue|Ordered)$/^(CommitLeavesExactlyOne|NeedsOrderedMigrations)$",
		"refund-blind":  "^(Enqueue|Settle|SettleAndClaim)$",
		"stale-extend":  "^(Enqueue|Lease)$",
		"ordered-check": "^(Enqueue|Ordered)$/^(CommitLeavesExactlyOne|NeedsOrderedMigrations)$",
		"column-blind":  "^(Enqueue|Check)$",
		"silent":        onlyNotify("CommitWakes", "PublisherWokenAcrossPools", "PublisherWokenAcrossProcesses"),
		"eager-signal":  onlyNotify(),
		"never-ready":   onlyNotify("CommitWakes", "ListenReturnsOnCancel", "PublisherWokenAcrossPools"),
		"table-blind":   onlyNotify(),
		"schema-blind":  onlyNotify(),
		"deaf":          onlyNotify("ListenReturnsOnCancel", "PublisherWokenAcrossPools"),
	}
	for _, c := range cases {
		t.Run(c.dialect, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			run := "^TestBrokenDialectChild$"
			if o := only[c.dialect]; o != "" {
				run += "/" + o
			}
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+run, "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "OUTBOX_BROKEN_DIALECT="+c.dialect)
			out, err := cmd.CombinedOutput()
			require.Error(t, err, "the suite passed a broken dialect:\n%s", out)
			for _, name := range c.mustFail {
				require.Contains(t, string(out), "--- FAIL: TestBrokenDialectChild/"+name,
					"the suite must catch the %s bug in %s", c.dialect, name)
			}
			// A healthy area still passes: the failures are the bug's, not the harness's.
			require.Contains(t, string(out), "--- PASS: TestBrokenDialectChild/Enqueue/CommitLeavesExactlyOne")
			if testing.Verbose() {
				for _, l := range strings.Split(string(out), "\n") {
					if strings.HasPrefix(strings.TrimSpace(l), "--- FAIL") {
						t.Log(strings.TrimSpace(l))
					}
				}
			}
		})
	}
}

// claimFirstDialect settles and claims in one call the naive way: claim, then settle. Rows
// whose lease expired while they were being published are claimed again by their holder,
// and its settle then finds them under another token.
type claimFirstDialect struct{ outbox.Dialect }

var _ dialect.SettleClaimer = claimFirstDialect{}

func (d claimFirstDialect) CompleteAndClaim(ctx context.Context, db *sql.DB, t dialect.Table, outcomes []outbox.Outcome, p dialect.ClaimParams) ([]outbox.Record, []uuid.UUID, error) {
	recs, err := d.Claim(ctx, db, t, p)
	if err != nil {
		return nil, nil, err
	}
	lost, err := d.Complete(ctx, db, t, outcomes)
	return recs, lost, err
}
