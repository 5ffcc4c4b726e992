package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestResolve(t *testing.T) {
	t.Parallel()
	cases := []struct {
		dialect, dsn       string
		wantDialect, open  string
		wantPath, password string
	}{
		{"", "postgres://u:pw@db:5432/app?sslmode=disable", "postgres", "postgres://u:pw@db:5432/app?sslmode=disable", "", "pw"},
		{"", "postgresql://u@db/app?password=qs-secret", "postgres", "postgresql://u@db/app?password=qs-secret", "", "qs-secret"},
		{"postgres", "host=db user=u password='a b' dbname=app", "postgres", "host=db user=u password='a b' dbname=app", "", "a b"},
		{"", "host=db dbname=app", "postgres", "host=db dbname=app", "", ""},
		{"", "mysql://root:p%40ss%2Fw@db:3307/app?interpolateParams=true&loc=Europe/Paris", "mysql",
			"root:p@ss/w@tcp(db:3307)/app?interpolateParams=true&loc=Europe%2FParis&parseTime=true", "", "p@ss/w"},
		{"", "mysql://root@db/app", "mysql", "root@tcp(db:3306)/app?parseTime=true", "", ""},
		{"mysql", "root@tcp(127.0.0.1:3306)/test", "mysql", "root@tcp(127.0.0.1:3306)/test?parseTime=true", "", ""},
		{"", "u:pw@tcp(127.0.0.1:3306)/test", "mysql", "u:pw@tcp(127.0.0.1:3306)/test?parseTime=true", "", "pw"},
		{"", "sqlite:app.db", "sqlite", "file:app.db?" + sqliteParams, "app.db", ""},
		{"", "sqlite:///var/lib/app.db", "sqlite", "file:/var/lib/app.db?" + sqliteParams, "/var/lib/app.db", ""},
		{"", "file:app.db?_pragma=busy_timeout(5000)", "sqlite", "file:app.db?_pragma=busy_timeout(5000)", "app.db", ""},
		{"sqlite", "/tmp/app.db", "sqlite", "file:/tmp/app.db?" + sqliteParams, "/tmp/app.db", ""},
		{"sqlite", ":memory:", "sqlite", "file::memory:?" + sqliteParams, "", ""},
		{"", "data/app.sqlite3", "sqlite", "file:data/app.sqlite3?" + sqliteParams, "data/app.sqlite3", ""},
	}
	for _, tc := range cases {
		got, err := resolve(tc.dialect, tc.dsn)
		require.NoError(t, err, tc.dsn)
		require.Equal(t, tc.wantDialect, got.dialect, tc.dsn)
		require.Equal(t, tc.open, got.dsn, tc.dsn)
		require.Equal(t, tc.wantPath, got.sqlitePath, tc.dsn)
		require.Equal(t, tc.password, got.password, tc.dsn)
		if tc.password != "" {
			require.NotContains(t, got.shown, tc.password, tc.dsn)
			require.Contains(t, got.shown, redactedPassword, tc.dsn)
		}
	}
	for _, tc := range []struct{ dialect, dsn, want string }{
		{"", "", "pass --dsn or set OUTBOX_DSN"},
		{"", "app", "pass --dialect"},
		{"oracle", "app.db", "unknown dialect"},
		{"mysql", "postgres://u:pw@db/app", "does not match"},
		{"", "mysql://u:pw@db", "name one database"},
		{"mysql", "u:pw@db/app?x", "invalid MySQL DSN"},
	} {
		_, err := resolve(tc.dialect, tc.dsn)
		require.ErrorContains(t, err, tc.want, tc.dsn)
		require.NotContains(t, err.Error(), ":pw@", tc.dsn)
	}
}

func TestRedactDSN(t *testing.T) {
	t.Parallel()
	for dsn, want := range map[string]string{
		"postgres://u:s3cret@db:5432/app?sslmode=disable":     "postgres://u:xxxxx@db:5432/app?sslmode=disable",
		"postgres://u@db/app?password=s3cret&sslmode=require": "postgres://u@db/app?password=xxxxx&sslmode=require",
		"mysql://root:s3cret@db:3306/app":                     "mysql://root:xxxxx@db:3306/app",
		"root:s3cret@tcp(db:3306)/app?parseTime=true":         "root:xxxxx@tcp(db:3306)/app?parseTime=true",
		"root@tcp(db:3306)/app":                               "root@tcp(db:3306)/app",
		"host=db user=u password=s3cret dbname=app":           "host=db user=u password=xxxxx dbname=app",
		"host=db password='s3 cret' dbname=app":               "host=db password=xxxxx dbname=app",
		"postgres://u:s3cret@db:bad-port/app":                 "postgres://u:xxxxx@db:bad-port/app",
		"weird:s3cret@nowhere":                                "weird:xxxxx@nowhere",
		"sqlite:/var/lib/app.db":                              "sqlite:/var/lib/app.db",
		// pgx's sslpassword (the client key's) is a secret too, in a URL as in key=value.
		"postgres://u@db/app?sslpassword=s3cret": "postgres://u@db/app?sslpassword=xxxxx",
		// A go-sql-driver DSN whose password holds "://" is not a URL.
		"root:a://s3cret@tcp(db:3306)/app": "root:xxxxx@tcp(db:3306)/app",
	} {
		require.Equal(t, want, redactDSN(dsn), dsn)
	}
}

// TestPasswordNeverPrinted runs the command with DSNs whose password must not appear in
// anything it prints: errors of servers that do not answer, of malformed DSNs, and help
// (whose defaults never come from the environment).
func TestPasswordNeverPrinted(t *testing.T) {
	t.Parallel()
	const pw = "Sup3r-S3cret"
	dsns := []struct{ dialect, dsn string }{
		{"", "postgres://postgres:" + pw + "@127.0.0.1:1/test?sslmode=disable&connect_timeout=5"},
		{"", "postgres://postgres@127.0.0.1:1/test?sslmode=disable&password=" + pw},
		{"postgres", "host=127.0.0.1 port=1 user=postgres password=" + pw + " dbname=test sslmode=disable"},
		{"", "mysql://root:" + pw + "@127.0.0.1:1/test?timeout=5s"},
		{"", "root:" + pw + "@tcp(127.0.0.1:1)/test?timeout=5s"},
		{"mysql", "root:" + pw + "@tcp(127.0.0.1:1)/"},
		{"", "mysql://root:" + pw + "@127.0.0.1:1"},
		{"", "postgres://postgres:" + pw + "@127.0.0.1:bad/test"},
		{"", "root:" + pw + "@127.0.0.1:3306/test"},
	}
	for _, d := range dsns {
		for _, args := range [][]string{{"stats"}, {"stats", "--json"}, {"migrate", "up"}, {"dead", "list"}} {
			r := runCLI(t, nil, append([]string{"--dialect", d.dialect, "--dsn", d.dsn}, args...)...)
			require.NotEqual(t, 0, r.code)
			require.NotContains(t, r.stdout+r.stderr, pw, "%s %v", d.dsn, args)
			require.Equal(t, 1, strings.Count(r.stderr, "\n"), "one error line: %q", r.stderr)
			// The same through the environment.
			r = runCLI(t, map[string]string{"OUTBOX_DIALECT": d.dialect, "OUTBOX_DSN": d.dsn}, args...)
			require.NotEqual(t, 0, r.code)
			require.NotContains(t, r.stdout+r.stderr, pw, "%s %v", d.dsn, args)
		}
	}
	env := map[string]string{"OUTBOX_DSN": dsns[0].dsn}
	for _, args := range [][]string{{"help"}, {"--help"}, {"help", "purge"}, {"dead", "-h"}, {}} {
		r := runCLI(t, env, args...)
		require.NotContains(t, r.stdout+r.stderr, pw)
		require.Contains(t, r.stdout+r.stderr, "Usage:")
		// A --dsn given before the help request is not shown as a default either.
		r = runCLI(t, nil, append([]string{"--dsn", dsns[0].dsn}, args...)...)
		require.NotContains(t, r.stdout+r.stderr, pw, "%v", args)
		require.Contains(t, r.stdout+r.stderr, "Usage:")
	}
	r := runCLI(t, nil, "--dsn", dsns[0].dsn, "stats", "--help")
	require.NotContains(t, r.stdout+r.stderr, pw)
	require.Contains(t, r.stdout, "-dsn string")
}

// FuzzResolve: resolving and redacting any DSN never panics, and a password that appears
// once in the DSN never appears in the form the command prints, nor in its error. In a
// key=value DSN the password is taken by key, as a person reading the DSN would: every word
// after "password=" up to the next word with a "=" in it, so that a malformed value
// (password=s3cret tail, an unterminated or misplaced quote) is covered whole.
func FuzzResolve(f *testing.F) {
	for _, s := range []string{
		"host=db password=s3cret longtail dbname=x",
		"host=db password='s3cret longtail dbname=x",
		"host=db password='s3cret' longtail dbname=x",
		"host=db password=s3'cret longtail' dbname=x",
		"host=db sslpassword=s3cret longtail dbname=x",
		"postgres://u:pw-secret@db:5432/app?sslmode=disable",
		"postgres://u@db/app?password=pw-secret",
		"host=db password='pw secret' dbname=app",
		"mysql://root:pw%40secret@db:3306/app?loc=Europe/Paris",
		"root:pw-secret@tcp(db:3306)/app",
		"sqlite:app.db", "file:app.db?_pragma=busy_timeout(5000)", "app.db", "",
	} {
		f.Add("", s)
		f.Add("mysql", s)
	}
	f.Fuzz(func(t *testing.T, dialect, dsn string) {
		tg, err := resolve(dialect, dsn)
		shown := redactDSN(dsn)
		if err != nil {
			shown = err.Error()
		} else if tg.shown != shown {
			t.Fatalf("shown %q, redactDSN %q", tg.shown, shown)
		}
		if err == nil && len(tg.password) >= 6 && strings.Count(dsn, tg.password) == 1 && strings.Contains(shown, tg.password) {
			t.Fatalf("password %q of %q printed as %q", tg.password, dsn, shown)
		}
		if strings.Contains(dsn, "://") {
			return // a URL's password is its user info or query parameter, checked above
		}
		for _, w := range passwordWords(dsn) {
			if len(w) < 4 || strings.Count(dsn, w) != 1 {
				continue
			}
			if strings.Contains(redactDSN(dsn), w) {
				t.Fatalf("password word %q of %q redacted as %q", w, dsn, redactDSN(dsn))
			}
			// A word the message holds whatever the password is comes from the message's own
			// text ("dbname=" in a hint), not from the DSN.
			other := strings.Replace(dsn, w, strings.Repeat("Q", len(w)), 1)
			_, err2 := resolve(dialect, other)
			if err != nil && strings.Contains(shown, w) && (err2 == nil || !strings.Contains(err2.Error(), w)) {
				t.Fatalf("password word %q of %q printed as %q", w, dsn, shown)
			}
		}
	})
}

// passwordWords returns, for a key=value DSN, each word of each password value read by key:
// the rest of the word that begins with "password=" (or "sslpassword="), and every word after
// it up to the next key (a word that holds a "=" or is followed by one), without quotes. It is deliberately simpler than the
// command's own reading (passwordSpans), which it checks.
func passwordWords(dsn string) []string {
	var out []string
	in := false
	words := strings.FieldsFunc(dsn, func(r rune) bool { return strings.ContainsRune(kvSpace, r) }) // as libpq splits pairs
	for i, w := range words {
		l := strings.ToLower(w)
		switch {
		case strings.HasPrefix(l, "password=") || strings.HasPrefix(l, "sslpassword="):
			in = true
			_, w, _ = strings.Cut(w, "=")
		case strings.Contains(w, "="), i+1 < len(words) && strings.HasPrefix(words[i+1], "="): // key=v, key =v
			in = false
		}
		if in {
			out = append(out, strings.Trim(w, "'"))
		}
	}
	return out
}
