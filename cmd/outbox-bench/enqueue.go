package main

import (
	"context"
	"database/sql"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

// enqueueResult is scenario 1 at one concurrency: transactions per second.
type enqueueResult struct {
	Concurrency int    `json:"concurrency"`
	Business    sample `json:"business_only"`
	Raw         sample `json:"business_plus_raw_insert"`
	Library     sample `json:"business_plus_library_enqueue"`
	// LibVsRaw is the judging ratio (target >= 0.95); LibVsBusiness and RawVsBusiness show
	// what an outbox row costs at all.
	LibVsRaw float64 `json:"library_vs_raw"`
	// Quiet and LibVsQuiet, on a dialect with cross-process wake-ups (PostgreSQL's NOTIFY),
	// measure the library with them turned off (Options.DisableNotify): what the signal
	// costs an enqueueing transaction.
	Quiet      *sample `json:"business_plus_library_enqueue_without_notify,omitempty"`
	LibVsQuiet float64 `json:"library_vs_without_notify,omitempty"`
	// Keyed and KeyedVsLib measure the library enqueueing with a dedupe key (a new key every
	// time, as a producer that keys every event does): what the key's uniqueness costs (on
	// MySQL and MariaDB also the lock on the key's stripe).
	Keyed         sample  `json:"business_plus_library_enqueue_keyed"`
	KeyedVsLib    float64 `json:"library_keyed_vs_library"`
	LibVsBusiness float64 `json:"library_vs_business"`
	RawVsBusiness float64 `json:"raw_vs_business"`
}

// runEnqueue measures BEGIN; INSERT business row; [outbox row;] COMMIT at each concurrency.
func runEnqueue(ctx context.Context, cfg config, b backend, res *backendResult) error {
	raw := b.raw(mainTable)
	for _, conc := range cfg.Concurrency {
		db, _, err := b.pool(conc)
		if err != nil {
			return err
		}
		store, err := outbox.New(db, b.dialect(), outbox.Options{})
		if err != nil {
			return err
		}
		quiet, err := outbox.New(db, b.dialect(), outbox.Options{DisableNotify: true})
		if err != nil {
			return err
		}
		_, notifies := b.dialect().(dialect.Notifier)
		var seq atomic.Int64
		bodies := map[string]func(ctx context.Context, tx *sql.Tx, i int) error{
			"business": raw.insertBusiness,
			"raw": func(ctx context.Context, tx *sql.Tx, i int) error {
				if err := raw.insertBusiness(ctx, tx, i); err != nil {
					return err
				}
				row := newRawRow(i)
				return raw.insertOne(ctx, tx, &row)
			},
			"library": func(ctx context.Context, tx *sql.Tx, i int) error {
				if err := raw.insertBusiness(ctx, tx, i); err != nil {
					return err
				}
				_, err := store.Enqueue(ctx, tx, message(i))
				return err
			},
			"library_keyed": func(ctx context.Context, tx *sql.Tx, i int) error {
				if err := raw.insertBusiness(ctx, tx, i); err != nil {
					return err
				}
				m := message(i)
				m.DedupeKey = "order-" + strconv.Itoa(i)
				_, err := store.Enqueue(ctx, tx, m)
				return err
			},
			"library_quiet": func(ctx context.Context, tx *sql.Tx, i int) error {
				if err := raw.insertBusiness(ctx, tx, i); err != nil {
					return err
				}
				_, err := quiet.Enqueue(ctx, tx, message(i))
				return err
			},
		}
		measure := func(name string, d time.Duration) variant {
			return variant{name: name, run: func(ctx context.Context) (float64, error) {
				if err := b.reset(ctx, mainTable); err != nil {
					return 0, err
				}
				return txLoop(ctx, db, conc, d, &seq, bodies[name])
			}}
		}
		var warm, vs []variant
		names := []string{"business", "raw", "library", "library_keyed"}
		if notifies {
			names = append(names, "library_quiet")
		}
		for _, n := range names {
			warm = append(warm, measure(n, cfg.EnqueueWarmup))
			vs = append(vs, measure(n, cfg.EnqueueDur))
		}
		if _, err := alternate(ctx, 1, warm); err != nil {
			_ = db.Close()
			return err
		}
		got, err := alternate(ctx, cfg.EnqueueRounds, vs)
		_ = db.Close()
		if err != nil {
			return err
		}
		r := enqueueResult{
			Concurrency: conc,
			Business:    summarize(got["business"]), Raw: summarize(got["raw"]), Library: summarize(got["library"]),
			LibVsRaw:      pairedRatio(got["library"], got["raw"]),
			Keyed:         summarize(got["library_keyed"]),
			KeyedVsLib:    pairedRatio(got["library_keyed"], got["library"]),
			LibVsBusiness: pairedRatio(got["library"], got["business"]),
			RawVsBusiness: pairedRatio(got["raw"], got["business"]),
		}
		if notifies {
			q := summarize(got["library_quiet"])
			r.Quiet, r.LibVsQuiet = &q, pairedRatio(got["library"], got["library_quiet"])
			logf("%s: enqueue c=%d: library without NOTIFY %.0f tx/s; with ÷ without %.3f", b.name(), conc, q.Median, r.LibVsQuiet)
		}
		logf("%s: enqueue c=%d: business %.0f, +raw %.0f, +library %.0f, +library keyed %.0f tx/s; library/raw %.3f, keyed/unkeyed %.3f",
			b.name(), conc, r.Business.Median, r.Raw.Median, r.Library.Median, r.Keyed.Median, r.LibVsRaw, r.KeyedVsLib)
		res.Enqueue = append(res.Enqueue, r)
	}
	return nil
}

// batchResult is scenario 2 at one batch size: rows per second, one transaction per batch.
type batchResult struct {
	Batch   int               `json:"batch"`
	Library sample            `json:"library"`
	Raw     map[string]sample `json:"raw"`
	// BestRaw is, round by round, the fastest raw form.
	BestRaw sample  `json:"best_raw"`
	Ratio   float64 `json:"library_vs_best_raw"`
}

// runBatchEnqueue measures Store.EnqueueBatch against each raw multi-row insert form.
func runBatchEnqueue(ctx context.Context, cfg config, b backend, res *backendResult) error {
	raw := b.raw(mainTable)
	db, _, err := b.pool(1)
	if err != nil {
		return err
	}
	defer db.Close()
	store, err := outbox.New(db, b.dialect(), outbox.Options{})
	if err != nil {
		return err
	}
	var seq atomic.Int64
	for _, size := range cfg.BatchSizes {
		rowsPerSec := func(name string, d time.Duration, body func(ctx context.Context, tx *sql.Tx, i int) error) variant {
			return variant{name: name, run: func(ctx context.Context) (float64, error) {
				if err := b.reset(ctx, mainTable); err != nil {
					return 0, err
				}
				txs, err := txLoop(ctx, db, 1, d, &seq, body)
				return txs * float64(size), err
			}}
		}
		lib := func(ctx context.Context, tx *sql.Tx, i int) error {
			msgs := make([]outbox.Message, size)
			for j := range msgs {
				msgs[j] = message(i*size + j)
			}
			_, err := store.EnqueueBatch(ctx, tx, msgs)
			return err
		}
		rawBody := func(form string) func(ctx context.Context, tx *sql.Tx, i int) error {
			return func(ctx context.Context, tx *sql.Tx, i int) error {
				return raw.insertMany(ctx, tx, form, newRawRows(i*size, size))
			}
		}
		warmCfg, fullCfg := cfg.BatchDur/3, cfg.BatchDur
		warm := []variant{rowsPerSec("library", warmCfg, lib)}
		vs := []variant{rowsPerSec("library", fullCfg, lib)}
		for _, form := range raw.insertForms() {
			warm = append(warm, rowsPerSec("raw "+form.name, warmCfg, rawBody(form.name)))
			vs = append(vs, rowsPerSec("raw "+form.name, fullCfg, rawBody(form.name)))
		}
		if _, err := alternate(ctx, 1, warm); err != nil {
			return err
		}
		got, err := alternate(ctx, cfg.BatchRounds, vs)
		if err != nil {
			return err
		}
		r := batchResult{Batch: size, Library: summarize(got["library"]), Raw: map[string]sample{}}
		best := make([]float64, cfg.BatchRounds)
		for _, form := range raw.insertForms() {
			xs := got["raw "+form.name]
			r.Raw[form.name] = summarize(xs)
			if form.diagnostic {
				continue
			}
			for i, x := range xs {
				best[i] = max(best[i], x)
			}
		}
		r.BestRaw = summarize(best)
		r.Ratio = pairedRatio(got["library"], best)
		logf("%s: batch %d: library %.0f rows/s, best raw %.0f rows/s: %.3f", b.name(), size, r.Library.Median, r.BestRaw.Median, r.Ratio)
		res.Batch = append(res.Batch, r)
	}
	return nil
}

// headlineBatch returns the batch enqueue result at the headline batch size.
func (r *backendResult) headlineBatch(size int) *batchResult {
	for i := range r.Batch {
		if r.Batch[i].Batch == size {
			return &r.Batch[i]
		}
	}
	return nil
}

func (r *backendResult) enqueueAt(conc int) *enqueueResult {
	for i := range r.Enqueue {
		if r.Enqueue[i].Concurrency == conc {
			return &r.Enqueue[i]
		}
	}
	return nil
}
