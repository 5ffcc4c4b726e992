package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"time"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
	"github.com/outboxgo/outbox/outboxui"
)

// uiTable is the table of the web view scenario.
const uiTable = "outbox_bench_ui"

// uiResult is the web view scenario: the overview and the dead-letter page of outboxui,
// rendered in-process (every query, the templates, no network), on a table with Retained
// delivered rows a day old, uiRecent delivered in the last minutes (more than the activity
// chart's sample, so that it reads its whole sample), uiDead dead rows with partition keys
// (every one a candidate blocked key) and uiPending pending rows. The table has the ordered
// migration set, so the overview's blocked keys run their real query.
type uiResult struct {
	Delivered int `json:"delivered"`
	Recent    int `json:"recent_delivered"`
	Dead      int `json:"dead"`
	Pending   int `json:"pending"`
	// Milliseconds per page, over uiRounds renders after one warm-up.
	Overview sample `json:"overview_ms"`
	DeadPage sample `json:"dead_page_ms"`
	// The overview's reads alone, each timed the same way.
	Stats       sample `json:"stats_ms"`
	Activity    sample `json:"activity_ms"`
	BlockedKeys sample `json:"blocked_keys_ms"`
	// Target is the overview's target in milliseconds.
	Target float64 `json:"overview_target_ms"`
	// Many is the summary of outboxui.Databases over many databases, one of them down
	// (PostgreSQL and SQLite only).
	Many *uiManyResult `json:"many,omitempty"`
}

// uiManyResult is the summary page of a view over uiManyDatabases databases: uiManyDatabases-1
// of the backend (SQLite files, or tables of the bench database on PostgreSQL), each with
// uiManyPending pending and uiManyDead dead rows, and one PostgreSQL database whose server
// does not answer (a closed port).
type uiManyResult struct {
	Databases int    `json:"databases"`
	Down      int    `json:"down"`
	Summary   sample `json:"summary_ms"`
	// Target is the summary's target in milliseconds.
	Target float64 `json:"summary_target_ms"`
}

const (
	uiManyDatabases = 50
	uiManyPending   = 100
	uiManyDead      = 10
	uiManyTargetMs  = 1000
	uiRecent        = outbox.ActivitySampleRows + 5_000
	uiDead          = 10_000
	uiPending       = 1_000
	uiRounds        = 15
	uiTargetMs      = 100
)

func runUI(ctx context.Context, cfg config, b backend, res *backendResult) error {
	if err := migrateOrdered(ctx, b.admin(), b.name(), uiTable); err != nil {
		return err
	}
	if err := b.reset(ctx, uiTable); err != nil {
		return err
	}
	start := time.Now()
	if err := b.loadRetained(ctx, uiTable, cfg.Retained); err != nil {
		return fmt.Errorf("loading %d delivered rows: %w", cfg.Retained, err)
	}
	store, err := outbox.New(b.admin(), b.dialect(), outbox.Options{Table: uiTable})
	if err != nil {
		return err
	}
	errs := []string{
		"permanent: webhook answered 422: total.amount must be positive",
		"permanent: schema: field currency is missing",
		"attempt limit reached (10 attempts)",
		"unavailable: connection refused",
		"permanent: payload too large for the broker",
	}
	if err := settleBatches(ctx, store, uiRecent, outbox.StatusDelivered, nil); err != nil {
		return err
	}
	if err := settleBatches(ctx, store, uiDead, outbox.StatusDead, errs); err != nil {
		return err
	}
	if err := enqueueUI(ctx, store, uiPending, 0); err != nil {
		return err
	}
	if err := b.maintain(ctx, uiTable); err != nil {
		return err
	}
	logf("%s: ui: loaded %d delivered (%d recent) + %d dead + %d pending rows in %.1fs", b.name(), cfg.Retained, uiRecent, uiDead, uiPending, time.Since(start).Seconds())

	h := outboxui.Handler(store, outboxui.Options{})
	render := func(path string) (sample, error) { return renderRounds(ctx, h, path) }
	r := &uiResult{Delivered: cfg.Retained, Recent: uiRecent, Dead: uiDead, Pending: uiPending, Target: uiTargetMs}
	if r.Overview, err = render("/"); err != nil {
		return err
	}
	if r.DeadPage, err = render("/dead"); err != nil {
		return err
	}
	timeIt := func(fn func() error) (sample, error) {
		var ms []float64
		for i := range uiRounds + 1 {
			t0 := time.Now()
			if err := fn(); err != nil {
				return sample{}, err
			}
			if i > 0 {
				ms = append(ms, float64(time.Since(t0).Microseconds())/1000)
			}
		}
		return summarize(ms), nil
	}
	if r.Stats, err = timeIt(func() error { _, err := store.Stats(ctx, outbox.Scope{}); return err }); err != nil {
		return err
	}
	if r.Activity, err = timeIt(func() error { _, err := store.Activity(ctx, outbox.ActivityOptions{}); return err }); err != nil {
		return err
	}
	if r.BlockedKeys, err = timeIt(func() error { _, err := store.BlockedKeys(ctx, outbox.Scope{}, 20); return err }); err != nil {
		return err
	}
	logf("%s: ui over %d + %d delivered, %d dead, %d pending: overview %.1f ms (min %.1f, max %.1f; target < %d ms; of which stats %.1f, activity %.1f, blocked keys %.1f), dead letters %.1f ms",
		b.name(), cfg.Retained, uiRecent, uiDead, uiPending, r.Overview.Median, r.Overview.Min, r.Overview.Max, uiTargetMs,
		r.Stats.Median, r.Activity.Median, r.BlockedKeys.Median, r.DeadPage.Median)
	res.UI = r
	if b.name() == "postgres" || b.name() == "sqlite" {
		if r.Many, err = runUIMany(ctx, b); err != nil {
			return fmt.Errorf("summary of %d databases: %w", uiManyDatabases, err)
		}
	}
	return nil
}

// runUIMany measures the summary of outboxui.Databases over uiManyDatabases databases, one
// of them down.
func runUIMany(ctx context.Context, b backend) (*uiManyResult, error) {
	var dbs []outboxui.Database
	dir, err := os.MkdirTemp("", "outbox-bench-ui-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var pools []*sql.DB
	defer func() {
		for _, p := range pools {
			_ = p.Close()
		}
	}()
	start := time.Now()
	for i := range uiManyDatabases - 1 {
		db, table := b.admin(), fmt.Sprintf("%s_many_%02d", uiTable, i)
		if b.name() == "sqlite" {
			if db, err = sql.Open("sqlite", sqliteDSN(filepath.Join(dir, fmt.Sprintf("tenant-%02d.db", i)))); err != nil {
				return nil, err
			}
			pools = append(pools, db)
		} else {
			defer func() { _, _ = b.admin().ExecContext(context.WithoutCancel(ctx), `DROP TABLE IF EXISTS `+table) }()
		}
		if err := migrations.Up(ctx, db, b.name(), migrations.Options{Table: table}); err != nil {
			return nil, err
		}
		if b.name() == "postgres" {
			_, _ = db.ExecContext(ctx, `TRUNCATE `+table)
		}
		store, err := outbox.New(db, b.dialect(), outbox.Options{Table: table})
		if err != nil {
			return nil, err
		}
		if err := settleBatches(ctx, store, uiManyDead, outbox.StatusDead, []string{"permanent: schema: field currency is missing"}); err != nil {
			return nil, err
		}
		if err := enqueueUI(ctx, store, uiManyPending, 0); err != nil {
			return nil, err
		}
		dbs = append(dbs, outboxui.Database{Name: fmt.Sprintf("tenant-%02d", i), Store: store})
	}
	down, err := sql.Open("pgx", "postgres://postgres@127.0.0.1:1/gone?connect_timeout=2")
	if err != nil {
		return nil, err
	}
	pools = append(pools, down)
	gone, err := outbox.New(down, outbox.Postgres(), outbox.Options{})
	if err != nil {
		return nil, err
	}
	dbs = append(dbs, outboxui.Database{Name: "down", Store: gone})
	logf("%s: ui: %d databases (one down) set up in %.1fs", b.name(), len(dbs), time.Since(start).Seconds())
	h, err := outboxui.Databases(dbs, outboxui.Options{})
	if err != nil {
		return nil, err
	}
	r := &uiManyResult{Databases: len(dbs), Down: 1, Target: uiManyTargetMs}
	if r.Summary, err = renderRounds(ctx, h, "/"); err != nil {
		return nil, err
	}
	logf("%s: ui summary over %d databases, one down: %.1f ms (min %.1f, max %.1f; target < %d ms)",
		b.name(), len(dbs), r.Summary.Median, r.Summary.Min, r.Summary.Max, uiManyTargetMs)
	return r, nil
}

// renderRounds renders h's page at path uiRounds times after one warm-up, in-process, and
// returns the milliseconds of each.
func renderRounds(ctx context.Context, h http.Handler, path string) (sample, error) {
	var ms []float64
	for i := range uiRounds + 1 {
		req := httptest.NewRequestWithContext(ctx, http.MethodGet, path, nil)
		rec := httptest.NewRecorder()
		t0 := time.Now()
		h.ServeHTTP(rec, req)
		d := time.Since(t0)
		if rec.Code != http.StatusOK {
			return sample{}, fmt.Errorf("GET %s: %d: %.300s", path, rec.Code, rec.Body.String())
		}
		if i > 0 { // the first render warms the caches
			ms = append(ms, float64(d.Microseconds())/1000)
		}
	}
	return summarize(ms), nil
}

// enqueueUI enqueues n rows in the bench namespace, a partition key each, from offset.
func enqueueUI(ctx context.Context, store *outbox.Store, n, offset int) error {
	msgs := make([]outbox.Message, 0, outbox.MaxBatch)
	for lo := 0; lo < n; lo += outbox.MaxBatch {
		msgs = msgs[:0]
		for i := lo; i < min(lo+outbox.MaxBatch, n); i++ {
			msgs = append(msgs, outbox.Message{Namespace: benchNamespace, Topic: benchTopic, PartitionKey: fmt.Sprint("ui-", offset+i),
				Payload: json.RawMessage(fmt.Sprintf(`{"order_id":%d,"status":"paid"}`, offset+i))})
		}
		if _, err := store.EnqueueStandalone(ctx, msgs...); err != nil {
			return err
		}
	}
	return nil
}

// settleBatches enqueues n rows and settles them as status through the API, a batch of
// MaxBatch at a time; dead rows take their errors in turn from errs.
func settleBatches(ctx context.Context, store *outbox.Store, n int, status outbox.Status, errs []string) error {
	offset := 1_000_000_000 + int(status[0])*10_000_000
	for lo := 0; lo < n; lo += outbox.MaxBatch {
		k := min(outbox.MaxBatch, n-lo)
		if err := enqueueUI(ctx, store, k, offset+lo); err != nil {
			return err
		}
		recs, err := store.Claim(ctx, outbox.ClaimOptions{Scope: outbox.Scope{Namespace: benchNamespace}, Limit: k, Lease: time.Minute, MaxAttempts: 100, WorkerID: "bench-ui"})
		if err != nil {
			return err
		}
		out := make([]outbox.Outcome, len(recs))
		for i, r := range recs {
			out[i] = outbox.Outcome{Lease: r.Lease(), Status: status}
			if len(errs) > 0 {
				out[i].Error = errs[(lo+i)%len(errs)]
			}
		}
		if err := store.Complete(ctx, out...); err != nil {
			return err
		}
	}
	return nil
}
