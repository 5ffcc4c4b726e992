package outboxui_test

import (
	"context"
	"database/sql"
	"fmt"
	"html"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
	"github.com/outboxgo/outbox/outboxui"
)

// manyDatabases returns n migrated SQLite stores named db01.., one PostgreSQL store that is
// up and one whose server does not answer (a closed port), the last two named pg-up and
// pg-down.
func manyDatabases(t *testing.T, n int) []outboxui.Database {
	t.Helper()
	ctx := context.Background()
	var dbs []outboxui.Database
	for i := range n {
		db := testdb.SQLite(t)
		require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{}))
		s, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
		require.NoError(t, err)
		dbs = append(dbs, outboxui.Database{Name: fmt.Sprintf("db%02d", i+1), Store: s})
	}
	pg := testdb.Postgres(t)
	require.NoError(t, migrations.Up(ctx, pg, "postgres", migrations.Options{}))
	up, err := outbox.New(pg, outbox.Postgres(), outbox.Options{})
	require.NoError(t, err)
	gone, err := sql.Open("pgx", "postgres://postgres@127.0.0.1:1/test?connect_timeout=2")
	require.NoError(t, err)
	t.Cleanup(func() { _ = gone.Close() })
	down, err := outbox.New(gone, outbox.Postgres(), outbox.Options{})
	require.NoError(t, err)
	return append(dbs, outboxui.Database{Name: "pg-up", Store: up}, outboxui.Database{Name: "pg-down", Store: down})
}

// TestDatabases: the summary over 50 SQLite databases and two PostgreSQL ones, one of them
// down, shows a row per database, the one down with its error in its row, and links to
// each database's own pages, which work as the one-database view's do.
func TestDatabases(t *testing.T) {
	t.Parallel()
	dbs := manyDatabases(t, 50)
	ctx := context.Background()
	_, err := dbs[6].Store.EnqueueStandalone(ctx, msg("shop", "order.placed", 1), msg("shop", "order.placed", 2))
	require.NoError(t, err)
	e := &env{ctx: ctx, store: dbs[6].Store}
	e.settle(t, outbox.StatusDead, "kafka: produce to orders.created: MESSAGE_TOO_LARGE", msg("shop", "orders.created", 3))
	pgUp := dbs[50]
	_, err = pgUp.Store.EnqueueStandalone(ctx, msg("billing", "invoice", 4))
	require.NoError(t, err)
	pgUp.Health = func() outboxui.Health {
		return outboxui.Health{State: "healthy", CircuitOpen: true, CircuitOpenedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	}
	dbs[50] = pgUp

	h, err := outboxui.Databases(dbs, outboxui.Options{Prefix: "/ops", DatabaseTimeout: 5 * time.Second})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/ops/", h)
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.srv.Close)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	e.client = &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	r := e.get(t, "/ops/")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.NotEmpty(t, r.header.Get("Content-Security-Policy"), "the summary has the pages' headers")
	rows := regexp.MustCompile(`<tr class="db( down)?" data-db="([^"]+)">`).FindAllStringSubmatch(r.body, -1)
	require.Len(t, rows, 52, "a row per database")
	for _, row := range rows {
		require.Equal(t, row[2] == "pg-down", row[1] == " down", "only pg-down is down: %s", row[2])
	}
	require.Contains(t, r.body, `<strong class="bad" id="down-count">1 not answering</strong>`)
	require.Regexp(t, `data-db="pg-down"><td><a href="/ops/db/pg-down/">pg-down</a></td>\s*<td colspan="4" class="err" role="alert">unreachable: `, r.body)
	require.Regexp(t, `data-db="db07"><td><a href="/ops/db/db07/">db07</a></td>\s*<td class="num">2</td>`, r.body, "db07's pending rows")
	require.Contains(t, r.body, `<a class="bad" href="/ops/db/db07/dead">1</a>`)
	require.Contains(t, html.UnescapeString(r.body), "<span class=\"bad\">open</span> since 2026-01-02 03:04:05.000 UTC", "pg-up's circuit")
	require.Contains(t, r.body, "3 pending (due), 1 dead")

	// A database's pages are the one-database view's, with a link back.
	r = e.get(t, "/ops/db/db07/dead")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, `<a class="home" href="/ops/">All databases</a>`)
	require.Contains(t, r.body, "kafka: produce to &lt;name&gt;: MESSAGE_TOO_LARGE")
	r = e.get(t, "/ops/db/pg-up/")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, `<span class="n">1</span><span class="l">pending (due)</span>`)
	r = e.get(t, "/ops/db/pg-down/")
	require.Equal(t, http.StatusInternalServerError, r.status, "the database that is down fails its own pages only")
	require.Equal(t, http.StatusNotFound, e.get(t, "/ops/db/nope/").status)
	require.Equal(t, http.StatusMovedPermanently, e.get(t, "/ops/db/db07").status)
	require.Equal(t, http.StatusOK, e.get(t, "/ops/static/style.css").status)

	// Bad setups are refused with what to fix.
	for _, bad := range [][]outboxui.Database{
		{{Name: "a/b", Store: dbs[0].Store}},
		{{Name: "", Store: dbs[0].Store}},
		{{Name: "a", Store: dbs[0].Store}, {Name: "a", Store: dbs[1].Store}},
		{{Name: "a"}},
	} {
		_, err := outboxui.Databases(bad, outboxui.Options{})
		require.Error(t, err)
		require.True(t, strings.HasPrefix(err.Error(), "outboxui: database "), err.Error())
	}
}

// TestRelayDatabases: a Relay's stores, by the names they were added under, with the
// relay's word for each store's state and its circuit.
func TestRelayDatabases(t *testing.T) {
	t.Parallel()
	dbs := manyDatabases(t, 2)
	relay, err := outbox.NewRelay(outbox.TransportFunc(func(context.Context, []outbox.Delivery) []error { return nil }), outbox.RelayOptions{Publisher: outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "shop"}}})
	require.NoError(t, err)
	stores := map[string]*outbox.Store{"b": dbs[1].Store, "a": dbs[0].Store}
	for name, s := range stores {
		require.NoError(t, relay.Add(name, s))
	}
	got := outboxui.RelayDatabases(relay, stores)
	require.Len(t, got, 2)
	require.Equal(t, []string{"a", "b"}, []string{got[0].Name, got[1].Name}, "sorted by name")
	h := got[0].Health()
	require.Equal(t, string(outbox.StoreStarting), h.State, "added, not run yet")
	require.False(t, h.CircuitOpen)
	_, err = outboxui.Databases(got, outboxui.Options{})
	require.NoError(t, err)
}
