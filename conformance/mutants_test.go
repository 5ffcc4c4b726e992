package conformance_test

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

// More planted bugs for the kit, each one small wrapper of a built-in dialect through the
// public dialect interfaces. Most wrap SQLite (fast, in process); those whose bug only a
// database of another kind can show wrap PostgreSQL.

func init() {
	sqlite := func() full { return full{outbox.SQLite()} }
	pg := func() full { return full{outbox.Postgres()} }
	kit = append(kit,
		// The bugs the suite once let through.
		mutant{name: "no-sort", db: "postgres", dialect: idOrderDialect{pg()},
			mustFail: []string{"Claim/OrderIsNotIDOrder"}, only: only("Claim")},
		mutant{name: "second-clock", db: "sqlite", dialect: tickTieDialect{sqlite()},
			mustFail: []string{"Settle/UpdatedAtAdvancesWithinATick"}, only: only("Settle")},
		mutant{name: "tx-tie", db: "sqlite", dialect: txTieDialect{sqlite()},
			mustFail: []string{"SettleClaimer/RetryClaimedAgainAdvances"}, only: only("SettleClaimer")},
		mutant{name: "total-blind", db: "sqlite", dialect: totalBlindDialect{sqlite()},
			mustFail: []string{"Admin/StatsDeliveredSample"}, only: only("Admin")},
		// Claims.
		mutant{name: "due-blind", db: "sqlite", dialect: dueBlindDialect{sqlite()},
			mustFail: []string{"Enqueue/DelayedDelivery", "Settle/NackBackoffWithinJitterBounds"}, only: only("Settle")},
		mutant{name: "creation-order", db: "postgres", dialect: creationOrderDialect{pg()},
			mustFail: []string{"Claim/DueOrder"}, only: only("Claim", "DueOrder")},
		mutant{name: "limit-blind", db: "sqlite", dialect: limitBlindDialect{sqlite()},
			mustFail: []string{"Claim/Order"}, only: only("Claim")},
		mutant{name: "attempts-blind", db: "sqlite", dialect: attemptsBlindDialect{sqlite()},
			mustFail: []string{"Claim/AttemptLimitExcludes", "Claim/ExpiredLeaseAtLimitIsNotReclaimed"}, only: only("Claim")},
		mutant{name: "topic-blind", db: "sqlite", dialect: topicBlindDialect{sqlite()},
			mustFail: []string{"Claim/Scope"}, only: only("Claim")},
		mutant{name: "headers-fail-claim", db: "sqlite", dialect: headersFailDialect{sqlite()},
			mustFail: []string{"Claim/DamagedRowsFailOnlyThemselves"}, only: only("Claim")},
		mutant{name: "skip-dead-head", db: "sqlite", dialect: skipDeadHeadDialect{sqlite()},
			mustFail: []string{"OrderedClaimer/DeadHeadBlocks"}, only: only("OrderedClaimer")},
		// Settling, leases, sweeps.
		mutant{name: "extend-token-blind", db: "sqlite", dialect: extendTokenBlindDialect{sqlite()},
			mustFail: []string{"Lease/ExpiredLeaseIsReclaimed"}, only: only("Lease")},
		mutant{name: "delivered-at-blind", db: "sqlite", dialect: deliveredAtBlindDialect{sqlite()},
			mustFail: []string{"Settle/Ack"}, only: only("Settle")},
		mutant{name: "error-blind", db: "sqlite", dialect: errorBlindDialect{sqlite()},
			mustFail: []string{"Settle/NackRetryAfter", "Settle/MixedBatchInOneCall"}, only: only("Settle")},
		mutant{name: "refund-always", db: "sqlite", dialect: refundAlwaysDialect{sqlite()},
			mustFail: []string{"Settle/UnavailableRefundsAttempt"}, only: only("Settle")},
		mutant{name: "bury-live", db: "sqlite", dialect: buryLiveDialect{sqlite()},
			mustFail: []string{"Claim/BuryExhausted"}, only: only("Claim")},
		mutant{name: "bury-reason-blind", db: "sqlite", dialect: buryReasonBlindDialect{sqlite()},
			mustFail: []string{"Claim/BuryExhausted"}, only: only("Claim")},
		// Reads, inserts.
		mutant{name: "get-local-time", db: "sqlite", dialect: localTimeDialect{sqlite()},
			mustFail: []string{"Claim/Fields"}, only: only("Claim")},
		mutant{name: "duplicate-as-inserted", db: "sqlite", dialect: duplicateAsInsertedDialect{sqlite()},
			mustFail: []string{"Dedupe/SecondIsAlreadyEnqueued", "Dedupe/WithinOneBatch"}, only: only("Dedupe")},
		mutant{name: "insert-aborts-tx", db: "postgres", dialect: abortingInsertDialect{pg()},
			mustFail: []string{"Dedupe/SecondIsAlreadyEnqueued"}, only: only("Dedupe")},
		// Abilities.
		mutant{name: "purge-processing", db: "sqlite", dialect: purgeProcessingDialect{sqlite()},
			mustFail: []string{"Admin/PurgeNeverTouchesLiveRows"}, only: only("Admin", "PurgeNeverTouchesLiveRows")},
		mutant{name: "replay-keeps-attempts", db: "sqlite", dialect: replayKeepsAttemptsDialect{sqlite()},
			mustFail: []string{"Admin/ReplayOnlyDeadRows"}, only: only("Admin")},
		mutant{name: "discard-any", db: "sqlite", dialect: discardAnyDialect{sqlite()},
			mustFail: []string{"Admin/DiscardOnlyDeadRows"}, only: only("Admin")},
		mutant{name: "check-blind", db: "sqlite", dialect: checkBlindDialect{sqlite()},
			mustFail: []string{"Checker/MissingTable", "Checker/OtherServer"}, only: only("Checker")},
	)
}

// full forwards every optional ability of the dialect it wraps but Notifier, which
// embedding the Dialect interface alone would hide from the engine; a mutant embeds it and
// overrides one method.
type full struct{ outbox.Dialect }

func (d full) checker() dialect.Checker { return d.Dialect.(dialect.Checker) }

func (d full) Check(ctx context.Context, db *sql.DB, t dialect.Table) error {
	return d.checker().Check(ctx, db, t)
}

func (d full) CheckFirstUse(ctx context.Context, drv driver.Driver, tx dialect.DBTX) error {
	return d.checker().CheckFirstUse(ctx, drv, tx)
}

func (d full) CheckServer(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ServerParams) error {
	return d.checker().CheckServer(ctx, db, t, p)
}

func (d full) ExplainError(err error, p dialect.ExplainParams) error {
	return d.checker().ExplainError(err, p)
}

func (d full) CompleteAndClaim(ctx context.Context, db *sql.DB, t dialect.Table, outcomes []outbox.Outcome, p dialect.ClaimParams) ([]outbox.Record, []uuid.UUID, error) {
	return d.Dialect.(dialect.SettleClaimer).CompleteAndClaim(ctx, db, t, outcomes, p)
}

func (d full) BlockedKeys(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.BlockedKeysParams) ([]outbox.BlockedKey, error) {
	return d.Dialect.(dialect.OrderedClaimer).BlockedKeys(ctx, q, t, p)
}

func (d full) CheckOrdered(ctx context.Context, db *sql.DB, t dialect.Table) error {
	return d.Dialect.(dialect.OrderedClaimer).CheckOrdered(ctx, db, t)
}

func (d full) Purge(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.PurgeParams) (int64, error) {
	return d.admin().Purge(ctx, db, t, p)
}

func (d full) admin() dialect.Admin { return d.Dialect.(dialect.Admin) }

func (d full) Stats(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.StatsParams) (dialect.StatsSample, error) {
	return d.admin().Stats(ctx, q, t, p)
}

func (d full) ListDead(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ListDeadParams) ([]outbox.Record, error) {
	return d.admin().ListDead(ctx, q, t, p)
}

func (d full) Replay(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ReplayParams) ([]uuid.UUID, error) {
	return d.admin().Replay(ctx, db, t, p)
}

func (d full) Discard(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.DiscardParams) ([]uuid.UUID, error) {
	return d.admin().Discard(ctx, db, t, p)
}

func (d full) DeadGroups(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.DeadGroupsParams) (dialect.DeadGroups, error) {
	return d.admin().DeadGroups(ctx, q, t, p)
}

func (d full) Activity(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ActivityParams) (dialect.ActivitySample, error) {
	return d.admin().Activity(ctx, q, t, p)
}

func (d full) GetByDedupeKey(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.DedupeKeyParams) (outbox.Record, error) {
	return d.admin().GetByDedupeKey(ctx, q, t, p)
}

// idOrderDialect returns its claims in the ids' order, as an UPDATE ... RETURNING that
// meets the rows through the primary key does, instead of sorting them (dialect.SortClaimed).
type idOrderDialect struct{ full }

func (d idOrderDialect) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]outbox.Record, error) {
	recs, err := d.full.Claim(ctx, db, t, p)
	slices.SortFunc(recs, func(a, b outbox.Record) int { return bytes.Compare(a.ID[:], b.ID[:]) })
	return recs, err
}

// restamp sets updated_at (and the times written with it) of the SQLite rows ids to the
// start of their second, as a dialect that stamps changes with SQLite's CURRENT_TIMESTAMP
// or datetime('now') alone (a second's resolution) would write them: two changes within
// one tick tie.
func restamp(ctx context.Context, q dialect.DBTX, t dialect.Table, ids []uuid.UUID) error {
	for _, id := range ids {
		if _, err := q.ExecContext(ctx, `UPDATE `+t.Name()+` SET
			locked_until = locked_until - updated_at % 1000000, delivered_at = delivered_at - updated_at % 1000000,
			updated_at = updated_at - updated_at % 1000000 WHERE id = ?`, id[:]); err != nil {
			return err
		}
	}
	return nil
}

// reread returns the records ids as stored, in the order given.
func reread(ctx context.Context, d outbox.Dialect, q dialect.DBTX, t dialect.Table, ids []uuid.UUID) ([]outbox.Record, error) {
	out := make([]outbox.Record, len(ids))
	for i, id := range ids {
		r, err := d.Get(ctx, q, t, id)
		if err != nil {
			return nil, err
		}
		out[i] = r
	}
	return out, nil
}

func recIDs(recs []outbox.Record) []uuid.UUID {
	out := make([]uuid.UUID, len(recs))
	for i, r := range recs {
		out[i] = r.ID
	}
	return out
}

func outcomeIDs(outcomes []outbox.Outcome) []uuid.UUID {
	out := make([]uuid.UUID, len(outcomes))
	for i, o := range outcomes {
		out[i] = o.ID
	}
	return out
}

// tickTieDialect stamps every change with a clock of a second's resolution, without moving
// past the row's updated_at: changes within one tick tie.
type tickTieDialect struct{ full }

func (d tickTieDialect) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]outbox.Record, error) {
	recs, err := d.full.Claim(ctx, db, t, p)
	if err != nil || len(recs) == 0 {
		return recs, err
	}
	if err := restamp(ctx, db, t, recIDs(recs)); err != nil {
		return nil, err
	}
	return reread(ctx, d, db, t, recIDs(recs))
}

func (d tickTieDialect) Complete(ctx context.Context, q dialect.DBTX, t dialect.Table, outcomes []outbox.Outcome) ([]uuid.UUID, error) {
	lost, err := d.full.Complete(ctx, q, t, outcomes)
	if err != nil {
		return nil, err
	}
	return lost, restamp(ctx, q, t, outcomeIDs(outcomes))
}

func (d tickTieDialect) Extend(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ExtendParams) ([]uuid.UUID, error) {
	lost, err := d.full.Extend(ctx, q, t, p)
	if err != nil {
		return nil, err
	}
	ids := make([]uuid.UUID, len(p.Leases))
	for i, l := range p.Leases {
		ids[i] = l.ID
	}
	return lost, restamp(ctx, q, t, ids)
}

func (d tickTieDialect) CompleteAndClaim(ctx context.Context, db *sql.DB, t dialect.Table, outcomes []outbox.Outcome, p dialect.ClaimParams) ([]outbox.Record, []uuid.UUID, error) {
	recs, lost, err := d.full.CompleteAndClaim(ctx, db, t, outcomes, p)
	if err != nil {
		return nil, nil, err
	}
	if err := restamp(ctx, db, t, append(outcomeIDs(outcomes), recIDs(recs)...)); err != nil {
		return nil, nil, err
	}
	recs, err = reread(ctx, d, db, t, recIDs(recs))
	return recs, lost, err
}

// txTieDialect settles and claims in one call as two steps, and stamps the claim of a row
// it just settled with the settle's time: the transaction's one now, for both changes.
type txTieDialect struct{ full }

func (d txTieDialect) CompleteAndClaim(ctx context.Context, db *sql.DB, t dialect.Table, outcomes []outbox.Outcome, p dialect.ClaimParams) ([]outbox.Record, []uuid.UUID, error) {
	recs, lost, err := d.full.CompleteAndClaim(ctx, db, t, outcomes, p)
	if err != nil {
		return nil, nil, err
	}
	for _, r := range recs {
		if !slices.Contains(outcomeIDs(outcomes), r.ID) {
			continue
		}
		// The settle wrote next_attempt_at = now + 0: the claim writes that same now.
		if _, err := db.ExecContext(ctx, `UPDATE `+t.Name()+` SET updated_at = next_attempt_at,
			locked_until = next_attempt_at + (locked_until - updated_at) WHERE id = ?`, r.ID[:]); err != nil {
			return nil, nil, err
		}
	}
	recs, err = reread(ctx, d, db, t, recIDs(recs))
	return recs, lost, err
}

// totalBlindDialect never estimates the table's delivered rows.
type totalBlindDialect struct{ full }

func (d totalBlindDialect) Stats(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.StatsParams) (dialect.StatsSample, error) {
	s, err := d.full.Stats(ctx, q, t, p)
	s.DeliveredTotal = 0
	return s, err
}

// dueBlindDialect claims pending rows whether or not they are due: next_attempt_at ignored.
type dueBlindDialect struct{ full }

func (d dueBlindDialect) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]outbox.Record, error) {
	if _, err := db.ExecContext(ctx, `UPDATE `+t.Name()+` SET next_attempt_at = 0 WHERE status = 'pending'`); err != nil {
		return nil, err
	}
	return d.full.Claim(ctx, db, t, p)
}

// limitBlindDialect claims one row more than asked.
type limitBlindDialect struct{ full }

func (d limitBlindDialect) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]outbox.Record, error) {
	p.Limit++
	return d.full.Claim(ctx, db, t, p)
}

// creationOrderDialect claims the due rows in the order they were created, as the claim
// index's walk did before the due index: PostgreSQL's ordered claim without a namespace is
// that walk, and rows without a partition key pass its head check.
type creationOrderDialect struct{ full }

func (d creationOrderDialect) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]outbox.Record, error) {
	if p.Namespace == "" {
		p.Ordered = true
	}
	return d.full.Claim(ctx, db, t, p)
}

// attemptsBlindDialect claims rows whatever their attempts.
type attemptsBlindDialect struct{ full }

func (d attemptsBlindDialect) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]outbox.Record, error) {
	p.MaxAttempts = 1 << 30
	return d.full.Claim(ctx, db, t, p)
}

// topicBlindDialect claims in the namespace and tenant asked, but any topic.
type topicBlindDialect struct{ full }

func (d topicBlindDialect) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]outbox.Record, error) {
	p.Topics = nil
	return d.full.Claim(ctx, db, t, p)
}

// headersFailDialect fails the whole claim when one row's headers do not decode.
type headersFailDialect struct{ full }

func (d headersFailDialect) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]outbox.Record, error) {
	recs, err := d.full.Claim(ctx, db, t, p)
	for _, r := range recs {
		if r.HeadersErr != nil {
			return nil, r.HeadersErr
		}
	}
	return recs, err
}

// skipDeadHeadDialect's ordered claims always skip a dead head, as if OrderedSkipDead were
// set: a dead event no longer holds its key back.
type skipDeadHeadDialect struct{ full }

func (d skipDeadHeadDialect) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]outbox.Record, error) {
	p.OrderedSkipDead = p.Ordered
	return d.full.Claim(ctx, db, t, p)
}

// extendTokenBlindDialect extends leases without checking their token: a stale holder
// keeps a row that another worker reclaimed.
type extendTokenBlindDialect struct{ full }

func (d extendTokenBlindDialect) Extend(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.ExtendParams) ([]uuid.UUID, error) {
	p.Leases = slices.Clone(p.Leases)
	for i, l := range p.Leases {
		var token []byte
		if err := q.QueryRowContext(ctx, `SELECT lease_token FROM `+t.Name()+` WHERE id = ?`, l.ID[:]).Scan(&token); err == nil {
			copy(p.Leases[i].Token[:], token)
		}
	}
	return d.full.Extend(ctx, q, t, p)
}

// deliveredAtBlindDialect acks without setting delivered_at.
type deliveredAtBlindDialect struct{ full }

func (d deliveredAtBlindDialect) Complete(ctx context.Context, q dialect.DBTX, t dialect.Table, outcomes []outbox.Outcome) ([]uuid.UUID, error) {
	lost, err := d.full.Complete(ctx, q, t, outcomes)
	if err != nil {
		return nil, err
	}
	_, err = q.ExecContext(ctx, `UPDATE `+t.Name()+` SET delivered_at = NULL WHERE status = 'delivered'`)
	return lost, err
}

// errorBlindDialect records no last_error for a retry.
type errorBlindDialect struct{ full }

func (d errorBlindDialect) Complete(ctx context.Context, q dialect.DBTX, t dialect.Table, outcomes []outbox.Outcome) ([]uuid.UUID, error) {
	outcomes = slices.Clone(outcomes)
	for i := range outcomes {
		if outcomes[i].Status == outbox.StatusPending {
			outcomes[i].Error = ""
		}
	}
	return d.full.Complete(ctx, q, t, outcomes)
}

// refundAlwaysDialect gives back the attempt of every retry, not only of an outage: a
// message that fails forever is never dead-lettered.
type refundAlwaysDialect struct{ full }

func (d refundAlwaysDialect) Complete(ctx context.Context, q dialect.DBTX, t dialect.Table, outcomes []outbox.Outcome) ([]uuid.UUID, error) {
	outcomes = slices.Clone(outcomes)
	for i := range outcomes {
		outcomes[i].RefundAttempt = outcomes[i].Status == outbox.StatusPending
	}
	return d.full.Complete(ctx, q, t, outcomes)
}

// buryLiveDialect buries exhausted rows under a live lease too: a worker's last attempt is
// dead-lettered while it is still being published.
type buryLiveDialect struct{ full }

func (d buryLiveDialect) Bury(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.BuryParams) ([]uuid.UUID, error) {
	if _, err := q.ExecContext(ctx, `UPDATE `+t.Name()+` SET locked_until = 0 WHERE status = 'processing' AND attempts >= ?`, p.MaxAttempts); err != nil {
		return nil, err
	}
	return d.full.Bury(ctx, q, t, p)
}

// buryReasonBlindDialect buries without recording why.
type buryReasonBlindDialect struct{ full }

func (d buryReasonBlindDialect) Bury(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.BuryParams) ([]uuid.UUID, error) {
	p.Reason = ""
	return d.full.Bury(ctx, q, t, p)
}

// localTimeDialect's Get returns times in the zone of the process, not in UTC.
type localTimeDialect struct{ full }

var elsewhere = time.FixedZone("UTC+2", 2*60*60)

func (d localTimeDialect) Get(ctx context.Context, q dialect.DBTX, t dialect.Table, id uuid.UUID) (outbox.Record, error) {
	r, err := d.full.Get(ctx, q, t, id)
	for _, ts := range []*time.Time{&r.CreatedAt, &r.UpdatedAt, &r.NextAttemptAt, &r.LockedUntil, &r.DeliveredAt} {
		if !ts.IsZero() {
			*ts = ts.In(elsewhere)
		}
	}
	return r, err
}

// duplicateAsInsertedDialect skips a conflicting row (ON CONFLICT DO NOTHING) but reports
// every row as inserted, never looking at what the statement did: the producer is told its
// duplicate was enqueued, with an id no row has.
type duplicateAsInsertedDialect struct{ full }

func (d duplicateAsInsertedDialect) Insert(ctx context.Context, q dialect.DBTX, t dialect.Table, rows []dialect.Row) ([]bool, error) {
	inserted, err := d.full.Insert(ctx, q, t, rows)
	for i := range inserted {
		inserted[i] = true
	}
	return inserted, err
}

// abortingInsertDialect reports a duplicate as the dialect should, but the way it found
// out (a plain INSERT whose unique violation it caught) aborted the caller's PostgreSQL
// transaction: the caller's next statement and its commit fail.
type abortingInsertDialect struct{ full }

func (d abortingInsertDialect) Insert(ctx context.Context, q dialect.DBTX, t dialect.Table, rows []dialect.Row) ([]bool, error) {
	inserted, err := d.full.Insert(ctx, q, t, rows)
	if err == nil && slices.Contains(inserted, false) {
		_, _ = q.ExecContext(ctx, `SELECT 1/0`) // the swallowed error; the transaction is now aborted
	}
	return inserted, err
}

// purgeProcessingDialect purges by age alone among the rows it should keep too: old
// processing rows (a lease held since before the cut-off) go with the delivered ones.
type purgeProcessingDialect struct{ full }

func (d purgeProcessingDialect) Purge(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.PurgeParams) (int64, error) {
	n, err := d.full.Purge(ctx, db, t, p)
	if err != nil {
		return 0, err
	}
	res, err := db.ExecContext(ctx, `DELETE FROM `+t.Name()+` WHERE status = 'processing' AND updated_at < ?`,
		time.Now().Add(-p.OlderThan).UnixMicro())
	if err != nil {
		return 0, err
	}
	m, err := res.RowsAffected()
	return n + m, err
}

// replayKeepsAttemptsDialect replays dead rows with the attempts they died with: a row
// that died at the attempt limit is never claimable again.
type replayKeepsAttemptsDialect struct{ full }

func (d replayKeepsAttemptsDialect) Replay(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ReplayParams) ([]uuid.UUID, error) {
	attempts := map[uuid.UUID]int{}
	for _, id := range p.IDs {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT attempts FROM `+t.Name()+` WHERE id = ?`, id[:]).Scan(&n); err == nil {
			attempts[id] = n
		}
	}
	ids, err := d.full.Replay(ctx, db, t, p)
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		if _, err := db.ExecContext(ctx, `UPDATE `+t.Name()+` SET attempts = ? WHERE id = ?`, attempts[id], id[:]); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// discardAnyDialect deletes the rows asked whatever their state.
type discardAnyDialect struct{ full }

func (discardAnyDialect) Discard(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.DiscardParams) ([]uuid.UUID, error) {
	var out []uuid.UUID
	for _, id := range p.IDs {
		res, err := db.ExecContext(ctx, `DELETE FROM `+t.Name()+` WHERE id = ?`, id[:])
		if err != nil {
			return nil, err
		}
		if n, _ := res.RowsAffected(); n == 1 {
			out = append(out, id)
		}
	}
	return out, nil
}

// checkBlindDialect's Check passes whatever it is given, as long as the server answers.
type checkBlindDialect struct{ full }

func (checkBlindDialect) Check(ctx context.Context, db *sql.DB, _ dialect.Table) error {
	return db.PingContext(ctx)
}
