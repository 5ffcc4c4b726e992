package conformance_test

import (
	"context"
	"database/sql"
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
	)
}

type runBug int

const (
	runNewestFirst  runBug = iota // reads the key's rows newest first: a cut run skips rows
	runPastDead                   // passes over a dead row as if OrderedSkipDead were set
	runPastInFlight               // passes over a row in flight instead of stopping there
	runPastNotDue                 // passes over a row waiting for its retry
	runShareOnly                  // takes each key's share of the batch, never what others leave
)

// brokenRunsDialect claims runs with one of the bugs of runBug.
type brokenRunsDialect struct {
	full
	bug runBug
}

func (d brokenRunsDialect) Claim(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ClaimParams) ([]outbox.Record, error) {
	if !p.Ordered || !p.Runs {
		return d.full.Claim(ctx, db, t, p)
	}
	heads := p
	heads.Runs = false
	recs, err := d.full.Claim(ctx, db, t, heads)
	if err != nil {
		return nil, err
	}
	now := time.Now().UnixMicro()
	left := p.Limit - len(recs)
	share := left
	if d.bug == runShareOnly {
		keyed := 0
		for _, h := range recs {
			if h.PartitionKey != "" {
				keyed++
			}
		}
		share = (left + max(keyed, 1) - 1) / max(keyed, 1)
	}
	var run []uuid.UUID
	for _, h := range recs {
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
		return recs, nil
	}
	args := []any{p.WorkerID, now + p.Lease.Microseconds(), p.Token[:], now}
	for _, id := range run {
		args = append(args, id[:])
	}
	if _, err := db.ExecContext(ctx, `UPDATE `+t.Name()+` SET status = 'processing', attempts = attempts + 1, locked_by = ?,`+
		` locked_until = ?, lease_token = ?, updated_at = ? WHERE id IN (?`+strings.Repeat(", ?", len(run)-1)+`)`, args...); err != nil {
		return nil, err
	}
	for _, id := range run {
		r, err := d.Get(ctx, db, t, id)
		if err != nil {
			return nil, err
		}
		recs = append(recs, r)
	}
	dialect.SortClaimed(recs)
	return recs, nil
}
