package main

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/outboxui"
)

const uiUsage = `  outbox ui [--listen ADDR] [--token T] [--read-only] [--hide-payloads]
                                    serve the web view of the table until interrupted
  outbox ui --dsn DSN --dsn DSN... | --dsn-file F [--timeout D] [flags above]
                                    one view over several databases: a summary row per
                                    database (one that does not answer within --timeout
                                    shows its error in its row), then each one's pages

--listen defaults to 127.0.0.1:8080, reachable from this machine only. Any other address
(another interface, or all of them with :8080) also needs --token or OUTBOX_UI_TOKEN:
the view has no accounts, and the token is what keeps others out. Open the printed
address with ?token=T once (a cookie keeps you signed in), or send
"Authorization: Bearer T". Put a TLS proxy in front of anything beyond loopback.`

// uiTokenCookie keeps a browser signed in after it opened the view with ?token=.
const uiTokenCookie = "outbox_ui_token"

func runUI(ctx context.Context, c *cli, args []string) error {
	fs := c.flagSet("ui")
	listen := fs.String("listen", "127.0.0.1:8080", "address to serve on (host:port)")
	token := fs.String("token", "", "token required of every request (env OUTBOX_UI_TOKEN); needed beyond loopback")
	readOnly := fs.Bool("read-only", false, "show no replay or discard, and refuse them")
	hide := fs.Bool("hide-payloads", false, "show payload sizes, not payloads")
	timeout := fs.Duration("timeout", outboxui.DefaultDatabaseTimeout, "several databases: how long the summary waits for each")
	pos, err := c.parse(fs, uiUsage, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("ui takes no arguments, got %q", pos[0])
	}
	if *token == "" {
		*token = c.env("OUTBOX_UI_TOKEN")
	}
	c.secrets = append(c.secrets, *token)
	loopback, err := isLoopback(*listen)
	if err != nil {
		return usagef("invalid --listen %q: %v", *listen, err)
	}
	if !loopback && *token == "" {
		return usagef("--listen %s is reachable from other machines: give --token (or OUTBOX_UI_TOKEN), or listen on 127.0.0.1", *listen)
	}
	if *token != "" && len(*token) < 16 {
		return usagef("--token must be at least 16 characters")
	}
	opts := outboxui.Options{ReadOnly: *readOnly, HidePayloads: *hide, DatabaseTimeout: *timeout}
	var (
		h     http.Handler
		shown string
	)
	if len(c.global.dsns) > 1 || c.global.dsnFile != "" {
		dbs, closeAll, err := c.uiDatabases()
		if err != nil {
			return err
		}
		defer closeAll()
		if h, err = outboxui.Databases(dbs, opts); err != nil {
			return err
		}
		shown = fmt.Sprintf("%d databases", len(dbs))
	} else {
		cn, err := c.connect(ctx, needTable)
		if err != nil {
			return err
		}
		defer cn.Close()
		cn.db.SetMaxOpenConns(4) // requests side by side; each page reads on one connection at a time
		opts.Title = cn.table.Name()
		h = outboxui.Handler(cn.store, opts)
		shown = "table " + cn.table.Name() + " of " + cn.shown
	}
	if *token != "" {
		h = requireToken(*token, h)
	} else {
		h = requireLoopbackHost(h)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %v", *listen, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	mode := ""
	if *readOnly {
		mode = " (read-only)"
	}
	fmt.Fprintf(c.stdout, "outbox ui: serving %s on http://%s/%s\n", shown, ln.Addr(), mode)
	if *token != "" {
		fmt.Fprintln(c.stdout, "outbox ui: open it once with ?token=<your token>")
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving the view: %v", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("stopping the view: %v", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving the view: %v", err)
	}
	return nil
}

// uiDatabases opens a store over each database that --dsn and --dsn-file give, without
// connecting: a database that is down when the view starts shows so in its row, and
// answers once it is back. Every DSN is resolved first, so a malformed one is bad input;
// a SQLite file that does not exist is an error too, rather than a new empty database.
// Each database is named after the last part of its DSN (its database or file name).
func (c *cli) uiDatabases() ([]outboxui.Database, func(), error) {
	table, err := c.tableName()
	if err != nil {
		return nil, nil, err
	}
	srcs, err := c.sources()
	if err != nil {
		return nil, nil, err
	}
	var (
		dbs   []outboxui.Database
		pools []*sql.DB
	)
	closeAll := func() {
		for _, db := range pools {
			_ = db.Close()
		}
	}
	names := map[string]int{}
	for _, s := range srcs {
		dialect := ""
		if inferDialect(s.dsn) == "" {
			dialect = c.dialect()
		}
		t, err := resolve(dialect, s.dsn)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("%s: %w", s.where, err)
		}
		c.secrets = append(c.secrets, t.secrets()...)
		if t.sqlitePath != "" {
			if _, err := os.Stat(t.sqlitePath); err != nil {
				closeAll()
				return nil, nil, fmt.Errorf("%s: no SQLite database at %s (create it with: outbox migrate up)", s.where, t.sqlitePath)
			}
		}
		db, err := sql.Open(t.driver, t.dsn)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("%s: cannot open %s: %v", s.where, t.shown, err)
		}
		pools = append(pools, db)
		db.SetMaxOpenConns(2)
		d := map[string]func() outbox.Dialect{"postgres": outbox.Postgres, "mysql": outbox.MySQL, "sqlite": outbox.SQLite}[t.dialect]
		store, err := outbox.New(db, d(), outbox.Options{Table: table.Name()})
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		name := dsnName(t.shown)
		if names[name]++; names[name] > 1 {
			name = fmt.Sprintf("%s-%d", name, names[name])
		}
		dbs = append(dbs, outboxui.Database{Name: name, Detail: t.shown, Store: store})
	}
	return dbs, closeAll, nil
}

// dsnName names a database after the last part of its DSN, before any query: a file name
// without its extension, or a database name; characters a name may not hold become "-".
func dsnName(shown string) string {
	s, _, _ := strings.Cut(shown, "?")
	s = s[strings.LastIndexAny(s, "/:")+1:]
	for _, ext := range []string{".sqlite3", ".sqlite", ".db"} {
		s = strings.TrimSuffix(s, ext)
	}
	s = strings.Map(func(r rune) rune {
		if r < 128 && (r == '.' || r == '_' || r == '-' || r == '~' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return r
		}
		return '-'
	}, s)
	if len(s) > 56 {
		s = s[:56]
	}
	if s == "" {
		return "db"
	}
	return s
}

// isLoopback reports whether every address that addr (host:port) listens on is a loopback
// one: 127.0.0.0/8, ::1 or localhost. An empty host means every interface.
func isLoopback(addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, err
	}
	if host == "localhost" {
		return true, nil
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback(), nil
}

// requireLoopbackHost refuses the requests whose Host is not a loopback name or address.
// Without a token, being on loopback is all that keeps others out; but a page on another
// site can point a name of its own at 127.0.0.1 (DNS rebinding), and its requests then
// reach the view as same-origin ones, which neither CrossOriginProtection nor the form
// token tells from the operator's. Such requests carry that name as their Host.
func requireLoopbackHost(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
		ip := net.ParseIP(host)
		if !strings.EqualFold(host, "localhost") && (ip == nil || !ip.IsLoopback()) {
			http.Error(w, "outbox ui: refused: without --token the view answers only to localhost, 127.0.0.1 or [::1] in the address", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// requireToken lets through the requests that carry token: as a bearer token, in the
// cookie it sets, or once as ?token= (answered with the cookie and a redirect to the same
// address without it, so the token leaves the address bar and the history). Others get
// 401 Unauthorized.
//
// The cookie holds the SHA-256 of the token in hex, not the token: any token, whatever its
// characters, makes a valid cookie value, and the cookie alone does not give the token away.
func requireToken(token string, next http.Handler) http.Handler {
	eq := func(s string) bool { return subtle.ConstantTimeCompare([]byte(s), []byte(token)) == 1 }
	sum := sha256.Sum256([]byte(token))
	cookieValue := hex.EncodeToString(sum[:])
	eqCookie := func(s string) bool { return subtle.ConstantTimeCompare([]byte(s), []byte(cookieValue)) == 1 }
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && eq(bearer) {
			next.ServeHTTP(w, r)
			return
		}
		if c, err := r.Cookie(uiTokenCookie); err == nil && eqCookie(c.Value) {
			next.ServeHTTP(w, r)
			return
		}
		if q := r.URL.Query(); q.Has("token") && eq(q.Get("token")) && r.Method == http.MethodGet {
			http.SetCookie(w, &http.Cookie{Name: uiTokenCookie, Value: cookieValue, Path: "/", HttpOnly: true,
				SameSite: http.SameSiteLaxMode, Secure: r.TLS != nil})
			q.Del("token")
			u := url.URL{Path: r.URL.Path, RawQuery: q.Encode()}
			if !strings.HasPrefix(u.Path, "/") || strings.HasPrefix(u.Path, "//") {
				u.Path = "/" // never a redirect to another host
			}
			http.Redirect(w, r, u.String(), http.StatusSeeOther)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="outbox ui"`)
		http.Error(w, "outbox ui: unauthorized: open the address with ?token=<token> once, or send Authorization: Bearer <token>", http.StatusUnauthorized)
	})
}
