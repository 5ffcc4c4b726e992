package conformance_test

import (
	"bytes"
	"context"
	"database/sql"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

// Planted bugs of runs ([dialect.ClaimParams.Runs]): each claims the heads with the SQLite
// dialect, then takes the runs itself, with one mistake, in raw SQL on its table.

func init() {
	sqlite := func() full { return full{outbox.SQLite()} }
	kit = append(kit,
		mutant{name: "run-newest-first", db: "sqlite", dialect: brokenRunsDialect{sqlite(), runNewestFirst},
			mustFail: []string{"OrderedClaimer/RunsLimit"}, only: only("OrderedClaimer", "RunsLimit")},
		mutant{name: "run-past-dead", db: "sqlite", dialect: brokenRunsDialect{sqlite(), runPastDead},
			mustFail: []string{"OrderedClaimer/RunsStopAtDead"}, only: only("OrderedClaimer", "RunsStopAtDead")},
		mutant{name: "run-past-in-flight", db: "sqlite", dialect: brokenRunsDialect{sqlite(), runPastInFlight},
			mustFail: []string{"OrderedClaimer/RunsStopAtInFlight"}, only: only("OrderedClaimer", "RunsStopAtInFlight")},
		mutant{name: "run-past-not-due", db: "sqlite", dialect: brokenRunsDialect{sqlite(), runPastNotDue},
			mustFail: []string{"OrderedClaimer/RunsStopAtNotDue"}, only: only("OrderedClaimer", "RunsStopAtNotDue")},
		mutant{name: "run-share-only", db: "sqlite", dialect: brokenRunsDialect{sqlite(), runShareOnly},
			mustFail: []string{"OrderedClaimer/RunsFillBatch"}, only: only("OrderedClaimer", "RunsFillBatch")},
		mutant{name: "continue-after-put-back", db: "sqlite", dialect: brokenRunsDialect{sqlite(), continueAfterPutBack},
			mustFail: []string{"OrderedClaimer/RunsContinueOnlyDelivered"}, only: only("OrderedClaimer", "RunsContinueOnlyDelivered")},
	)
}

type runBug int

const (
	runNewestFirst       runBug = iota // reads the key's rows newest first: a cut run skips rows
	runPastDead                        // passes over a dead row as if OrderedSkipDead were set
	runPastInFlight                    // passes over a row in flight instead of stopping there
	runPastNotDue                      // passes over a row waiting for its retry
	runShareOnly                       // takes each key's share of the batch, never what others leave
	continueAfterPutBack               // with Continue, continues each key from its last settled row, whatever its status
)

// brokenRunsDialect claims runs with one of the bugs of runBug; continueAfterPutBack
// claims as SQLite does and breaks CompleteAndClaim instead.
type brokenRunsDialect struct {
	full
	bug runBug
}

func (d brokenRunsDialect) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]outbox.Record, error) {
	if !p.Ordered || !p.Runs || d.bug == continueAfterPutBack {
		return d.full.Claim(ctx, db, t, p)
	}
	heads := p
	heads.Runs = false
	recs, err := d.full.Claim(ctx, db, t, heads)
	if err != nil {
		return nil, err
	}
	run, err := d.runs(ctx, db, t, p, recs, p.Limit-len(recs))
	if err != nil {
		return nil, err
	}
	recs = append(recs, run...)
	dialect.SortClaimed(recs)
	return recs, nil
}

// CompleteAndClaim, with continueAfterPutBack and p.Continue, settles outcomes and takes
// the runs after each key's last settled row, whatever its status (a row put back for a
// retry is passed over), before it claims heads for the rest of the batch.
func (d brokenRunsDialect) CompleteAndClaim(ctx context.Context, db *sql.DB, t dialect.Table, outcomes []outbox.Outcome, p dialect.ClaimParams) ([]outbox.Record, []uuid.UUID, error) {
	if d.bug != continueAfterPutBack || !p.Ordered || !p.Runs || !p.Continue {
		return d.full.CompleteAndClaim(ctx, db, t, outcomes, p)
	}
	lost, err := d.Complete(ctx, db, t, outcomes)
	if err != nil {
		return nil, nil, err
	}
	last := map[[2]string]outbox.Record{}
	for _, o := range outcomes {
		r, err := d.Get(ctx, db, t, o.ID)
		if err != nil {
			return nil, nil, err
		}
		k := [2]string{r.Namespace, r.PartitionKey}
		l, seen := last[k]
		if r.PartitionKey != "" && (!seen || r.CreatedAt.After(l.CreatedAt) || r.CreatedAt.Equal(l.CreatedAt) && bytes.Compare(r.ID[:], l.ID[:]) > 0) {
			last[k] = r
		}
	}
	from := slices.Collect(maps.Values(last))
	dialect.SortClaimed(from)
	recs, err := d.runs(ctx, db, t, p, from, p.Limit)
	if err != nil {
		return nil, nil, err
	}
	if rest := p; len(recs) < p.Limit {
		rest.Limit -= len(recs)
		more, err := d.full.Claim(ctx, db, t, rest)
		if err != nil {
			return nil, nil, err
		}
		recs = append(recs, more...)
	}
	dialect.SortClaimed(recs)
	return recs, lost, nil
}

// runs leases, in raw SQL, up to left rows of the runs after the rows from, with d's bug.
func (d brokenRunsDialect) runs(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams, from []outbox.Record, left int) ([]outbox.Record, error) {
	now := time.Now().UnixMicro()
	share := left
	if d.bug == runShareOnly {
		keyed := 0
		for _, h := range from {
			if h.PartitionKey != "" {
				keyed++
			}
		}
		share = (left + max(keyed, 1) - 1) / max(keyed, 1)
	}
	var run []uuid.UUID
	for _, h := range from {
		if h.PartitionKey == "" || left <= 0 {
			continue
		}
		took := 0
		dir := ""
		if d.bug == runNewestFirst {
			dir = " DESC"
		}
		rows, err := db.QueryContext(ctx, `SELECT id, status, next_attempt_at FROM `+t.Name()+
			` WHERE namespace = ? AND partition_key = ? AND status IN ('pending', 'processing', 'dead')`+
			` AND (created_at > ? OR (created_at = ? AND id > ?)) ORDER BY created_at`+dir+`, id`+dir,
			h.Namespace, h.PartitionKey, h.CreatedAt.UnixMicro(), h.CreatedAt.UnixMicro(), h.ID[:])
		if err != nil {
			return nil, err
		}
		for rows.Next() && left > 0 {
			var (
				id     uuid.UUID
				status string
				due    int64
			)
			if err := rows.Scan(&id, &status, &due); err != nil {
				rows.Close()
				return nil, err
			}
			ok := status == "pending" && due <= now && took < share
			switch {
			case ok:
				took++
				run = append(run, id)
				left--
				continue
			case status == "dead" && (p.OrderedSkipDead || d.bug == runPastDead),
				status == "processing" && d.bug == runPastInFlight,
				status == "pending" && d.bug == runPastNotDue:
				continue
			}
			break
		}
		rows.Close()
	}
	if len(run) == 0 {
		return nil, nil
	}
	args := []any{p.WorkerID, now + p.Lease.Microseconds(), p.Token[:], now}
	for _, id := range run {
		args = append(args, id[:])
	}
	if _, err := db.ExecContext(ctx, `UPDATE `+t.Name()+` SET status = 'processing', attempts = attempts + 1, locked_by = ?,`+
		` locked_until = ?, lease_token = ?, updated_at = ? WHERE id IN (?`+strings.Repeat(", ?", len(run)-1)+`)`, args...); err != nil {
		return nil, err
	}
	var recs []outbox.Record
	for _, id := range run {
		r, err := d.Get(ctx, db, t, id)
		if err != nil {
			return nil, err
		}
		recs = append(recs, r)
	}
	return recs, nil
}
