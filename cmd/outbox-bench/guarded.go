package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// The guarded raw loop is a hand-written relay that keeps the library's guarantees: its
// claim returns every column a publisher needs (those the library's Record holds), it checks
// each payload against the SHA-256 taken at enqueue, and its ack changes only rows still
// processing under the claim's lease token, and checks that all of them did. Beside the
// plain raw loop (which does none of that) and the Publisher, it separates the price of the
// guarantees (raw ÷ guarded) from the overhead the library could still remove (Publisher ÷
// guarded).

// kindGuardedRaw is the guarded raw loop's burn-down kind.
const kindGuardedRaw = "guarded raw"

// fullColumns are the columns a publisher needs of a claimed row: the library's Record.
var fullColumns = []string{
	"id", "namespace", "topic", "tenant_id", "dedupe_key", "partition_key", "headers",
	"payload", "payload_hash", "status", "attempts", "next_attempt_at", "locked_by",
	"locked_until", "lease_token", "last_error", "created_at", "updated_at", "delivered_at",
	"replays",
}

// fullList is fullColumns as a select list, each name after prefix.
func fullList(prefix string) string {
	return prefix + strings.Join(fullColumns, ", "+prefix)
}

// errHash is a payload that does not match its hash.
var errHash = errors.New("payload does not match its hash")

// scanFull scans one row of fullColumns, the id into id, and checks its payload against
// its hash. Columns a relay would only pass on are scanned as the driver gives them.
func scanFull(rows *sql.Rows, id any) error {
	var (
		payload, hash []byte
		rest          [fullCount - 3]any
		dest          [fullCount]any
	)
	j := 0
	for i, c := range fullColumns {
		switch c {
		case "id":
			dest[i] = id
		case "payload":
			dest[i] = &payload
		case "payload_hash":
			dest[i] = &hash
		default:
			dest[i] = &rest[j]
			j++
		}
	}
	if err := rows.Scan(dest[:]...); err != nil {
		return err
	}
	if sum := sha256.Sum256(payload); !bytes.Equal(sum[:], hash) {
		return errHash
	}
	return nil
}

// fullCount is len(fullColumns), as a constant for scanFull's arrays.
const fullCount = 20

func init() {
	if len(fullColumns) != fullCount {
		panic("fullCount must be len(fullColumns)")
	}
}

// guardedStep is one step of the guarded raw loop.
func guardedStep(ctx context.Context, r rawOps, db *sql.DB, batch int, worker string) (int, error) {
	c, err := r.claimFull(ctx, db, batch, worker)
	if err != nil || len(c.ids) == 0 {
		return 0, err
	}
	n, err := r.ackGuarded(ctx, db, c.ids, c.token)
	if err == nil && n != len(c.ids) {
		err = fmt.Errorf("guarded ack settled %d of %d rows", n, len(c.ids))
	}
	return len(c.ids), err
}

// guardedResult is the guarded scenario: the raw loop, the guarded raw loop and the
// Publisher on the same rows, alternated.
type guardedResult struct {
	Batch   int    `json:"batch"`
	Workers int    `json:"workers"`
	N       int    `json:"n"`
	Raw     sample `json:"raw"`
	Guarded sample `json:"guarded_raw"`
	Library sample `json:"library"`
	// LibraryVsGuarded is the overhead the library could remove; GuardedVsRaw the price of
	// the guarantees; LibraryVsRaw the burn-down ratio measured in the same run.
	LibraryVsGuarded float64 `json:"library_vs_guarded_raw"`
	GuardedVsRaw     float64 `json:"guarded_raw_vs_raw"`
	LibraryVsRaw     float64 `json:"library_vs_raw"`
}

func runGuarded(ctx context.Context, cfg config, b backend, res *backendResult) error {
	spec := drainSpec{table: mainTable, n: min(cfg.BurnN, cfg.GuardN), batch: cfg.Batch, workers: cfg.Workers}
	kinds := []string{kindRaw, kindGuardedRaw, "library"}
	warm := spec
	warm.n = min(spec.n, 2000)
	if _, err := drainKinds(ctx, b, warm, 1, kinds...); err != nil {
		return err
	}
	runs, err := drainKinds(ctx, b, spec, cfg.GuardRounds, kinds...)
	if err != nil {
		return err
	}
	raw, guarded, lib := rates(runs[kindRaw]), rates(runs[kindGuardedRaw]), rates(runs["library"])
	g := &guardedResult{Batch: spec.batch, Workers: spec.workers, N: spec.n,
		Raw: summarize(raw), Guarded: summarize(guarded), Library: summarize(lib),
		LibraryVsGuarded: pairedRatio(lib, guarded), GuardedVsRaw: pairedRatio(guarded, raw), LibraryVsRaw: pairedRatio(lib, raw)}
	logf("%s: guarded b=%d w=%d n=%d: raw %.0f, guarded raw %.0f, library %.0f rows/s; library/guarded %.3f (pairs %s), guarded/raw %.3f, library/raw %.3f",
		b.name(), g.Batch, g.Workers, g.N, g.Raw.Median, g.Guarded.Median, g.Library.Median,
		g.LibraryVsGuarded, pairRatios(lib, guarded), g.GuardedVsRaw, g.LibraryVsRaw)
	res.Guarded = g
	return nil
}
