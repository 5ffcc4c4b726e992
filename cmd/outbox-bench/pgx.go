package main

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/pgxv5"
)

// pgxEnqueueResult is the enqueue on a pgx transaction at one concurrency: BEGIN; INSERT
// business row; outbox row; COMMIT, all on a pgx.Tx of a pgxpool, with the outbox row
// written by pgxv5.Enqueue or by a hand-written pgx INSERT of the same row.
type pgxEnqueueResult struct {
	Concurrency int    `json:"concurrency"`
	Raw         sample `json:"business_plus_raw_pgx_insert"`
	Library     sample `json:"business_plus_pgxv5_enqueue"`
	// Quiet is pgxv5.Enqueue on a Store with Options.DisableNotify: what the NOTIFY costs.
	Quiet sample `json:"business_plus_pgxv5_enqueue_without_notify"`
	// LibVsRaw is the judging ratio (target >= 0.95).
	LibVsRaw   float64 `json:"library_vs_raw"`
	LibVsQuiet float64 `json:"library_vs_without_notify"`
}

// runEnqueuePgx measures pgxv5.Enqueue against a raw pgx insert of the same row in the same
// transaction, alternated, at each concurrency. PostgreSQL only.
func runEnqueuePgx(ctx context.Context, cfg config, b backend, res *backendResult) error {
	pb, ok := b.(*pgBackend)
	if !ok {
		return nil
	}
	raw := pb.raw(mainTable).(*pgRaw)
	for _, conc := range cfg.Concurrency {
		pcfg, err := pgxpool.ParseConfig(pb.benchDSN)
		if err != nil {
			return err
		}
		pcfg.MaxConns = int32(conc)
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			return err
		}
		r, err := measurePgx(ctx, cfg, pb, raw, pool, conc)
		pool.Close()
		if err != nil {
			return err
		}
		logf("%s: enqueue on pgx c=%d: +raw pgx %.0f, +pgxv5 %.0f, +pgxv5 without NOTIFY %.0f tx/s; pgxv5/raw %.3f, with ÷ without NOTIFY %.3f",
			b.name(), conc, r.Raw.Median, r.Library.Median, r.Quiet.Median, r.LibVsRaw, r.LibVsQuiet)
		res.PgxEnqueue = append(res.PgxEnqueue, r)
	}
	return nil
}

func measurePgx(ctx context.Context, cfg config, b *pgBackend, raw *pgRaw, pool *pgxpool.Pool, conc int) (pgxEnqueueResult, error) {
	store, err := pgxv5.New(pool, outbox.Options{})
	if err != nil {
		return pgxEnqueueResult{}, err
	}
	defer store.DB().Close()
	quiet, err := pgxv5.New(pool, outbox.Options{DisableNotify: true})
	if err != nil {
		return pgxEnqueueResult{}, err
	}
	defer quiet.DB().Close()
	business := func(ctx context.Context, tx pgx.Tx, i int) error {
		_, err := tx.Exec(ctx, raw.business, i, 1000+i%5000)
		return err
	}
	enqueue := func(s *outbox.Store) func(ctx context.Context, tx pgx.Tx, i int) error {
		return func(ctx context.Context, tx pgx.Tx, i int) error {
			if err := business(ctx, tx, i); err != nil {
				return err
			}
			_, err := pgxv5.Enqueue(ctx, s, tx, message(i))
			return err
		}
	}
	bodies := map[string]func(ctx context.Context, tx pgx.Tx, i int) error{
		"raw": func(ctx context.Context, tx pgx.Tx, i int) error {
			if err := business(ctx, tx, i); err != nil {
				return err
			}
			row := newRawRow(i)
			_, err := tx.Exec(ctx, raw.insertSQL, row.id.String(), row.namespace, row.topic, row.pkey, string(row.payload), row.hash)
			return err
		},
		"library":       enqueue(store),
		"library_quiet": enqueue(quiet),
	}
	var seq atomic.Int64
	measure := func(name string, d time.Duration) variant {
		return variant{name: name, run: func(ctx context.Context) (float64, error) {
			if err := b.reset(ctx, mainTable); err != nil {
				return 0, err
			}
			return loop(ctx, conc, d, &seq, func(ctx context.Context, i int) error {
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return bodies[name](ctx, tx, i) })
			})
		}}
	}
	var warm, vs []variant
	for _, n := range []string{"raw", "library", "library_quiet"} {
		warm = append(warm, measure(n, cfg.EnqueueWarmup))
		vs = append(vs, measure(n, cfg.EnqueueDur))
	}
	if _, err := alternate(ctx, 1, warm); err != nil {
		return pgxEnqueueResult{}, err
	}
	got, err := alternate(ctx, cfg.EnqueueRounds, vs)
	if err != nil {
		return pgxEnqueueResult{}, err
	}
	return pgxEnqueueResult{
		Concurrency: conc,
		Raw:         summarize(got["raw"]), Library: summarize(got["library"]), Quiet: summarize(got["library_quiet"]),
		LibVsRaw:   pairedRatio(got["library"], got["raw"]),
		LibVsQuiet: pairedRatio(got["library"], got["library_quiet"]),
	}, nil
}
