package main

import (
	"errors"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
)

// redactedPassword replaces a password wherever a DSN is printed, as [url.URL.Redacted] does.
const redactedPassword = "xxxxx"

// sqliteParams are the connection settings the library documents for SQLite: WAL, a busy
// timeout and immediate transactions. They are added to a SQLite DSN that has none.
const sqliteParams = "_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate"

// target is a resolved database: the dialect, the driver name and DSN to open, and the DSN
// as it may be shown.
type target struct {
	dialect string // "postgres", "mysql" or "sqlite"
	driver  string // the database/sql driver name
	dsn     string
	// shown is the DSN with its password replaced by redactedPassword.
	shown string
	// password is the DSN's password, "" when none; it is never printed.
	password string
	// sslPassword is a PostgreSQL DSN's sslpassword (its client key's), "" when none; it
	// is never printed either.
	sslPassword string
	// sqlitePath is the SQLite database file, "" for an in-memory database.
	sqlitePath string
}

var drivers = map[string]string{"postgres": "pgx", "mysql": "mysql", "sqlite": "sqlite"}

// resolve turns the --dialect and --dsn values into a target. An empty dialect is inferred
// from the DSN's form.
func resolve(dialect, dsn string) (target, error) {
	if dsn == "" {
		return target{}, usagef("no database given: pass --dsn or set OUTBOX_DSN")
	}
	inferred := inferDialect(dsn)
	switch {
	case dialect == "" && inferred == "":
		return target{}, usagef("cannot tell the database from the DSN %s: pass --dialect postgres, mysql or sqlite", redactDSN(dsn))
	case dialect == "":
		dialect = inferred
	case drivers[dialect] == "":
		return target{}, usagef("unknown dialect %q: use postgres, mysql or sqlite", dialect)
	case inferred != "" && inferred != dialect && hasScheme(dsn):
		return target{}, usagef("--dialect %s does not match the DSN %s", dialect, redactDSN(dsn))
	}
	t := target{dialect: dialect, driver: drivers[dialect]}
	switch dialect {
	case "postgres":
		t.dsn = dsn
		t.password = postgresPassword(dsn)
		t.sslPassword = postgresSSLPassword(dsn)
		// Parse it as the driver will, so that a DSN it cannot use is bad input (exit 2),
		// not a failed connection.
		if err := checkPostgresDSN(dsn); err != nil {
			return target{}, err
		}
	case "mysql":
		cfg, err := mysqlConfig(dsn)
		if err != nil {
			return target{}, err
		}
		// goose reads its version table's timestamps into time.Time (migrate status); the
		// library itself reads times as integers and ignores parseTime.
		cfg.ParseTime = true
		t.dsn = cfg.FormatDSN()
		t.password = cfg.Passwd
	case "sqlite":
		t.dsn, t.sqlitePath = sqliteDSN(dsn)
	}
	t.shown = redactDSN(dsn)
	return t, nil
}

// hasScheme reports whether dsn names its database with a URL scheme or prefix.
func hasScheme(dsn string) bool {
	l := strings.ToLower(dsn)
	for _, p := range []string{"postgres://", "postgresql://", "mysql://", "sqlite:", "file:"} {
		if strings.HasPrefix(l, p) {
			return true
		}
	}
	return false
}

// inferDialect names the database a DSN is for, or "" when its form does not tell.
func inferDialect(dsn string) string {
	l := strings.ToLower(dsn)
	switch {
	case strings.HasPrefix(l, "postgres://"), strings.HasPrefix(l, "postgresql://"):
		return "postgres"
	case strings.HasPrefix(l, "mysql://"):
		return "mysql"
	case strings.HasPrefix(l, "sqlite:"), strings.HasPrefix(l, "file:"):
		return "sqlite"
	case strings.Contains(l, "@tcp("), strings.Contains(l, "@unix("),
		strings.HasPrefix(l, "tcp("), strings.HasPrefix(l, "unix("):
		return "mysql" // go-sql-driver's user:pass@tcp(host:port)/db
	case keyValuePassword.MatchString(dsn) || strings.Contains(l, "host=") || strings.Contains(l, "dbname="):
		return "postgres" // libpq's key=value form
	case strings.HasSuffix(l, ".db"), strings.HasSuffix(l, ".sqlite"), strings.HasSuffix(l, ".sqlite3"):
		return "sqlite" // a bare path to a database file
	}
	return ""
}

// mysqlConfig parses a mysql:// URL or a go-sql-driver DSN. A URL's query parameters are
// go-sql-driver's parameters.
func mysqlConfig(dsn string) (*mysql.Config, error) {
	if !strings.HasPrefix(strings.ToLower(dsn), "mysql://") {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			return nil, usagef("invalid MySQL DSN %s: %v (want user:pass@tcp(host:port)/db or mysql://user:pass@host:port/db)", redactDSN(dsn), err)
		}
		return cfg, nil
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, usagef("invalid MySQL URL %s: want mysql://user:pass@host:port/db", redactDSN(dsn))
	}
	host := u.Host
	if host == "" {
		host = "127.0.0.1:3306"
	} else if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "3306")
	}
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" || strings.Contains(db, "/") {
		return nil, usagef("invalid MySQL URL %s: name one database, as in mysql://user:pass@host:port/db", redactDSN(dsn))
	}
	// go-sql-driver finds the database after the last '/', so one in a parameter value
	// must be escaped; the driver unescapes the values that may hold one (loc, time_zone).
	query := strings.ReplaceAll(u.RawQuery, "/", "%2F")
	base := "tcp(" + host + ")/" + db
	if query != "" {
		base += "?" + query
	}
	cfg, err := mysql.ParseDSN(base)
	if err != nil {
		return nil, usagef("invalid MySQL URL %s: %v", redactDSN(dsn), err)
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	return cfg, nil
}

// sqliteDSN returns the DSN to open for a sqlite:, file: or bare-path DSN, and the file
// it names. A DSN without parameters gets the documented ones (sqliteParams).
func sqliteDSN(dsn string) (open, path string) {
	rest := dsn
	if l := strings.ToLower(rest); strings.HasPrefix(l, "sqlite://") {
		rest = rest[len("sqlite://"):]
	} else if strings.HasPrefix(l, "sqlite:") {
		rest = rest[len("sqlite:"):]
	}
	if !strings.HasPrefix(strings.ToLower(rest), "file:") {
		rest = "file:" + rest
	}
	p, query, _ := strings.Cut(rest[len("file:"):], "?")
	if strings.HasPrefix(p, "///") {
		p = p[2:] // file:///abs/path
	}
	if query == "" {
		rest = "file:" + p + "?" + sqliteParams
	}
	if p == ":memory:" || strings.Contains(query, "mode=memory") {
		p = ""
	}
	return rest, p
}

// kvSpace is the white space that separates a key=value DSN's pairs, as libpq (isspace) and
// pgx read it: with the vertical tab, which regexp's \s leaves out.
const kvSpace = " \t\n\v\f\r"

// kvSpaceClass is kvSpace as a regexp class.
const kvSpaceClass = `[ \t\n\v\f\r]`

// keyValuePassword finds the password in a key=value DSN as libpq reads it: password=secret
// or password='a secret'. The secret may also be sslpassword's.
var keyValuePassword = regexp.MustCompile(`(?i)\b(?:ssl)?password` + kvSpaceClass + `*=` + kvSpaceClass + `*('(?:[^'\\]|\\.)*'|[^ \t\n\v\f\r]*)`)

// passwordKey finds where a password's value begins in a key=value DSN.
var passwordKey = regexp.MustCompile(`(?i)(?:^|` + kvSpaceClass + `)(?:ssl)?password` + kvSpaceClass + `*=` + kvSpaceClass + `*`)

// nextKey finds the start of the next key=value pair.
var nextKey = regexp.MustCompile(kvSpaceClass + `+[A-Za-z_][A-Za-z0-9_]*` + kvSpaceClass + `*=`)

// passwordSpans returns where each password value of a key=value DSN lies, by key, whatever
// the rest of the DSN: from after "password=" to the next " key=" (or the end), so that
// what libpq would refuse (password=s3cret pw, an unterminated quote) is covered whole. A
// quoted value that is closed ends no sooner than its closing quote, even if it holds what
// looks like a key.
func passwordSpans(dsn string) [][2]int {
	var spans [][2]int
	for _, m := range passwordKey.FindAllStringIndex(dsn, -1) {
		start, from := m[1], m[1]
		if start < len(dsn) && dsn[start] == '\'' {
			from = len(dsn) // unterminated: the rest may all be the password
			for i := start + 1; i < len(dsn); i++ {
				if dsn[i] == '\\' {
					i++
				} else if dsn[i] == '\'' {
					from = i + 1
					break
				}
			}
		}
		end := len(dsn)
		if n := nextKey.FindStringIndex(dsn[from:]); n != nil {
			end = from + n[0]
		}
		if len(spans) > 0 && start < spans[len(spans)-1][1] {
			continue // inside the previous value
		}
		spans = append(spans, [2]int{start, end})
	}
	return spans
}

// redactKeyValue replaces every password value of a key=value DSN (passwordSpans).
func redactKeyValue(dsn string) string {
	spans := passwordSpans(dsn)
	for i := len(spans) - 1; i >= 0; i-- {
		dsn = dsn[:spans[i][0]] + redactedPassword + dsn[spans[i][1]:]
	}
	return dsn
}

// keyValueSecrets returns the password values of a key=value DSN as passwordSpans finds
// them, each word of them as a parser quotes it (0'00) and each part between its quotes,
// longest first, to scrub from messages that quote the DSN: a longer secret is replaced
// before a part of it can break it up.
func keyValueSecrets(dsn string) []string {
	var out []string
	for _, sp := range passwordSpans(dsn) {
		v := dsn[sp[0]:sp[1]]
		out = append(out, v, strings.Trim(v, "'"))
		for _, w := range strings.FieldsFunc(v, func(r rune) bool { return strings.ContainsRune(kvSpace, r) }) {
			out = append(out, w)
			out = append(out, strings.FieldsFunc(w, func(r rune) bool { return r == '\'' })...)
		}
	}
	slices.SortStableFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// queryPassword reports whether dsn parses as a URL with a scheme, "//" or not, and a
// password or sslpassword in its query: postgresPassword reads "x:?password=secret" as such
// a URL, so redactDSN must hide it as one.
func queryPassword(dsn string) bool {
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme == "" {
		return false
	}
	q := u.Query()
	return q.Has("password") || q.Has("sslpassword")
}

// postgresPassword returns the password of a PostgreSQL URL or key=value DSN.
func postgresPassword(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		if p, ok := u.User.Password(); ok {
			return p
		}
		return u.Query().Get("password")
	}
	if cfg, err := pgconn.ParseConfig(dsn); err == nil {
		return cfg.Password
	}
	if m := keyValuePassword.FindStringSubmatch(dsn); m != nil {
		return strings.Trim(m[1], "'")
	}
	return ""
}

// postgresSSLPassword returns the sslpassword of a PostgreSQL URL or key=value DSN.
func postgresSSLPassword(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		return u.Query().Get("sslpassword")
	}
	for _, m := range keyValuePassword.FindAllStringSubmatch(dsn, -1) {
		if strings.HasPrefix(strings.ToLower(m[0]), "ssl") {
			return strings.Trim(m[1], "'")
		}
	}
	return ""
}

// checkPostgresDSN parses dsn as pgx will when it connects, and returns a usage error that
// says what is wrong with it and shows it redacted. pgx's own message quotes the DSN with a
// redaction of its own, which misses passwords in DSNs it cannot parse; only its reason is
// kept.
func checkPostgresDSN(dsn string) error {
	_, err := pgconn.ParseConfig(dsn)
	if err == nil {
		return nil
	}
	reason := err.Error()
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		// "cannot parse `<dsn>`: <reason>"
		if i := strings.LastIndex(reason, "`: "); i >= 0 {
			reason = reason[i+len("`: "):]
		}
	}
	for _, s := range append(keyValueSecrets(dsn), postgresPassword(dsn)) {
		if len(s) >= 4 {
			reason = strings.ReplaceAll(reason, s, redactedPassword)
		}
	}
	return usagef("invalid PostgreSQL DSN %s: %s (want postgres://user:pass@host:5432/db or host=... user=... dbname=...)",
		redactDSN(dsn), reason)
}

// urlScheme matches the scheme that starts a URL. A go-sql-driver DSN whose password holds
// "://" has none: what precedes it holds the user's ':'.
var urlScheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://`)

// urlUserinfo matches the user:password@ of a URL that url.Parse refused.
var urlUserinfo = regexp.MustCompile(`(://[^:/@]*:)[^@]*@`)

// redactDSN returns dsn with its password replaced by redactedPassword, in every form the
// command accepts: a URL's user info and password parameter ([url.URL.Redacted]), a
// go-sql-driver DSN's user:password@, and a key=value password; sslpassword too.
func redactDSN(dsn string) string {
	if urlScheme.MatchString(dsn) || queryPassword(dsn) {
		shown := redactURL(dsn)
		// A scheme the command does not know ("a://user@/") may be a go-sql-driver DSN to
		// --dialect mysql, whose password is what follows the first ':' ("//user"): hide that
		// too when the URL's reading left it in view, whether or not it parsed as a URL.
		if cfg, err := mysql.ParseDSN(dsn); err == nil && cfg.Passwd != "" && strings.Contains(shown, cfg.Passwd) {
			cfg.Passwd = redactedPassword
			return cfg.FormatDSN()
		}
		return shown
	}
	dsn = redactKeyValue(dsn) // by key, before any other reading of the DSN
	if cfg, err := mysql.ParseDSN(dsn); err == nil && strings.Contains(dsn, "@") {
		if cfg.Passwd != "" {
			cfg.Passwd = redactedPassword
			dsn = cfg.FormatDSN()
		}
	} else if strings.Contains(dsn, "@") {
		// Neither a URL nor a DSN go-sql-driver accepts: hide whatever precedes the last '@'
		// after the first ':'.
		at := strings.LastIndex(dsn, "@")
		if colon := strings.Index(dsn[:at], ":"); colon >= 0 {
			dsn = dsn[:colon+1] + redactedPassword + dsn[at:]
		}
	}
	return dsn
}

// redactURL hides the password of a URL DSN: its userinfo's and the password and sslpassword
// query parameters. A DSN that does not parse as a URL has them replaced where they are written.
func redactURL(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		dsn = keyValuePassword.ReplaceAllStringFunc(dsn, func(m string) string {
			key, _, _ := strings.Cut(m, "=")
			return key + "=" + redactedPassword
		})
		return urlUserinfo.ReplaceAllString(dsn, "${1}"+redactedPassword+"@")
	}
	if q := u.Query(); q.Has("password") || q.Has("sslpassword") {
		for _, k := range []string{"password", "sslpassword"} {
			if q.Has(k) {
				q.Set(k, redactedPassword)
			}
		}
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// secretsOf returns the strings to scrub from anything printed: the password as written
// and as a URL would escape it. Passwords shorter than 4 bytes are left out, since removing
// every occurrence of such a short string would garble messages; no message of the command
// contains a DSN unredacted in the first place.
func secretsOf(password string) []string {
	if len(password) < 4 {
		return nil
	}
	return []string{password, url.QueryEscape(password), url.PathEscape(password)}
}
