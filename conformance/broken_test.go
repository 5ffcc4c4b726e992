package conformance_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"os"
	"slices"
	"strings"
	"testing"

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

func (d withAbilities) admin() dialect.Admin { return d.Dialect.(dialect.Admin) }

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

func (d withAbilities) DeadGroups(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.DeadGroupsParams) (dialect.DeadGroups, error) {
	return d.admin().DeadGroups(ctx, q, t, p)
}

func (d withAbilities) Activity(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ActivityParams) (dialect.ActivitySample, error) {
	return d.admin().Activity(ctx, q, t, p)
}

func (d withAbilities) GetByDedupeKey(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.DedupeKeyParams) (outbox.Record, error) {
	return d.admin().GetByDedupeKey(ctx, q, t, p)
}

func (d withAbilities) Purge(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.PurgeParams) (int64, error) {
	return d.admin().Purge(ctx, db, t, p)
}

// checks forwards the Checker of the dialect it wraps, which embedding the Dialect
// interface alone would hide from the engine's type assertions.
type checks struct{ outbox.Dialect }

func (d checks) checker() dialect.Checker { return d.Dialect.(dialect.Checker) }

func (d checks) Check(ctx context.Context, db *sql.DB, t dialect.Table) error {
	return d.checker().Check(ctx, db, t)
}

func (d checks) CheckFirstUse(ctx context.Context, drv driver.Driver, tx dialect.DBTX) error {
	return d.checker().CheckFirstUse(ctx, drv, tx)
}

func (d checks) CheckServer(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ServerParams) error {
	return d.checker().CheckServer(ctx, db, t, p)
}

func (d checks) ExplainError(err error, p dialect.ExplainParams) error {
	return d.checker().ExplainError(err, p)
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
type orderedSQLite struct{ checks }

func (d orderedSQLite) BlockedKeys(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.BlockedKeysParams) ([]outbox.BlockedKey, error) {
	return d.Dialect.(dialect.OrderedClaimer).BlockedKeys(ctx, q, t, p)
}

func (d orderedSQLite) CheckOrdered(ctx context.Context, db *sql.DB, t dialect.Table) error {
	return d.Dialect.(dialect.OrderedClaimer).CheckOrdered(ctx, db, t)
}

// columnBlindDialect's Check finds a missing table and a server of another kind, but takes
// a table that lacks a column for a ready one.
type columnBlindDialect struct{ checks }

func (d columnBlindDialect) Check(ctx context.Context, db *sql.DB, t dialect.Table) error {
	err := d.checks.Check(ctx, db, t)
	if err != nil && strings.Contains(err.Error(), "lacks column") {
		return nil
	}
	return err
}

// mutant is one planted bug: a broken dialect, the database it runs on, the conformance
// tests that must fail because of it, and optionally only, a -test.run pattern below
// TestBrokenDialectChild that limits its child to the sections where the bug can show
// (always with Enqueue/CommitLeavesExactlyOne, the healthy test that proves the harness
// works), to keep the kit's run short.
type mutant struct {
	name     string
	db       string // "sqlite", "postgres" or "mysql"
	dialect  outbox.Dialect
	mustFail []string
	only     string
}

// kit is every planted bug. The suite must fail on each, in the tests named.
var kit = []mutant{
	{name: "lease-blind", db: "sqlite", dialect: leaseBlindDialect{outbox.SQLite()},
		mustFail: []string{"Concurrency/NoDoubleClaim", "Lease/ExtendKeepsTheRow", "Claim/Fields"}},
	{name: "token-blind", db: "sqlite", dialect: tokenBlindDialect{outbox.SQLite()},
		mustFail: []string{"Lease/ExpiredLeaseIsReclaimed", "Settle/AckReportsOnlyLostRows"}},
	{name: "scope-blind", db: "sqlite", dialect: scopeBlindDialect{outbox.SQLite()},
		mustFail: []string{"Claim/BuryRespectsScope"}, only: only("Claim")},
	{name: "purge-all", db: "sqlite", dialect: purgeAllDialect{withAbilities{outbox.SQLite()}},
		mustFail: []string{"Admin/PurgeNeverTouchesLiveRows", "Admin/PurgeInBatches", "Admin/PurgeConcurrently"},
		only:     only("Admin", "PurgeNeverTouchesLiveRows", "PurgeInBatches", "PurgeConcurrently")},
	{name: "replay-any", db: "sqlite", dialect: replayAnyDialect{withAbilities{outbox.SQLite()}},
		mustFail: []string{"Admin/ReplayOnlyDeadRows", "Admin/ReplayedRowIsDelivered"}, only: only("Admin")},
	{name: "cursor-blind", db: "sqlite", dialect: cursorBlindDialect{withAbilities{outbox.SQLite()}},
		mustFail: []string{"Admin/ListDeadPages"}, only: only("Admin")},
	{name: "claim-first", db: "sqlite", dialect: claimFirstDialect{outbox.SQLite()},
		mustFail: []string{"SettleClaimer/ExpiredLeaseNotReclaimed"}, only: only("SettleClaimer")},
	{name: "order-blind", db: "sqlite", dialect: orderBlindDialect{outbox.SQLite()},
		mustFail: []string{"OrderedClaimer/HeadOnly", "OrderedClaimer/RetryHoldsKey", "OrderedClaimer/DeadHeadBlocks", "OrderedClaimer/SkipDead", "OrderedClaimer/Publishers"},
		only:     only("OrderedClaimer")},
	{name: "index-blind", db: "sqlite", dialect: indexBlindDialect{outbox.SQLite()},
		mustFail: []string{"OrderedClaimer/NeedsOrderedMigrations"}, only: only("OrderedClaimer", "NeedsOrderedMigrations")},
	{name: "stale-extend", db: "sqlite", dialect: staleExtendDialect{outbox.SQLite()},
		mustFail: []string{"Lease/ExtendKeepsTheRow"}, only: only("Lease")},
	{name: "ordered-check", db: "sqlite", dialect: passingOrderedCheckDialect{orderedSQLite{checks{outbox.SQLite()}}},
		mustFail: []string{"OrderedClaimer/NeedsOrderedMigrations"}, only: only("OrderedClaimer", "NeedsOrderedMigrations")},
	{name: "column-blind", db: "sqlite", dialect: columnBlindDialect{checks{outbox.SQLite()}},
		mustFail: []string{"Checker/MissingColumn"}, only: only("Checker")},
	{name: "refund-blind", db: "sqlite", dialect: refundBlindDialect{outbox.SQLite()},
		mustFail: []string{"Settle/UnavailableRefundsAttempt", "Settle/UnavailableNeverDies", "SettleClaimer/UnavailableRefundsAttempt"},
		only:     only("Settle|SettleClaimer")},
}

// only returns a pattern for mutant.only: the sections named (a regexp alternation), with
// the tests named when any.
func only(sections string, tests ...string) string {
	if len(tests) == 0 {
		return "^(Enqueue|" + sections + ")$"
	}
	return "^(Enqueue|" + sections + ")$/^(CommitLeavesExactlyOne|" + strings.Join(tests, "|") + ")$"
}

// TestBrokenDialectChild runs the suite against one broken dialect; it does something
// only when re-executed by TestSuiteCatchesBrokenDialects.
func TestBrokenDialectChild(t *testing.T) {
	name := os.Getenv("OUTBOX_BROKEN_DIALECT")
	if name == "" {
		t.Skip("run by TestSuiteCatchesBrokenDialects")
	}
	i := slices.IndexFunc(kit, func(m mutant) bool { return m.name == name })
	require.GreaterOrEqual(t, i, 0, "no mutant %q", name)
	m := kit[i]
	h := conformance.Harness{Dialect: m.dialect}
	switch m.db {
	case "sqlite":
		h.OpenDB = func(t testing.TB) *sql.DB { return testdb.SQLite(t) }
		h.OtherServer = func(t testing.TB) *sql.DB { return testdb.Postgres(t) }
		h.DSN = func(t testing.TB, db *sql.DB) (string, string) { return "sqlite", testdb.DSN(t, "sqlite", db) }
	case "postgres":
		h.OpenDB = func(t testing.TB) *sql.DB { return testdb.Postgres(t) }
		h.OtherServer = func(t testing.TB) *sql.DB { return testdb.SQLite(t) }
		h.Reopen = testdb.Reopen
		h.DSN = func(t testing.TB, db *sql.DB) (string, string) { return "pgx", testdb.DSN(t, "postgres", db) }
	case "mysql":
		h.OpenDB = func(t testing.TB) *sql.DB { return testdb.MySQL(t) }
		h.OtherServer = func(t testing.TB) *sql.DB { return testdb.SQLite(t) }
		h.Reopen = testdb.Reopen
		h.DSN = func(t testing.TB, db *sql.DB) (string, string) { return "mysql", testdb.DSN(t, "mysql", db) }
	default:
		t.Fatalf("mutant %s: unknown database %q", m.name, m.db)
	}
	conformance.Run(t, h)
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
