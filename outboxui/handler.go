package outboxui

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/outboxgo/outbox"
)

// Defaults of [Options].
const (
	// DefaultRefresh is how often the overview reloads itself when Options.Refresh is zero.
	DefaultRefresh = 10 * time.Second
	// DefaultPageSize is the dead-letter page size when Options.PageSize is zero.
	DefaultPageSize = 50
	// DefaultPayloadView is how many bytes of a payload the message page shows when
	// Options.PayloadView is zero; the rest is in the download.
	DefaultPayloadView = 64 << 10
)

// Options configure [Handler]. The zero value is a usable view with every action on.
type Options struct {
	// Prefix is the path the handler is mounted under, such as "/outbox" (no trailing
	// slash), or "" at the root. The handler strips it from requests itself and writes it
	// in front of its links, so mount it with mux.Handle(Prefix+"/", handler) and no
	// http.StripPrefix.
	Prefix string
	// ReadOnly hides every action (replay, discard) and refuses them with 403 Forbidden.
	ReadOnly bool
	// HidePayloads shows a payload's size instead of its bytes, on every page and in the
	// download, for tables that carry personal or secret data. Headers and last errors are
	// still shown.
	HidePayloads bool
	// Title names the outbox on every page: default "outbox".
	Title string
	// Refresh is how often the overview reloads itself (a meta refresh, which needs no
	// script): default [DefaultRefresh]; negative turns it off.
	Refresh time.Duration
	// PageSize is how many dead letters a page lists: default [DefaultPageSize], at most
	// [outbox.MaxBatch].
	PageSize int
	// PayloadView is how many bytes of a payload the message page shows: default
	// [DefaultPayloadView]. The download link serves it whole.
	PayloadView int
	// CSRFKey signs the tokens of the forms. Default: a random key per Handler, which is
	// right for one process; give every replica of a service behind a load balancer the
	// same key of 32 random bytes, or a form rendered by one is refused by another.
	CSRFKey []byte
	// Logger receives the errors the pages report (default slog.Default()).
	Logger *slog.Logger
	// DatabaseTimeout is how long the summary of [Databases] waits for each database:
	// default [DefaultDatabaseTimeout].
	DatabaseTimeout time.Duration
}

// withDefaults fills the zero fields and bounds the others, so that no value can make the
// handler fail later.
func (o Options) withDefaults() Options {
	o.Prefix = strings.TrimRight(o.Prefix, "/")
	if o.Prefix != "" && !strings.HasPrefix(o.Prefix, "/") {
		o.Prefix = "/" + o.Prefix
	}
	if o.Title == "" {
		o.Title = "outbox"
	}
	if o.Refresh == 0 {
		o.Refresh = DefaultRefresh
	}
	if o.Refresh > 0 && o.Refresh < time.Second {
		o.Refresh = time.Second
	}
	if o.PageSize <= 0 {
		o.PageSize = DefaultPageSize
	}
	o.PageSize = min(o.PageSize, outbox.MaxBatch)
	if o.PayloadView <= 0 {
		o.PayloadView = DefaultPayloadView
	}
	if len(o.CSRFKey) == 0 {
		o.CSRFKey = make([]byte, 32)
		_, _ = rand.Read(o.CSRFKey)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.DatabaseTimeout <= 0 {
		o.DatabaseTimeout = DefaultDatabaseTimeout
	}
	return o
}

// ui serves the pages of one store, or the summary of several.
type ui struct {
	store *outbox.Store
	o     Options
	pages map[string]*template.Template
	// home is the address of the summary of the databases the store is one of; "" when
	// it is the only one. summary marks the ui of that summary, which has no store.
	home    string
	summary bool
}

// Handler returns the web view of store's table. See the package documentation for what it
// serves and how to mount it. A nil store serves an error page.
func Handler(store *outbox.Store, o Options) http.Handler {
	return newHandler(store, o.withDefaults(), "")
}

// newHandler returns the pages of one store; home links back to a summary.
func newHandler(store *outbox.Store, o Options, home string) http.Handler {
	u := &ui{store: store, o: o, home: home}
	u.pages = parsePages()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", u.overview)
	mux.HandleFunc("GET /dead", u.dead)
	mux.HandleFunc("GET /dead/confirm", u.confirmFilter)
	mux.HandleFunc("POST /dead/selected", u.actSelected)
	mux.HandleFunc("POST /dead/bulk", u.actBulk)
	postOnly := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", http.MethodPost)
		u.fail(w, r, http.StatusMethodNotAllowed, "this address takes only the POST of a form", nil)
	}
	mux.HandleFunc("GET /dead/selected", postOnly)
	mux.HandleFunc("GET /dead/bulk", postOnly)
	mux.HandleFunc("GET /message/{id}", u.message)
	mux.HandleFunc("GET /message/{id}/payload", u.payload)
	mux.HandleFunc("GET /search", u.search)
	return u.wrap(u.assets(mux))
}

// assets adds the static files and the not-found page to mux.
func (u *ui) assets(mux *http.ServeMux) *http.ServeMux {
	static, _ := fs.Sub(assets, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", staticFiles(static)))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			u.fail(w, r, http.StatusMethodNotAllowed, "this page takes only GET", nil)
			return
		}
		u.fail(w, r, http.StatusNotFound, "no such page", nil)
	})
	return mux
}

// wrap puts the guards in front of mux and strips the prefix.
func (u *ui) wrap(mux *http.ServeMux) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.fail(w, r, http.StatusForbidden, "refused: the request came from another site (cross-origin). Nothing was changed.", nil)
	}))
	var h http.Handler = u.guard(cop.Handler(mux))
	if u.o.Prefix != "" {
		h = http.StripPrefix(u.o.Prefix, h)
	}
	return h
}

// guard sets the security headers of every response, bounds request bodies, and issues
// the CSRF cookie.
func (u *ui) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("X-Frame-Options", "DENY")
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
		}
		if u.store == nil && !u.summary {
			u.fail(w, r, http.StatusInternalServerError, "the outbox view was set up without a store", nil)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// staticFiles serves the embedded assets with a cache lifetime: they change only with the
// binary.
func staticFiles(fsys fs.FS) http.Handler {
	fsrv := http.FileServerFS(fsys)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		fsrv.ServeHTTP(w, r)
	})
}

// funcs are the template functions every page may use.
var funcs = template.FuncMap{
	"age":      fmtAge,
	"ago":      func(t time.Time) string { return fmtAge(time.Since(t)) },
	"when":     fmtTime,
	"count":    fmtCount,
	"short":    shortText,
	"bytesize": fmtBytes,
	"ms":       func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) },
}

// parsePages parses each page template with the layout. The templates are part of the
// binary, so a parse error is a bug caught by every test.
func parsePages() map[string]*template.Template {
	pages := map[string]*template.Template{}
	names, err := fs.Glob(assets, "templates/*.html")
	if err != nil {
		panic(err)
	}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if base == "layout" {
			continue
		}
		pages[base] = template.Must(template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", n))
	}
	return pages
}

// page is what every template receives: the layout's fields and the page's own data.
type page struct {
	Title    string
	Heading  string
	Prefix   string
	Nav      string
	ReadOnly bool
	Hide     bool
	CSRF     string
	Refresh  int
	Notice   string
	// Home is the address of the summary of several databases ("" for one); Multi marks
	// the summary page itself.
	Home  string
	Multi bool
	Data  any
}

func (u *ui) page(w http.ResponseWriter, r *http.Request, nav, heading string, data any) page {
	return page{
		Title: u.o.Title, Heading: heading, Prefix: u.o.Prefix, Nav: nav,
		ReadOnly: u.o.ReadOnly, Hide: u.o.HidePayloads, CSRF: u.csrfToken(w, r), Data: data,
		Notice: notice(r.URL.Query()), Home: u.home,
	}
}

// render writes one page, or an error page when the template fails.
func (u *ui) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	var buf bytes.Buffer
	if err := u.pages[name].Execute(&buf, p); err != nil {
		u.o.Logger.ErrorContext(r.Context(), "outboxui: render", "page", name, "err", err)
		http.Error(w, "outboxui: the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// errPage is the data of the error page.
type errPage struct {
	Status  int
	Message string
	Detail  string
}

// fail renders the error page: msg says what happened, err (if any) why. Server errors
// are logged too.
func (u *ui) fail(w http.ResponseWriter, r *http.Request, status int, msg string, err error) {
	d := errPage{Status: status, Message: msg}
	if err != nil {
		d.Detail = err.Error()
		if status >= 500 {
			u.o.Logger.ErrorContext(r.Context(), "outboxui: "+msg, "path", r.URL.Path, "err", err)
		}
	}
	u.render(w, r, status, "error", u.page(w, r, "", http.StatusText(status), d))
}

// storeError renders err of a store call: bad input is the request's fault (400), an
// unsupported ability 501, anything else 500.
func (u *ui) storeError(w http.ResponseWriter, r *http.Request, what string, err error) {
	switch {
	case errors.Is(err, outbox.ErrInvalid):
		u.fail(w, r, http.StatusBadRequest, what+": invalid input. Nothing was changed.", err)
	case errors.Is(err, outbox.ErrNotFound):
		u.fail(w, r, http.StatusNotFound, what+": not found.", err)
	case errors.Is(err, errors.ErrUnsupported):
		u.fail(w, r, http.StatusNotImplemented, what+": the store's dialect cannot do this.", err)
	default:
		u.fail(w, r, http.StatusInternalServerError, what+" failed.", err)
	}
}

// link renders a path of the handler with the prefix in front.
func (u *ui) link(path string) string { return u.o.Prefix + path }

// redirect answers a POST with 303 See Other to a page of the handler.
func (u *ui) redirect(w http.ResponseWriter, r *http.Request, path string) {
	http.Redirect(w, r, u.link(path), http.StatusSeeOther)
}

func fmtAge(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.0fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm %02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh %02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd %02dh", int(d.Hours())/24, int(d.Hours())%24)
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000 UTC")
}

// fmtCount groups the digits of n in threes.
func fmtCount(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + fmtCount(-n)
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func fmtBytes(n int) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// shortText cuts s to about n runes, with an ellipsis.
func shortText(n int, s string) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}
