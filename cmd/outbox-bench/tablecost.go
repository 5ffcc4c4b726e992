package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
)

// tableVariant is one table of the table-cost scenario: the library's table with some
// secondary indexes dropped, the library's table with the ordered migration set, or the
// lean table.
type tableVariant struct {
	name  string
	label string
	// drop names the indexes dropped from the library's table (backend.dropIndex).
	drop []string
	// ordered adds the ordered migration set (the order index) to the library's table: what
	// a user of ordered publishers opts into.
	ordered bool
	// lean is the nine-column table with the claim index only (backend.createLean).
	lean bool
}

var tableVariants = []tableVariant{
	{name: "ours", label: "library table (base migrations)"},
	{name: "ordered", label: "with the ordered set (order index, opt in)", ordered: true},
	{name: "no_dedupe", label: "without the dedupe index", drop: []string{"dedupe"}},
	{name: "no_retention", label: "without the retention index", drop: []string{"retention"}},
	{name: "claim_only", label: "claim index only (both dropped)", drop: []string{"dedupe", "retention"}},
	{name: "lean", label: "lean table: 9 columns, claim index only", lean: true},
}

// tableCostVariant is what one table variant measured, and its paired ratios to the
// library's table ("ours"): a ratio above 1 is what the table loses to what the variant
// lacks.
type tableCostVariant struct {
	Name    string   `json:"name"`
	Label   string   `json:"label"`
	Table   string   `json:"table"`
	Dropped []string `json:"dropped,omitempty"`
	// Ordered is the library's table with the ordered migration set: it adds to ours
	// where the others take away, so its ratios to ours are below 1 by what it costs.
	Ordered bool `json:"ordered,omitempty"`
	// Drain is the raw claim + ack loop's rows/s; Enqueue transactions/s of a business row
	// plus one raw outbox insert at EnqueueConc; Batch rows/s of 100-row raw inserts, one
	// producer.
	Drain   sample `json:"drain"`
	Enqueue sample `json:"enqueue"`
	Batch   sample `json:"batch_enqueue"`
	// Variant ÷ ours, paired by round.
	DrainVsOurs   float64 `json:"drain_vs_ours"`
	EnqueueVsOurs float64 `json:"enqueue_vs_ours"`
	BatchVsOurs   float64 `json:"batch_enqueue_vs_ours"`
	// Work is what the server reports doing for the statements, where it can tell
	// (workMeter): unlike the rates, it does not depend on the machine's other load.
	Work *tableWork `json:"work,omitempty"`
}

// workMeter is a backend that can count the server's work for single statements.
type workMeter interface {
	// statementWork loads n pending rows into table and measures repeats claims of batch
	// rows, the ack of each, and repeats inserts of batch rows, through r.
	statementWork(ctx context.Context, table string, r relay, n, batch, repeats int) (*tableWork, error)
}

// stmtWork sums what the server did for one kind of statement.
type stmtWork struct {
	Statements int `json:"statements"`
	Rows       int `json:"rows"`
	// WALRecords counts WAL records on PostgreSQL, and on SQLite the pages (frames) the
	// commits appended to the WAL.
	WALRecords float64 `json:"wal_records"`
	WALBytes   float64 `json:"wal_bytes"`
	// WALFPI counts PostgreSQL's full-page images, which depend on when the last checkpoint
	// ran: the bytes vary with them, the records do not.
	WALFPI float64 `json:"wal_fpi"`
	// Buffers is PostgreSQL's shared buffers read or hit, Dirtied those the statements
	// dirtied.
	Buffers float64 `json:"buffers"`
	Dirtied float64 `json:"dirtied"`
	// ExecMs is PostgreSQL's execution time, and on SQLite the statements' time, client
	// included.
	ExecMs float64 `json:"exec_ms"`
}

// perRow divides x by the rows.
func (w stmtWork) perRow(x float64) float64 { return x / float64(max(1, w.Rows)) }

// tableWork is the server's work for the hot path's statements on one table.
type tableWork struct {
	Insert stmtWork `json:"insert"`
	Claim  stmtWork `json:"claim"`
	Ack    stmtWork `json:"ack"`
}

// drainPerRow is claim plus ack of f (a field of stmtWork) per row.
func (w *tableWork) drainPerRow(f func(stmtWork) float64) float64 {
	return w.Claim.perRow(f(w.Claim)) + w.Ack.perRow(f(w.Ack))
}

const workRepeats = 20

// tableCostResult is the table-cost scenario on one backend.
type tableCostResult struct {
	N           int                `json:"n"`
	Batch       int                `json:"batch"`
	Workers     int                `json:"workers"`
	EnqueueConc int                `json:"enqueue_concurrency"`
	EnqueueDur  string             `json:"enqueue_duration"`
	InsertBatch int                `json:"insert_batch"`
	Rounds      int                `json:"rounds"`
	Variants    []tableCostVariant `json:"variants"`
}

const (
	tableCostConc  = 8
	tableCostBatch = 100
)

// costShare is the share of a variant's time that its difference from ours accounts for:
// 1 − 1/ratio, where ratio is variant ÷ ours in rows or transactions per second. That is the
// share of our table's time that what the variant drops costs.
func costShare(ratio float64) float64 { return 1 - 1/ratio }

// cost is the share of the time of the table that has the difference that the difference
// accounts for: costShare for a variant that drops something from ours, and for one that
// adds to ours (the ordered set), the share of the variant's own time, 1 − ratio.
func (v tableCostVariant) cost(ratio float64) float64 {
	if v.Ordered {
		return 1 - ratio
	}
	return costShare(ratio)
}

// runTableCost creates one table per variant and measures, in alternation over the
// variants, the raw loop's drain of TableN rows, single-event enqueue transactions at
// concurrency 8, and 100-row batch inserts, all with 200-byte payloads.
func runTableCost(ctx context.Context, cfg config, b backend, res *backendResult) error {
	type table struct {
		v     tableCostVariant
		relay relay
	}
	var tables []*table
	for _, v := range tableVariants {
		t := &table{v: tableCostVariant{Name: v.name, Label: v.label, Table: "outbox_tc_" + v.name, Ordered: v.ordered}}
		up := migrate
		if v.ordered {
			up = migrateOrdered
		}
		if v.lean {
			r, err := b.createLean(ctx, t.v.Table)
			if err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			t.relay = r
		} else {
			if err := up(ctx, b.admin(), b.name(), t.v.Table); err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			for _, idx := range v.drop {
				err := b.dropIndex(ctx, t.v.Table, idx)
				if errors.Is(err, errors.ErrUnsupported) {
					continue
				}
				if err != nil {
					return fmt.Errorf("%s: drop %s index: %w", v.name, idx, err)
				}
				t.v.Dropped = append(t.v.Dropped, idx)
			}
			if len(v.drop) > 0 && len(t.v.Dropped) == 0 {
				logf("%s: table cost: no %s index on the outbox table; variant %s skipped", b.name(), strings.Join(v.drop, ", "), v.name)
				continue
			}
			t.relay = b.raw(t.v.Table)
		}
		tables = append(tables, t)
	}
	business := b.raw(mainTable)
	r := &tableCostResult{N: cfg.TableN, Batch: cfg.Batch, Workers: cfg.Workers, EnqueueConc: tableCostConc,
		EnqueueDur: cfg.TableEnqueueDur.String(), InsertBatch: tableCostBatch, Rounds: cfg.TableRounds}

	// Drains.
	var vs []variant
	for _, t := range tables {
		vs = append(vs, variant{name: t.v.Name, run: func(ctx context.Context) (float64, error) {
			run, err := drain(ctx, b, drainSpec{kind: kindRaw, table: t.v.Table, n: cfg.TableN, batch: cfg.Batch,
				workers: cfg.Workers, payloads: payloads200, relay: t.relay})
			return run.Rate, err
		}})
	}
	// Warm-up: one small drain of each table.
	warm := make([]variant, len(tables))
	for i, t := range tables {
		warm[i] = variant{name: t.v.Name, run: func(ctx context.Context) (float64, error) {
			run, err := drain(ctx, b, drainSpec{kind: kindRaw, table: t.v.Table, n: min(cfg.TableN, 2000), batch: cfg.Batch,
				workers: cfg.Workers, payloads: payloads200, relay: t.relay})
			return run.Rate, err
		}}
	}
	if _, err := alternate(ctx, 1, warm); err != nil {
		return err
	}
	drains, err := alternate(ctx, cfg.TableRounds, vs)
	if err != nil {
		return err
	}

	// Enqueue: single-event transactions and batch inserts, on one pool.
	db, _, err := b.pool(tableCostConc)
	if err != nil {
		return err
	}
	defer db.Close()
	var seq atomic.Int64
	loop := func(t *table, conc int, d time.Duration, batch bool) variant {
		return variant{name: t.v.Name, run: func(ctx context.Context) (float64, error) {
			if err := b.reset(ctx, t.v.Table); err != nil {
				return 0, err
			}
			if !batch {
				return txLoop(ctx, db, conc, d, &seq, func(ctx context.Context, tx *sql.Tx, i int) error {
					if err := business.insertBusiness(ctx, tx, i); err != nil {
						return err
					}
					row := rawRowOf(i, payloads200)
					return t.relay.insertOne(ctx, tx, &row)
				})
			}
			txs, err := txLoop(ctx, db, conc, d, &seq, func(ctx context.Context, tx *sql.Tx, i int) error {
				return t.relay.insertMany(ctx, tx, "values", rawRowsOf(i*tableCostBatch, tableCostBatch, payloads200))
			})
			return txs * tableCostBatch, err
		}}
	}
	measure := func(conc int, batch bool) (map[string][]float64, error) {
		var warm, vs []variant
		for _, t := range tables {
			warm = append(warm, loop(t, conc, cfg.TableEnqueueDur/3, batch))
			vs = append(vs, loop(t, conc, cfg.TableEnqueueDur, batch))
		}
		if _, err := alternate(ctx, 1, warm); err != nil {
			return nil, err
		}
		return alternate(ctx, cfg.TableRounds, vs)
	}
	enq, err := measure(tableCostConc, false)
	if err != nil {
		return err
	}
	bat, err := measure(1, true)
	if err != nil {
		return err
	}
	if m, ok := b.(workMeter); ok {
		for _, t := range tables {
			if t.v.Work, err = m.statementWork(ctx, t.v.Table, t.relay, cfg.TableN, cfg.Batch, workRepeats); err != nil {
				return fmt.Errorf("%s: statement work: %w", t.v.Name, err)
			}
			w := t.v.Work
			logf("%s: table cost %-12s per row: insert %.1f WAL records %.0f bytes %.1f buffers; claim + ack %.1f WAL records %.0f bytes %.1f buffers",
				b.name(), t.v.Name, w.Insert.perRow(w.Insert.WALRecords), w.Insert.perRow(w.Insert.WALBytes), w.Insert.perRow(w.Insert.Buffers),
				w.drainPerRow(func(s stmtWork) float64 { return s.WALRecords }), w.drainPerRow(func(s stmtWork) float64 { return s.WALBytes }),
				w.drainPerRow(func(s stmtWork) float64 { return s.Buffers }))
		}
	}
	for _, t := range tables {
		v := t.v
		n := v.Name
		v.Drain, v.Enqueue, v.Batch = summarize(drains[n]), summarize(enq[n]), summarize(bat[n])
		v.DrainVsOurs = pairedRatio(drains[n], drains["ours"])
		v.EnqueueVsOurs = pairedRatio(enq[n], enq["ours"])
		v.BatchVsOurs = pairedRatio(bat[n], bat["ours"])
		logf("%s: table cost %-12s drain %6.0f rows/s (%.3f of ours; pairs %s), enqueue c=%d %5.0f tx/s (%.3f), batch %6.0f rows/s (%.3f)",
			b.name(), n, v.Drain.Median, v.DrainVsOurs, pairRatios(drains[n], drains["ours"]), tableCostConc,
			v.Enqueue.Median, v.EnqueueVsOurs, v.Batch.Median, v.BatchVsOurs)
		r.Variants = append(r.Variants, v)
	}
	res.TableCost = r
	return nil
}

// tableCostMetrics are the JSON lines of the table-cost scenario, every variant against
// the library's table.
func (r *tableCostResult) metrics(add func(string, float64)) {
	for _, v := range r.Variants {
		if v.Name == "ours" {
			continue
		}
		add("table_"+v.Name+"_drain_vs_ours", v.DrainVsOurs)
		add("table_"+v.Name+"_enqueue_vs_ours", v.EnqueueVsOurs)
		add("table_"+v.Name+"_batch_enqueue_vs_ours", v.BatchVsOurs)
	}
}

// dropPartialIndexes drops one of the outbox table's secondary indexes where they are partial
// (PostgreSQL and SQLite share their names): "dedupe" or "retention".
func dropPartialIndexes(ctx context.Context, db *sql.DB, table, index string) error {
	switch index {
	case "dedupe", "retention":
	default:
		return fmt.Errorf("unknown index %q", index)
	}
	_, err := db.ExecContext(ctx, `DROP INDEX "`+table+"_"+index+`_idx"`)
	return err
}
