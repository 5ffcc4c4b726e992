package outboxui_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
	"github.com/outboxgo/outbox/outboxui"
)

var backends = []string{"sqlite", "postgres", "mysql"}

// env is one test's database, store and view, served under /outbox by a test server,
// and a browser-like client that keeps cookies and does not follow redirects.
type env struct {
	ctx     context.Context
	backend string
	db      *sql.DB
	store   *outbox.Store
	srv     *httptest.Server
	client  *http.Client
}

func dialectOf(backend string) outbox.Dialect {
	return map[string]func() outbox.Dialect{"postgres": outbox.Postgres, "mysql": outbox.MySQL, "sqlite": outbox.SQLite}[backend]()
}

func setup(t *testing.T, backend string, o outboxui.Options) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	db := testdb.Open(t, backend)
	require.NoError(t, migrations.Up(ctx, db, backend, migrations.Options{Ordered: true}))
	store, err := outbox.New(db, dialectOf(backend), outbox.Options{})
	require.NoError(t, err)
	o.Prefix = "/outbox"
	mux := http.NewServeMux()
	mux.Handle("/outbox/", outboxui.Handler(store, o))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	client := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &env{ctx: ctx, backend: backend, db: db, store: store, srv: srv, client: client}
}

// eachBackend runs fn on every database, in parallel.
func eachBackend(t *testing.T, o outboxui.Options, fn func(t *testing.T, e *env)) {
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			fn(t, setup(t, b, o))
		})
	}
}

type resp struct {
	status   int
	body     string
	location string
	header   http.Header
}

func (e *env) do(t *testing.T, req *http.Request) resp {
	t.Helper()
	res, err := e.client.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return resp{status: res.StatusCode, body: string(b), location: res.Header.Get("Location"), header: res.Header}
}

func (e *env) get(t *testing.T, path string) resp {
	t.Helper()
	req, err := http.NewRequestWithContext(e.ctx, http.MethodGet, e.srv.URL+path, nil)
	require.NoError(t, err)
	return e.do(t, req)
}

// post sends a form as a same-origin browser would (Sec-Fetch-Site: same-origin).
func (e *env) post(t *testing.T, path string, form url.Values, hdr ...string) resp {
	t.Helper()
	req, err := http.NewRequestWithContext(e.ctx, http.MethodPost, e.srv.URL+path, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return e.do(t, req)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf returns the token of the forms of the page at path (which sets the cookie).
func (e *env) csrf(t *testing.T, path string) string {
	t.Helper()
	r := e.get(t, path)
	require.Equal(t, http.StatusOK, r.status, r.body)
	m := csrfRE.FindStringSubmatch(r.body)
	require.NotNil(t, m, "the page has a form with a token")
	return html.UnescapeString(m[1])
}

func msg(ns, topic string, i int) outbox.Message {
	return outbox.Message{Namespace: ns, Topic: topic, Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
}

// settle enqueues msgs (of one namespace), claims them and settles each with status,
// dead ones as a permanent failure with reason. It returns their ids in enqueue order.
func (e *env) settle(t *testing.T, status outbox.Status, reason string, msgs ...outbox.Message) []uuid.UUID {
	t.Helper()
	res, err := e.store.EnqueueStandalone(e.ctx, msgs...)
	require.NoError(t, err)
	ids := make([]uuid.UUID, len(res))
	for i := range res {
		ids[i] = res[i].ID
	}
	left := len(msgs)
	for left > 0 {
		recs, err := e.store.Claim(e.ctx, outbox.ClaimOptions{Scope: outbox.Scope{Namespace: msgs[0].Namespace}, Limit: min(left, outbox.MaxBatch),
			Lease: time.Minute, MaxAttempts: 10, WorkerID: "test"})
		require.NoError(t, err)
		require.NotEmpty(t, recs)
		out := make([]outbox.Outcome, len(recs))
		for i, r := range recs {
			out[i] = outbox.Outcome{Lease: r.Lease(), Status: status}
			if status == outbox.StatusDead {
				out[i].Error = "permanent: " + reason
			}
		}
		require.NoError(t, e.store.Complete(e.ctx, out...))
		left -= len(recs)
	}
	return ids
}

func (e *env) status(t *testing.T, id uuid.UUID) outbox.Status {
	t.Helper()
	r, err := e.store.Get(e.ctx, id)
	require.NoError(t, err)
	return r.Status
}

func (e *env) deadCount(t *testing.T) int64 {
	t.Helper()
	st, err := e.store.Stats(e.ctx, outbox.Scope{})
	require.NoError(t, err)
	return st.Dead
}

// TestOverview: counts by status, the per-topic table, both charts, blocked keys, the
// refresh, the prefix in every link, and the static files.
func TestOverview(t *testing.T) {
	t.Parallel()
	eachBackend(t, outboxui.Options{Refresh: 7 * time.Second}, func(t *testing.T, e *env) {
		e.settle(t, outbox.StatusDelivered, "", msg("shop", "order.placed", 1), msg("shop", "order.placed", 2))
		e.settle(t, outbox.StatusDead, "broker said no", msg("shop", "order.paid", 3))
		head := msg("shop", "order.shipped", 4)
		head.PartitionKey = "order-17"
		e.settle(t, outbox.StatusDead, "refused", head)
		next := msg("shop", "order.shipped", 5)
		next.PartitionKey = "order-17"
		_, err := e.store.EnqueueStandalone(e.ctx, next, msg("shop", "order.placed", 6))
		require.NoError(t, err)

		r := e.get(t, "/outbox/")
		require.Equal(t, http.StatusOK, r.status, r.body)
		require.Equal(t, "text/html; charset=utf-8", r.header.Get("Content-Type"))
		require.Contains(t, r.header.Get("Content-Security-Policy"), "default-src 'none'")
		require.Contains(t, r.body, `<meta http-equiv="refresh" content="7">`)
		require.Regexp(t, `<span class="n">2</span><span class="l">pending \(due\)</span>`, r.body)
		require.Regexp(t, `<span class="n" id="delivered-total">2</span><span class="l">delivered</span>`, r.body)
		require.Regexp(t, `<span class="n">2</span><span class="l">dead</span>`, r.body)
		require.Contains(t, r.body, `id="oldest-pending"`)
		require.Regexp(t, `<td>shop</td><td>order\.paid</td>`, r.body)
		require.Equal(t, 2, strings.Count(r.body, "<svg"), "a chart of delivered and one of dead rows")
		require.Contains(t, r.body, "delivered: 2 in the hour")
		require.Contains(t, r.body, "dead: 2 in the hour")
		require.Contains(t, r.body, "<td>order-17</td>", "the blocked key")
		require.Contains(t, r.body, `href="/outbox/dead"`, "links carry the prefix")
		require.NotContains(t, r.body, `href="/dead"`)

		css := e.get(t, "/outbox/static/style.css")
		require.Equal(t, http.StatusOK, css.status)
		require.Contains(t, css.header.Get("Content-Type"), "text/css")
		js := e.get(t, "/outbox/static/ui.js")
		require.Equal(t, http.StatusOK, js.status)
		require.Equal(t, http.StatusNotFound, e.get(t, "/outbox/nothing-here").status)
	})
}

// TestDeadLetters: the list, its groups by error, every filter, and a filter's bad input.
func TestDeadLetters(t *testing.T) {
	t.Parallel()
	eachBackend(t, outboxui.Options{}, func(t *testing.T, e *env) {
		tenant := uuid.New()
		timeouts := e.settle(t, outbox.StatusDead, "timeout after 5s", msg("shop", "order.paid", 1), msg("shop", "order.paid", 2), msg("shop", "order.paid", 3))
		schema := e.settle(t, outbox.StatusDead, "schema: total missing", msg("shop", "order.placed", 4))
		tm := msg("billing", "invoice", 5)
		tm.TenantID = tenant
		billing := e.settle(t, outbox.StatusDead, "timeout after 5s", tm)

		r := e.get(t, "/outbox/dead")
		require.Equal(t, http.StatusOK, r.status, r.body)
		require.Contains(t, r.body, "(5 dead rows)")
		groups := regexp.MustCompile(`(?s)<td class="num">(\d+)</td><td class="err"><details[^>]*><summary class="fingerprint">([^<]*) <span`).FindAllStringSubmatch(r.body, -1)
		require.Len(t, groups, 2)
		require.Equal(t, []string{"4", "permanent: timeout after &lt;n&gt;"}, groups[0][1:], "most rows first")
		require.Equal(t, []string{"1", "permanent: schema: total missing"}, groups[1][1:])
		for _, id := range append(append(timeouts, schema...), billing...) {
			require.Contains(t, r.body, `href="/outbox/message/`+id.String()+`"`)
		}

		count := func(path string) string {
			r := e.get(t, path)
			require.Equal(t, http.StatusOK, r.status, r.body)
			m := regexp.MustCompile(`\((\d+) dead rows? in the filter\)`).FindStringSubmatch(r.body)
			require.NotNil(t, m, path)
			return m[1]
		}
		require.Equal(t, "3", count("/outbox/dead?ns=shop&topic=order.paid"))
		require.Equal(t, "1", count("/outbox/dead?ns=billing"))
		require.Equal(t, "1", count("/outbox/dead?tenant="+tenant.String()))
		require.Equal(t, "4", count("/outbox/dead?error=timeout"))
		require.Equal(t, "1", count("/outbox/dead?group="+url.QueryEscape("permanent: schema: total missing")))
		require.Equal(t, "5", count("/outbox/dead?since=1h"))
		require.Equal(t, "0", count("/outbox/dead?until=1h"))
		require.Equal(t, "0", count("/outbox/dead?since=2000-01-01&until=2000-01-02"))

		for _, bad := range []string{"tenant=nope", "since=yesterday", "since=1h&until=2h", "until=-5m"} {
			r := e.get(t, "/outbox/dead?"+bad)
			require.Equal(t, http.StatusBadRequest, r.status, bad)
			require.Contains(t, r.body, "The filter is not valid", bad)
		}
		r = e.get(t, "/outbox/dead?error="+url.QueryEscape("a\x00b"))
		require.Equal(t, http.StatusBadRequest, r.status, "the store refuses a NUL byte")
		r = e.get(t, "/outbox/dead?cursor=not-a-cursor")
		require.Equal(t, http.StatusBadRequest, r.status)
		require.Equal(t, int64(5), e.deadCount(t), "bad input changed nothing")
	})
}

// TestReplaySelected: selected rows are replayed by a POST with the page's token, and the
// list says so.
func TestReplaySelected(t *testing.T) {
	t.Parallel()
	eachBackend(t, outboxui.Options{}, func(t *testing.T, e *env) {
		ids := e.settle(t, outbox.StatusDead, "boom", msg("shop", "a", 1), msg("shop", "a", 2), msg("shop", "a", 3))
		live := e.settle(t, outbox.StatusDelivered, "", msg("shop", "a", 4))[0]
		token := e.csrf(t, "/outbox/dead")
		r := e.post(t, "/outbox/dead/selected", url.Values{"csrf": {token}, "action": {"replay"}, "id": {ids[0].String(), ids[2].String(), live.String()}, "back": {"/dead?ns=shop"}})
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		require.Equal(t, "/outbox/dead?done=replayed&n=2&ns=shop&skipped=1", r.location)
		require.Equal(t, outbox.StatusPending, e.status(t, ids[0]))
		require.Equal(t, outbox.StatusDead, e.status(t, ids[1]))
		require.Equal(t, outbox.StatusPending, e.status(t, ids[2]))
		require.Equal(t, outbox.StatusDelivered, e.status(t, live), "only dead rows are replayed")
		page := e.get(t, strings.TrimPrefix(r.location, ""))
		require.Contains(t, page.body, "Replayed 2 dead letters: they are pending again. 1 were no longer dead")

		// An open redirect is not: back must be a path of the view.
		r = e.post(t, "/outbox/dead/selected", url.Values{"csrf": {token}, "action": {"replay"}, "id": {ids[1].String()}, "back": {"//evil.example/"}})
		require.Equal(t, http.StatusSeeOther, r.status)
		require.True(t, strings.HasPrefix(r.location, "/outbox/dead?"), r.location)

		for name, form := range map[string]url.Values{
			"bad id":     {"csrf": {token}, "action": {"replay"}, "id": {"nope"}},
			"no id":      {"csrf": {token}, "action": {"replay"}},
			"bad action": {"csrf": {token}, "action": {"delete"}, "id": {ids[1].String()}},
		} {
			r := e.post(t, "/outbox/dead/selected", form)
			require.Equal(t, http.StatusBadRequest, r.status, name)
		}
	})
}

// TestDiscardSelected: discarding selected rows asks first; the confirmed form deletes them.
func TestDiscardSelected(t *testing.T) {
	t.Parallel()
	eachBackend(t, outboxui.Options{}, func(t *testing.T, e *env) {
		ids := e.settle(t, outbox.StatusDead, "boom", msg("shop", "a", 1), msg("shop", "a", 2))
		token := e.csrf(t, "/outbox/dead")
		r := e.post(t, "/outbox/dead/selected", url.Values{"csrf": {token}, "action": {"discard"}, "id": {ids[0].String()}, "back": {"/dead"}})
		require.Equal(t, http.StatusOK, r.status, r.body)
		require.Contains(t, r.body, `<strong id="confirm-count">1</strong>`)
		require.Equal(t, outbox.StatusDead, e.status(t, ids[0]), "asking changes nothing")
		form := url.Values{"csrf": {token}, "action": {"discard"}, "confirmed": {"yes"}, "back": {"/dead"}, "id": {ids[0].String()}}
		r = e.post(t, "/outbox/dead/selected", form)
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		_, err := e.store.Get(e.ctx, ids[0])
		require.ErrorIs(t, err, outbox.ErrNotFound)
		require.Equal(t, outbox.StatusDead, e.status(t, ids[1]))
	})
}

// TestBulkByFilterAndGroup: "replay all matching" and a group's discard state the count on
// a confirmation page and act on exactly the rows counted, not on rows that die later.
func TestBulkByFilterAndGroup(t *testing.T) {
	t.Parallel()
	eachBackend(t, outboxui.Options{}, func(t *testing.T, e *env) {
		timeouts := e.settle(t, outbox.StatusDead, "timeout", msg("shop", "a", 1), msg("shop", "a", 2), msg("shop", "b", 3))
		schema := e.settle(t, outbox.StatusDead, "schema", msg("shop", "a", 4), msg("shop", "a", 5))

		r := e.get(t, "/outbox/dead/confirm?ns=shop&topic=a&action=replay")
		require.Equal(t, http.StatusOK, r.status, r.body)
		require.Contains(t, r.body, `<strong id="confirm-count">4</strong>`)
		require.Contains(t, r.body, `name="until"`, "the form pins the rows counted")
		form := formOf(t, r.body)
		require.Equal(t, outbox.StatusDead, e.status(t, timeouts[0]), "the confirmation changes nothing")

		// A row that dies after the confirmation is not replayed with the rows counted.
		waitDBClockPast(t, e, time.Millisecond)
		later := e.settle(t, outbox.StatusDead, "timeout", msg("shop", "a", 6))[0]

		r = e.post(t, "/outbox/dead/bulk", form)
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		require.Equal(t, "/outbox/dead?done=replayed&n=4&ns=shop&topic=a", r.location)
		for _, id := range []uuid.UUID{timeouts[0], timeouts[1], schema[0], schema[1]} {
			require.Equal(t, outbox.StatusPending, e.status(t, id))
		}
		require.Equal(t, outbox.StatusDead, e.status(t, timeouts[2]), "another topic")
		require.Equal(t, outbox.StatusDead, e.status(t, later), "died after the count")

		// A cause: discard every row whose last error has the fingerprint "permanent: timeout".
		r = e.get(t, "/outbox/dead?ns=shop")
		require.Contains(t, html.UnescapeString(r.body), "/outbox/dead/confirm?action=discard&cause=permanent%3A+timeout&ns=shop")
		r = e.get(t, "/outbox/dead/confirm?action=discard&cause=permanent%3A+timeout&ns=shop")
		require.Contains(t, r.body, `<strong id="confirm-count">2</strong>`)
		r = e.post(t, "/outbox/dead/bulk", formOf(t, r.body))
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		require.Zero(t, e.deadCount(t))

		// A bulk form without the confirmation's bound, or with a bad action, is refused.
		e.settle(t, outbox.StatusDead, "again", msg("shop", "c", 7))
		token := e.csrf(t, "/outbox/dead")
		r = e.post(t, "/outbox/dead/bulk", url.Values{"csrf": {token}, "action": {"replay"}})
		require.Equal(t, http.StatusBadRequest, r.status)
		r = e.post(t, "/outbox/dead/bulk", url.Values{"csrf": {token}, "action": {"drop"}, "until": {"1m"}})
		require.Equal(t, http.StatusBadRequest, r.status)
		require.Equal(t, http.StatusBadRequest, e.get(t, "/outbox/dead/confirm?action=drop").status)
		require.Equal(t, int64(1), e.deadCount(t))
	})
}

// TestDeadCauses: one error met on four topics is one cause, its texts listed inside it,
// each a link to its rows; the cause's replay acts on its rows only, after a confirmation
// that counts them.
func TestDeadCauses(t *testing.T) {
	t.Parallel()
	eachBackend(t, outboxui.Options{}, func(t *testing.T, e *env) {
		var large []uuid.UUID
		for i, topic := range []string{"orders.created", "orders.paid", "orders.refunded", "orders.shipped"} {
			large = append(large, e.settle(t, outbox.StatusDead, "kafka: produce to "+topic+": MESSAGE_TOO_LARGE", msg("shop", topic, i))...)
		}
		other := e.settle(t, outbox.StatusDead, "kafka: produce to orders.created: UNKNOWN_TOPIC_OR_PARTITION", msg("shop", "orders.created", 9))

		r := e.get(t, "/outbox/dead")
		require.Equal(t, http.StatusOK, r.status, r.body)
		body := html.UnescapeString(r.body)
		require.Equal(t, 2, strings.Count(body, `<tr class="cause">`), "two causes, not five texts")
		require.Contains(t, body, "permanent: kafka: produce to <name>: MESSAGE_TOO_LARGE <span class=\"muted\">(4 texts)</span>")
		for _, topic := range []string{"orders.created", "orders.paid", "orders.refunded", "orders.shipped"} {
			require.Contains(t, body, "/outbox/dead?group="+url.QueryEscape("permanent: kafka: produce to "+topic+": MESSAGE_TOO_LARGE"))
		}
		fp := "permanent: kafka: produce to <name>: MESSAGE_TOO_LARGE"
		r = e.get(t, "/outbox/dead/confirm?action=replay&cause="+url.QueryEscape(fp))
		require.Equal(t, http.StatusOK, r.status, r.body)
		require.Contains(t, r.body, `<strong id="confirm-count">4</strong>`)
		r = e.post(t, "/outbox/dead/bulk", formOf(t, r.body))
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		require.Equal(t, "/outbox/dead?done=replayed&n=4", r.location)
		for _, id := range large {
			require.Equal(t, outbox.StatusPending, e.status(t, id))
		}
		require.Equal(t, outbox.StatusDead, e.status(t, other[0]), "another cause")
		require.Equal(t, http.StatusBadRequest, e.get(t, "/outbox/dead/confirm?action=replay&cause=x&group=y").status)
	})
}

// waitDBClockPast waits until the database clock has moved d past the newest death.
func waitDBClockPast(t *testing.T, e *env, d time.Duration) {
	t.Helper()
	g, err := e.store.DeadGroups(e.ctx, outbox.DeadGroupsOptions{})
	require.NoError(t, err)
	deadline := time.Now().Add(10 * time.Second)
	for {
		a, err := e.store.Activity(e.ctx, outbox.ActivityOptions{Minutes: 1})
		require.NoError(t, err)
		if a.Now.After(g.Newest.Add(d)) {
			return
		}
		require.True(t, time.Now().Before(deadline), "the database clock does not move")
		time.Sleep(time.Millisecond)
	}
}

var hiddenRE = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)

// formOf returns the hidden fields of the page's last form.
func formOf(t *testing.T, body string) url.Values {
	t.Helper()
	v := url.Values{}
	for _, m := range hiddenRE.FindAllStringSubmatch(body, -1) {
		v.Add(m[1], html.UnescapeString(m[2]))
	}
	require.NotEmpty(t, v.Get("csrf"))
	return v
}

// TestCSRFRefused: a POST without the token, with another browser's token, or that the
// browser marks as cross-site, is refused and changes nothing; so is a GET of an action.
func TestCSRFRefused(t *testing.T) {
	t.Parallel()
	eachBackend(t, outboxui.Options{}, func(t *testing.T, e *env) {
		id := e.settle(t, outbox.StatusDead, "boom", msg("shop", "a", 1))[0]
		token := e.csrf(t, "/outbox/dead")
		form := func(tok string) url.Values {
			return url.Values{"csrf": {tok}, "action": {"replay"}, "id": {id.String()}}
		}
		r := e.post(t, "/outbox/dead/selected", form(""))
		require.Equal(t, http.StatusForbidden, r.status)
		require.Contains(t, r.body, "security token")
		r = e.post(t, "/outbox/dead/selected", form(token+"x"))
		require.Equal(t, http.StatusForbidden, r.status)

		other := setup(t, "sqlite", outboxui.Options{}) // another view, another key
		other.settle(t, outbox.StatusDead, "boom", msg("shop", "a", 1))
		r = e.post(t, "/outbox/dead/selected", form(other.csrf(t, "/outbox/dead")))
		require.Equal(t, http.StatusForbidden, r.status)

		r = e.post(t, "/outbox/dead/selected", form(token), "Sec-Fetch-Site", "cross-site")
		require.Equal(t, http.StatusForbidden, r.status)
		require.Contains(t, r.body, "another site")
		r = e.post(t, "/outbox/dead/selected", form(token), "Sec-Fetch-Site", "", "Origin", "https://evil.example")
		require.Equal(t, http.StatusForbidden, r.status)

		// Without the cookie, a copied token is worthless.
		bare := &http.Client{CheckRedirect: e.client.CheckRedirect}
		req, err := http.NewRequestWithContext(e.ctx, http.MethodPost, e.srv.URL+"/outbox/dead/selected", strings.NewReader(form(token).Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		res, err := bare.Do(req)
		require.NoError(t, err)
		_ = res.Body.Close()
		require.Equal(t, http.StatusForbidden, res.StatusCode)

		require.Equal(t, http.StatusMethodNotAllowed, e.get(t, "/outbox/dead/selected").status)
		require.Equal(t, http.StatusMethodNotAllowed, e.get(t, "/outbox/dead/bulk").status)
		require.Equal(t, outbox.StatusDead, e.status(t, id), "nothing changed")

		r = e.post(t, "/outbox/dead/selected", form(token))
		require.Equal(t, http.StatusSeeOther, r.status, "the same form from the page is accepted")
	})
}

// TestReadOnly: a read-only view shows no action and refuses every one, token or not.
func TestReadOnly(t *testing.T) {
	t.Parallel()
	eachBackend(t, outboxui.Options{ReadOnly: true}, func(t *testing.T, e *env) {
		id := e.settle(t, outbox.StatusDead, "boom", msg("shop", "a", 1))[0]
		for _, path := range []string{"/outbox/", "/outbox/dead", "/outbox/message/" + id.String()} {
			r := e.get(t, path)
			require.Equal(t, http.StatusOK, r.status, path)
			require.Contains(t, r.body, "read-only")
			require.NotContains(t, r.body, "<button type=\"submit\" name=\"action\"", path)
			require.NotContains(t, r.body, "Replay", path)
			require.NotContains(t, r.body, "Discard", path)
			require.NotContains(t, r.body, `method="post"`, path)
		}
		require.Equal(t, http.StatusForbidden, e.get(t, "/outbox/dead/confirm?action=replay").status)
		r := e.post(t, "/outbox/dead/selected", url.Values{"action": {"replay"}, "id": {id.String()}})
		require.Equal(t, http.StatusForbidden, r.status)
		require.Contains(t, r.body, "read-only")
		r = e.post(t, "/outbox/dead/bulk", url.Values{"action": {"replay"}, "until": {"1s"}})
		require.Equal(t, http.StatusForbidden, r.status)
		require.Equal(t, outbox.StatusDead, e.status(t, id))
	})
}

// TestEscaping: a payload, headers, keys and an error holding markup show as text.
func TestEscaping(t *testing.T) {
	t.Parallel()
	eachBackend(t, outboxui.Options{}, func(t *testing.T, e *env) {
		m := outbox.Message{Namespace: "shop", Topic: "<b>t</b>", DedupeKey: `"><script>alert(3)</script>`,
			Headers: outbox.Headers{"x-<i>": `<script>alert(2)</script>`},
			Payload: json.RawMessage(`{"note":"<script>alert(1)</script>"}`)}
		id := e.settle(t, outbox.StatusDead, "<script>alert(4)</script>", m)[0]
		for _, path := range []string{"/outbox/", "/outbox/dead", "/outbox/message/" + id.String(), "/outbox/search?q=" + url.QueryEscape(m.DedupeKey) + "&ns=shop&topic=x",
			"/outbox/dead?error=" + url.QueryEscape("<script>")} {
			r := e.get(t, path)
			require.Contains(t, []int{http.StatusOK, http.StatusSeeOther}, r.status, path)
			require.NotContains(t, r.body, "<script>alert", path)
			require.NotContains(t, r.body, "<b>t</b>", path)
			require.NotContains(t, r.body, "<i>", path)
		}
		r := e.get(t, "/outbox/message/"+id.String())
		require.Contains(t, r.body, `&lt;script&gt;alert(1)&lt;/script&gt;`, "the payload is shown as text")
		require.Contains(t, r.body, `&lt;script&gt;alert(4)&lt;/script&gt;`, "the error too")
		require.Contains(t, r.body, `&lt;b&gt;t&lt;/b&gt;`)
	})
}

// TestMessage: one row in full, its payload pretty-printed and cut with a download of the
// whole; HidePayloads hides it everywhere.
func TestMessage(t *testing.T) {
	t.Parallel()
	eachBackend(t, outboxui.Options{PayloadView: 40}, func(t *testing.T, e *env) {
		big := fmt.Sprintf(`{"items":[%s1]}`, strings.Repeat("1,", 100))
		m := outbox.Message{Namespace: "shop", Topic: "order.paid", DedupeKey: "order-42", PartitionKey: "p-1",
			Headers: outbox.Headers{"traceparent": "00-abc-def-01", "content-type": "application/json"}, Payload: json.RawMessage(big)}
		id := e.settle(t, outbox.StatusDead, "broker said no", m)[0]
		_, err := e.store.Replay(e.ctx, id)
		require.NoError(t, err)
		e.settle(t, outbox.StatusDead, "broker said no again", outbox.Message{Namespace: "other", Topic: "x", Payload: json.RawMessage(`{}`)})

		r := e.get(t, "/outbox/message/"+id.String())
		require.Equal(t, http.StatusOK, r.status, r.body)
		for _, want := range []string{"shop", "order.paid", "order-42", "p-1", "<th>content-type</th><td>application/json</td>",
			"<th>traceparent</th><td>00-abc-def-01</td>", "<dt>replays</dt><dd>1</dd>", "permanent: broker said no",
			`{` + "\n" + `  &#34;items&#34;: [`, "Cut at 40 B", `href="/outbox/message/` + id.String() + `/payload"`, "status-pending"} {
			require.Contains(t, r.body, want)
		}
		d := e.get(t, "/outbox/message/"+id.String()+"/payload")
		require.Equal(t, http.StatusOK, d.status)
		require.Equal(t, big, d.body, "the download is the payload byte for byte")
		require.Contains(t, d.header.Get("Content-Disposition"), "attachment")

		require.Equal(t, http.StatusBadRequest, e.get(t, "/outbox/message/not-a-uuid").status)
		require.Equal(t, http.StatusNotFound, e.get(t, "/outbox/message/"+uuid.NewString()).status)
		require.Equal(t, http.StatusNotFound, e.get(t, "/outbox/message/"+uuid.NewString()+"/payload").status)
	})
	t.Run("HidePayloads", func(t *testing.T) {
		t.Parallel()
		e := setup(t, "sqlite", outboxui.Options{HidePayloads: true})
		id := e.settle(t, outbox.StatusDead, "boom", outbox.Message{Namespace: "shop", Topic: "t", Payload: json.RawMessage(`{"card":"4111-1111"}`)})[0]
		r := e.get(t, "/outbox/message/"+id.String())
		require.Equal(t, http.StatusOK, r.status)
		require.NotContains(t, r.body, "4111")
		require.Contains(t, r.body, "Payloads are hidden")
		require.NotContains(t, r.body, "/payload")
		d := e.get(t, "/outbox/message/"+id.String()+"/payload")
		require.Equal(t, http.StatusForbidden, d.status)
		require.NotContains(t, d.body, "4111")
	})
}

// TestSearch: by id, by dedupe key (with and without namespace and topic), and not found.
func TestSearch(t *testing.T) {
	t.Parallel()
	eachBackend(t, outboxui.Options{}, func(t *testing.T, e *env) {
		m := outbox.Message{Namespace: "shop", Topic: "order.paid", DedupeKey: "order-42", Payload: json.RawMessage(`{}`)}
		res, err := e.store.EnqueueStandalone(e.ctx, m, msg("shop", "order.placed", 1))
		require.NoError(t, err)
		id := res[0].ID

		r := e.get(t, "/outbox/search?q="+id.String())
		require.Equal(t, http.StatusSeeOther, r.status)
		require.Equal(t, "/outbox/message/"+id.String(), r.location)
		r = e.get(t, "/outbox/search?q=order-42")
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		require.Equal(t, "/outbox/message/"+id.String(), r.location)
		r = e.get(t, "/outbox/search?q=order-42&ns=shop&topic=order.paid")
		require.Equal(t, "/outbox/message/"+id.String(), r.location)
		r = e.get(t, "/outbox/search?q=order-42&ns=shop&topic=order.placed")
		require.Equal(t, http.StatusOK, r.status)
		require.Contains(t, r.body, "No row has the dedupe key")
		r = e.get(t, "/outbox/search?q="+uuid.NewString())
		require.Equal(t, http.StatusOK, r.status)
		require.Contains(t, r.body, "No row has this id")
		r = e.get(t, "/outbox/search?q="+url.QueryEscape(strings.Repeat("k", 300))+"&ns=shop&topic=order.paid")
		require.Equal(t, http.StatusBadRequest, r.status, "a key longer than any is refused")
		r = e.get(t, "/outbox/search")
		require.Equal(t, http.StatusOK, r.status)
	})
}

var rowIDRE = regexp.MustCompile(`<input type="checkbox" name="id" value="([0-9a-f-]{36})"`)
var nextRE = regexp.MustCompile(`<a rel="next" href="([^"]+)">`)

// TestPagination: 2,000 dead rows paged through 20 pages of 100 by the Next links: every
// row once, newest death first, also when rows die while the pages are read. The rows die
// 1,000 at a time (outbox.MaxBatch), each thousand at one instant, so that pages end inside
// a run of equal death times and at the change from one to the next.
func TestPagination(t *testing.T) {
	t.Parallel()
	const n, pageSize = 2 * outbox.MaxBatch, 100
	eachBackend(t, outboxui.Options{PageSize: pageSize}, func(t *testing.T, e *env) {
		msgs := make([]outbox.Message, outbox.MaxBatch)
		var want []uuid.UUID
		for b := 0; b < n/outbox.MaxBatch; b++ {
			for i := range msgs {
				msgs[i] = msg("shop", "a", b*outbox.MaxBatch+i)
			}
			want = append(want, e.settle(t, outbox.StatusDead, "boom", msgs...)...)
		}
		seen := map[string]bool{}
		path, pages := "/outbox/dead", 0
		for path != "" {
			r := e.get(t, path)
			require.Equal(t, http.StatusOK, r.status, r.body)
			pages++
			ids := rowIDRE.FindAllStringSubmatch(r.body, -1)
			require.NotEmpty(t, ids)
			for _, m := range ids {
				require.False(t, seen[m[1]], "row %s shown twice", m[1])
				seen[m[1]] = true
			}
			if pages == 2 { // rows that die now are newer than the first page
				e.settle(t, outbox.StatusDead, "boom", msg("shop", "a", -1), msg("shop", "a", -2))
			}
			path = ""
			if m := nextRE.FindStringSubmatch(r.body); m != nil {
				path = html.UnescapeString(m[1])
			}
			require.Less(t, pages, 30)
		}
		require.Equal(t, n/pageSize, pages)
		require.Len(t, seen, n)
		for _, id := range want {
			require.True(t, seen[id.String()])
		}
	})
}

// TestOverviewTopicMixChanged: on a table whose topic mix changed (billing busy an hour
// ago, shop busy now) with more delivered rows than Stats reads, the overview's per-topic
// delivered cells are exact since the time it shows, and the total is marked an estimate.
func TestOverviewTopicMixChanged(t *testing.T) {
	t.Parallel()
	eachBackend(t, outboxui.Options{}, func(t *testing.T, e *env) {
		deliver := func(ns string, n int) {
			for lo := 0; lo < n; lo += outbox.MaxBatch {
				var msgs []outbox.Message
				for i := lo; i < min(lo+outbox.MaxBatch, n); i++ {
					msgs = append(msgs, msg(ns, fmt.Sprint("t", i%4), i))
				}
				e.settle(t, outbox.StatusDelivered, "", msgs...)
			}
		}
		deliver("billing", 2921)
		shift := map[string]string{
			"postgres": `UPDATE outbox_events SET updated_at = updated_at - interval '1 hour'`,
			"mysql":    `UPDATE outbox_events SET updated_at = DATE_SUB(updated_at, INTERVAL 1 HOUR)`,
			"sqlite":   `UPDATE outbox_events SET updated_at = updated_at - 3600000000`,
		}[e.backend]
		_, err := e.db.ExecContext(e.ctx, shift)
		require.NoError(t, err)
		deliver("shop", 1902)

		r := e.get(t, "/outbox/")
		require.Equal(t, http.StatusOK, r.status, r.body)
		require.Contains(t, r.body, `<span class="n" id="delivered-total">≈ `, "the total is marked an estimate")
		require.Contains(t, r.body, `id="delivered-since"`)
		cells := regexp.MustCompile(`<tr><td>(\w+)</td><td>(t\d)</td>(?:<td class="num">[\d,]+</td>){3}<td class="num delivered">([\d,]+)</td>`).FindAllStringSubmatch(r.body, -1)
		require.Len(t, cells, 8)
		for _, c := range cells {
			if c[1] == "shop" {
				require.Contains(t, []string{"475", "476"}, c[3], "shop/%s: exact", c[2])
			} else {
				require.Less(t, len(c[3]), 3, "billing/%s: only its rows in the window, not a share of the total: %s", c[2], c[3])
			}
		}
	})
}
