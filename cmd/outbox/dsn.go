package main

import (
	"net"
	"net/url"
	"regexp"
	"strings"

	"github.com/go-sql-driver/mysql"
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

// keyValuePassword finds the password in a key=value DSN: password=secret or
// password='a secret'.
var keyValuePassword = regexp.MustCompile(`(?i)\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|[^\s]*)`)

// postgresPassword returns the password of a PostgreSQL URL or key=value DSN.
func postgresPassword(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		if p, ok := u.User.Password(); ok {
			return p
		}
		return u.Query().Get("password")
	}
	if m := keyValuePassword.FindStringSubmatch(dsn); m != nil {
		return strings.Trim(m[1], "'")
	}
	return ""
}

// urlUserinfo matches the user:password@ of a URL that url.Parse refused.
var urlUserinfo = regexp.MustCompile(`(://[^:/@]*:)[^@]*@`)

// redactDSN returns dsn with its password replaced by redactedPassword, in every form the
// command accepts: a URL's user info and password parameter ([url.URL.Redacted]), a
// go-sql-driver DSN's user:password@, and a key=value password.
func redactDSN(dsn string) string {
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return urlUserinfo.ReplaceAllString(keyValuePassword.ReplaceAllString(dsn, "password="+redactedPassword), "${1}"+redactedPassword+"@")
		}
		if q := u.Query(); q.Has("password") {
			q.Set("password", redactedPassword)
			u.RawQuery = q.Encode()
		}
		return u.Redacted()
	}
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
	return keyValuePassword.ReplaceAllString(dsn, "password="+redactedPassword)
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
