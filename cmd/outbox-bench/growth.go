package main

import (
	"context"
	"fmt"
	"time"
)

// growthResult is scenario 5: burn-down next to retained delivered rows against an empty
// table, measured in alternation on two tables of the same database.
type growthResult struct {
	Retained    int     `json:"retained"`
	LoadSeconds float64 `json:"load_seconds"`
	Batch       int     `json:"batch"`
	N           int     `json:"n"`
	LibEmpty    sample  `json:"library_empty"`
	LibRetained sample  `json:"library_retained"`
	RawEmpty    sample  `json:"raw_empty"`
	RawRetained sample  `json:"raw_retained"`
	// Ratio is the library's retained/empty (target >= 0.90); RawRatio is the database's
	// own, for comparison.
	Ratio    float64 `json:"library_retained_vs_empty"`
	RawRatio float64 `json:"raw_retained_vs_empty"`
}

func runGrowth(ctx context.Context, cfg config, b backend, res *backendResult) error {
	g := &growthResult{Retained: cfg.Retained, Batch: cfg.Batch, N: min(cfg.BurnN, cfg.GrowthN)}
	if err := migrate(ctx, b.admin(), b.name(), retainedTable); err != nil {
		return err
	}
	start := time.Now()
	if err := b.loadRetained(ctx, retainedTable, cfg.Retained); err != nil {
		return fmt.Errorf("loading %d retained rows: %w", cfg.Retained, err)
	}
	if err := b.maintain(ctx, retainedTable); err != nil {
		return err
	}
	g.LoadSeconds = time.Since(start).Seconds()
	delivered, total, err := countStatus(ctx, b.admin(), retainedTable)
	if err != nil {
		return err
	}
	if delivered != int64(cfg.Retained) || total != delivered {
		return fmt.Errorf("retained table holds %d delivered of %d rows, want %d", delivered, total, cfg.Retained)
	}
	logf("%s: loaded %d retained delivered rows in %.1fs", b.name(), cfg.Retained, g.LoadSeconds)
	drain := func(kind, table string) variant {
		return variant{name: kind + " " + table, run: func(ctx context.Context) (float64, error) {
			r, err := burn(ctx, b, kind, table, g.N, cfg.Batch, cfg.Workers)
			return r.Rate, err
		}}
	}
	got, err := alternate(ctx, cfg.GrowthRounds, []variant{
		drain("library", mainTable), drain("library", retainedTable),
		drain("raw", mainTable), drain("raw", retainedTable),
	})
	if err != nil {
		return err
	}
	le, lr := got["library "+mainTable], got["library "+retainedTable]
	re, rr := got["raw "+mainTable], got["raw "+retainedTable]
	g.LibEmpty, g.LibRetained, g.RawEmpty, g.RawRetained = summarize(le), summarize(lr), summarize(re), summarize(rr)
	g.Ratio, g.RawRatio = pairedRatio(lr, le), pairedRatio(rr, re)
	logf("%s: growth: library %.0f -> %.0f rows/s (%.3f), raw %.0f -> %.0f rows/s (%.3f) with %d retained rows",
		b.name(), g.LibEmpty.Median, g.LibRetained.Median, g.Ratio, g.RawEmpty.Median, g.RawRetained.Median, g.RawRatio, cfg.Retained)
	res.Growth = g
	return nil
}
