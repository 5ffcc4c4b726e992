// Package browsertest drives the outboxui web view in a real headless browser (Debian's
// chromium, through chromedp): it opens the overview, goes to the dead letters, replays one
// and sees it pending, and saves screenshots of the overview and of the dead-letter page.
// It is a module of its own so that chromedp never enters the core's go.mod.
//
// Set OUTBOX_SCREENSHOTS to a directory to keep the screenshots there (make screenshots
// writes those docs/ui.md shows into docs/); otherwise they go to the test's temporary directory.
// The browser is chromium on PATH, or CHROMIUM; a missing browser fails the test unless
// OUTBOX_TEST_SKIP names "browser".
package browsertest

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
	"github.com/outboxgo/outbox/outboxtest/testdb"
	"github.com/outboxgo/outbox/outboxui"
)

// browser returns the path of the chromium binary, or fails (or skips, when allowed).
func browser(t *testing.T) string {
	t.Helper()
	path := os.Getenv("CHROMIUM")
	if path == "" {
		for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
			if p, err := exec.LookPath(name); err == nil {
				path = p
				break
			}
		}
	}
	if path == "" {
		if testdb.Required("browser") {
			t.Fatal("no chromium on PATH: install it (apt-get install -y chromium), set CHROMIUM, or set OUTBOX_TEST_SKIP=browser to skip this test on purpose")
		}
		t.Skip("SKIPPING BROWSER TEST: no chromium; OUTBOX_TEST_SKIP allows it")
	}
	return path
}

// headless starts the browser at exe for the test, closed when it ends, and returns its
// context.
func headless(ctx context.Context, t *testing.T, exe string) context.Context {
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.WindowSize(1280, 900), chromedp.Flag("hide-scrollbars", true))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(acancel)
	bctx, bcancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(bcancel)
	return bctx
}

// seed fills a SQLite outbox with an hour of traffic: delivered rows spread over the last
// hour, a few dead letters of three errors, a backlog and a blocked ordered key. It
// returns the id of one dead letter.
func seed(ctx context.Context, t *testing.T, db *sql.DB, store *outbox.Store) uuid.UUID {
	t.Helper()
	settle := func(ns string, status outbox.Status, reason string, msgs ...outbox.Message) []uuid.UUID {
		res, err := store.EnqueueStandalone(ctx, msgs...)
		require.NoError(t, err)
		recs, err := store.Claim(ctx, outbox.ClaimOptions{Scope: outbox.Scope{Namespace: ns}, Limit: len(msgs), Lease: time.Minute, MaxAttempts: 10, WorkerID: "seed"})
		require.NoError(t, err)
		require.Len(t, recs, len(msgs))
		out := make([]outbox.Outcome, len(recs))
		for i, r := range recs {
			out[i] = outbox.Outcome{Lease: r.Lease(), Status: status, Error: reason}
		}
		require.NoError(t, store.Complete(ctx, out...))
		ids := make([]uuid.UUID, len(res))
		for i := range res {
			ids[i] = res[i].ID
		}
		return ids
	}
	payload := func(i int) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"order_id":"ord-%05d","total":{"amount":%d,"currency":"EUR"},"items":[{"sku":"A-1","qty":2}]}`, i, 1000+i*7))
	}
	topics := []string{"order.placed", "order.paid", "order.shipped"}
	var msgs []outbox.Message
	for i := range 900 {
		msgs = append(msgs, outbox.Message{Namespace: "shop", Topic: topics[i%3], Payload: payload(i)})
	}
	for i := 0; i < len(msgs); i += 300 {
		settle("shop", outbox.StatusDelivered, "", msgs[i:i+300]...)
	}
	// Spread the delivered rows over the last hour, as an hour of traffic would have left
	// them (the bars of the chart); a test fixture, not something the library does.
	_, err := db.ExecContext(ctx, `UPDATE outbox_events SET updated_at = updated_at - ((abs(random()) % 3600) * 1000000) WHERE status = 'delivered'`)
	require.NoError(t, err)

	errs := []string{
		"permanent: webhook https://billing.example/hooks answered 422: total.amount must be positive",
		"permanent: schema: field \"currency\" is not one of EUR, USD",
		"webhook https://billing.example/hooks answered 500: upstream ledger timeout",
	}
	var dead []uuid.UUID
	for i, n := range []int{7, 3, 2} {
		var batch []outbox.Message
		for j := range n {
			batch = append(batch, outbox.Message{Namespace: "billing", Topic: "invoice.issued", Payload: payload(2000 + i*10 + j)})
		}
		dead = append(dead, settle("billing", outbox.StatusDead, errs[i], batch...)...)
	}
	head := outbox.Message{Namespace: "shipping", Topic: "parcel.label", PartitionKey: "order-4711", Payload: payload(3000)}
	settle("shipping", outbox.StatusDead, "permanent: carrier rejected the address", head)
	_, err = store.EnqueueStandalone(ctx,
		outbox.Message{Namespace: "shipping", Topic: "parcel.label", PartitionKey: "order-4711", Payload: payload(3001)},
		outbox.Message{Namespace: "shop", Topic: "order.placed", Payload: payload(4000)},
		outbox.Message{Namespace: "shop", Topic: "order.paid", Payload: payload(4001)})
	require.NoError(t, err)
	return dead[0]
}

// TestBrowser: the overview, the dead letters, a replay, as an operator clicks them.
func TestBrowser(t *testing.T) {
	exe := browser(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := testdb.SQLite(t)
	require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{Ordered: true}))
	store, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	require.NoError(t, err)
	deadID := seed(ctx, t, db, store)

	mux := http.NewServeMux()
	mux.Handle("/outbox/", outboxui.Handler(store, outboxui.Options{Prefix: "/outbox", Title: "orders-service outbox", Refresh: -1}))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	dir := os.Getenv("OUTBOX_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))

	bctx := headless(ctx, t, exe)

	row := chromedp.CSS(`input[name=id][value="` + deadID.String() + `"]`)
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Navigate(srv.URL+"/outbox/"),
		chromedp.WaitVisible(chromedp.CSS(`#oldest-pending`)),
	))
	deadCount, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`a[href="/outbox/dead"] .n`)))
	require.NoError(t, err)
	overview, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)

	require.NoError(t, chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS(`header nav a[href="/outbox/dead"]`)),
		chromedp.WaitVisible(chromedp.CSS(`table.groups`)),
	))
	deadPage, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)

	require.NoError(t, chromedp.Do(bctx,
		chromedp.Click(row),
		chromedp.Click(chromedp.CSS(`button[name=action][value=replay]`)),
		chromedp.WaitVisible(chromedp.CSS(`p.notice`)),
	))
	notice, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`p.notice`)))
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Navigate(srv.URL+"/outbox/message/"+deadID.String()),
		chromedp.WaitVisible(chromedp.CSS(`p.status`)),
	))
	pendingText, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`p.status`)))
	require.NoError(t, err)
	require.Equal(t, "13", strings.TrimSpace(deadCount), "the overview counts the dead letters")
	require.Contains(t, notice, "Replayed 1 dead letters")
	require.Equal(t, "pending", strings.TrimSpace(pendingText), "the replayed row is pending again")
	rec, err := store.Get(ctx, deadID)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, rec.Status)
	require.Equal(t, 1, rec.Replays)

	for name, png := range map[string][]byte{"ui-overview.png": overview, "ui-dead-letters.png": deadPage} {
		require.NotEmpty(t, png)
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, png, 0o644))
		t.Logf("screenshot: %s (%d bytes)", path, len(png))
	}
}

// TestBrowserManyDatabases: the summary of 50 SQLite databases and a PostgreSQL one that
// is down, the one down shown in its row; a database's name leads to its own overview, and
// "All databases" back.
func TestBrowserManyDatabases(t *testing.T) {
	exe := browser(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var dbs []outboxui.Database
	for i := range 50 {
		db := testdb.SQLite(t)
		require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{}))
		store, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
		require.NoError(t, err)
		dbs = append(dbs, outboxui.Database{Name: fmt.Sprintf("tenant-%02d", i+1), Store: store})
	}
	_, err := dbs[2].Store.EnqueueStandalone(ctx, outbox.Message{Namespace: "shop", Topic: "order.placed", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	gone, err := sql.Open("pgx", "postgres://postgres@127.0.0.1:1/gone?connect_timeout=2")
	require.NoError(t, err)
	defer gone.Close()
	down, err := outbox.New(gone, outbox.Postgres(), outbox.Options{})
	require.NoError(t, err)
	dbs = append(dbs, outboxui.Database{Name: "eu-postgres", Detail: "postgres://app@127.0.0.1:1/gone", Store: down})
	h, err := outboxui.Databases(dbs, outboxui.Options{Prefix: "/outbox", Title: "tenants", Refresh: -1})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/outbox/", h)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	bctx := headless(ctx, t, exe)

	require.NoError(t, chromedp.Do(bctx,
		chromedp.Navigate(srv.URL+"/outbox/"),
		chromedp.WaitVisible(chromedp.CSS(`table.databases`)),
	))
	rows, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("tr.db").length`))
	require.NoError(t, err)
	downText, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`tr.db.down[data-db="eu-postgres"] td.err`)))
	require.NoError(t, err)
	downCount, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`#down-count`)))
	require.NoError(t, err)
	shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS(`tr.db[data-db="tenant-03"] a`)),
		chromedp.WaitVisible(chromedp.CSS(`#oldest-pending`)),
	))
	pending, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`section.cards .card:first-child .n`)))
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS(`a.home`)),
		chromedp.WaitVisible(chromedp.CSS(`table.databases`)),
	))
	require.Equal(t, 51, rows, "a row per database")
	require.Contains(t, downText, "unreachable")
	require.Equal(t, "1 not answering", strings.TrimSpace(downCount))
	require.Equal(t, "1", strings.TrimSpace(pending), "tenant-03's own overview")

	dir := os.Getenv("OUTBOX_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ui-databases.png"), shot, 0o644))
}
