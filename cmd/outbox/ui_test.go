package main

import (
	"bytes"
	"context"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
)

// syncBuffer is a bytes.Buffer that the command's goroutine writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var servingRE = regexp.MustCompile(`serving (?:table \S+ of .*|\d+ databases) on (http://\S+/)`)

// serveUI starts outbox ui with the global flags dsn and the ui flags args on a free
// loopback port and returns its address, and
// a stop function that interrupts it and returns its exit code.
func serveUI(t *testing.T, env map[string]string, dsn string, args ...string) (base string, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"--dsn", dsn, "ui", "--listen", "127.0.0.1:0"}, args...), func(k string) string { return env[k] }, &out, &errb)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m := servingRE.FindStringSubmatch(out.String()); m != nil {
			base = m[1]
			break
		}
		select {
		case code := <-done:
			cancel()
			t.Fatalf("outbox ui exited with %d: %s", code, errb.String())
		default:
		}
		require.True(t, time.Now().Before(deadline), "outbox ui did not start: %s %s", out.String(), errb.String())
		time.Sleep(10 * time.Millisecond)
	}
	var once sync.Once
	code := -1
	stop = func() int {
		once.Do(func() {
			cancel()
			select {
			case code = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("outbox ui did not stop")
			}
		})
		return code
	}
	t.Cleanup(func() { stop() })
	return base, stop
}

// TestUIToken: with a token, every request without it is refused; ?token= signs a browser
// in once, with a cookie, and the view then works, actions included.
func TestUIToken(t *testing.T) {
	const token = `correct horse; "battery" \ stäple` // characters a cookie value cannot hold
	forEachBackend(t, func(t *testing.T, f *fixture) {
		s := f.seed(t)
		base, stop := serveUI(t, map[string]string{"OUTBOX_UI_TOKEN": token}, f.dsn)
		jar, err := cookiejar.New(nil)
		require.NoError(t, err)
		client := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		get := func(path string, hdr ...string) (*http.Response, string) {
			req, err := http.NewRequest(http.MethodGet, base+strings.TrimPrefix(path, "/"), nil)
			require.NoError(t, err)
			for i := 0; i+1 < len(hdr); i += 2 {
				req.Header.Set(hdr[i], hdr[i+1])
			}
			res, err := client.Do(req)
			require.NoError(t, err)
			defer res.Body.Close()
			b, err := io.ReadAll(res.Body)
			require.NoError(t, err)
			return res, string(b)
		}
		for _, path := range []string{"/", "/dead", "/static/style.css", "/?token=wrong-token-of-some-length", "/message/" + s.dead1.String()} {
			res, body := get(path)
			require.Equal(t, http.StatusUnauthorized, res.StatusCode, path)
			require.NotContains(t, body, "order.placed", path)
		}
		res, _ := get("/", "Authorization", "Bearer "+token)
		require.Equal(t, http.StatusOK, res.StatusCode, "a bearer token")
		res, _ = get("/", "Authorization", "Bearer wrong")
		require.Equal(t, http.StatusUnauthorized, res.StatusCode)

		res, _ = get("/dead?ns=shop&token=" + url.QueryEscape(token))
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		for _, c := range res.Cookies() {
			require.NotContains(t, c.Value, "horse", "the cookie does not carry the token itself")
		}
		require.Equal(t, "/dead?ns=shop", res.Header.Get("Location"), "the token leaves the address")
		res, body := get("/dead?ns=shop")
		require.Equal(t, http.StatusOK, res.StatusCode, "the cookie signs the browser in")
		require.Contains(t, body, s.dead1.String())

		m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(body)
		require.NotNil(t, m)
		form := url.Values{"csrf": {html.UnescapeString(m[1])}, "action": {"replay"}, "id": {s.dead1.String()}}
		req, err := http.NewRequest(http.MethodPost, base+"dead/selected", strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		res, err = client.Do(req)
		require.NoError(t, err)
		_ = res.Body.Close()
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		rec, err := f.store.Get(context.Background(), s.dead1)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusPending, rec.Status, "replayed through the view")

		require.Equal(t, 0, stop(), "an interrupt stops the view cleanly")
	})
}

// TestUIReadOnly: --read-only serves a view without actions, on loopback without a token.
func TestUIReadOnly(t *testing.T) {
	f := setup(t, "sqlite")
	s := f.seed(t)
	base, stop := serveUI(t, nil, f.dsn, "--read-only")
	res, err := http.Get(base + "message/" + s.dead1.String())
	require.NoError(t, err)
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, string(b), "read-only")
	require.NotContains(t, string(b), `method="post"`)
	require.Equal(t, 0, stop())
}

// TestUIRefusesOpenListen: an address beyond loopback needs a token, of some length, and
// bad input fails before anything is served.
func TestUIRefusesOpenListen(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"ui", "--listen", "0.0.0.0:0"}, nil, "give --token"},
		{[]string{"ui", "--listen", ":8080"}, nil, "give --token"},
		{[]string{"ui", "--listen", "[::]:0"}, nil, "give --token"},
		{[]string{"ui", "--listen", "0.0.0.0:0", "--token", "short"}, nil, "at least 16"},
		{[]string{"ui", "--listen", "0.0.0.0:0"}, map[string]string{"OUTBOX_UI_TOKEN": "tiny"}, "at least 16"},
		{[]string{"ui", "--listen", "nonsense"}, nil, "invalid --listen"},
		{[]string{"ui", "extra"}, nil, "takes no arguments"},
	} {
		r := runCLI(t, tc.env, append([]string{"--dsn", "sqlite:/nonexistent/outbox.db"}, tc.args...)...)
		require.Equal(t, exitUsage, r.code, "%v: %s", tc.args, r.stderr)
		require.Contains(t, r.stderr, tc.want, tc.args)
		require.NotContains(t, r.stderr, "tiny", "the token is never printed")
	}
	ok, err := isLoopback("localhost:80")
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = isLoopback("[::1]:80")
	require.NoError(t, err)
	require.True(t, ok)
}

// TestUIRefusesForeignHost: on loopback without a token, a request that names another host
// is refused. A page on another site can point a name of its own at 127.0.0.1 (DNS
// rebinding) and read and drive the view as its own origin, which neither
// CrossOriginProtection nor the form token can tell from the operator's browser.
func TestUIRefusesForeignHost(t *testing.T) {
	f := setup(t, "sqlite")
	s := f.seed(t)
	base, stop := serveUI(t, nil, f.dsn)
	u, err := url.Parse(base)
	require.NoError(t, err)
	get := func(host string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, base+"message/"+s.dead1.String(), nil)
		require.NoError(t, err)
		req.Host = host
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(b)
	}
	for _, host := range []string{"rebind.attacker.example:" + u.Port(), "rebind.attacker.example", "127.0.0.1.attacker.example:" + u.Port()} {
		code, body := get(host)
		require.Equal(t, http.StatusForbidden, code, host)
		require.NotContains(t, body, s.dead1.String(), host)
	}
	for _, host := range []string{u.Host, "localhost:" + u.Port(), "127.0.0.1", "[::1]:" + u.Port()} {
		code, body := get(host)
		require.Equal(t, http.StatusOK, code, host)
		require.Contains(t, body, s.dead1.String(), host)
	}
	require.Equal(t, 0, stop())
}

// TestUIManyDatabases: outbox ui over --dsn given twice and a --dsn-file serves a summary
// row per database, one whose server is down among them, and each database's pages.
func TestUIManyDatabases(t *testing.T) {
	t.Parallel()
	a, b, pg := setup(t, "sqlite"), setup(t, "sqlite"), setup(t, "postgres")
	a.seed(t)
	file := filepath.Join(t.TempDir(), "dsns")
	require.NoError(t, os.WriteFile(file, []byte("# tenants\n"+pg.dsn+"\npostgres://postgres:secret-pw@127.0.0.1:1/gone?connect_timeout=2\n"), 0o600))
	base, stop := serveUI(t, nil, a.dsn, "--dsn", b.dsn, "--dsn-file", file, "--timeout", "5s")
	res, err := http.Get(base)
	require.NoError(t, err)
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode, string(body))
	rows := regexp.MustCompile(`<tr class="db( down)?" data-db="([^"]+)">`).FindAllStringSubmatch(string(body), -1)
	require.Len(t, rows, 4, string(body))
	require.Equal(t, []string{"", " down"}, []string{rows[2][1], rows[3][1]}, "the database that is down, and only it")
	require.Equal(t, "gone", rows[3][2], "named after its database")
	require.NotContains(t, string(body), "secret-pw", "no password on the page")
	require.Regexp(t, `data-db="`+rows[0][2]+`"><td><a href="/db/`+rows[0][2]+`/">[^<]*</a> <span class="muted small">[^<]*</span></td>\s*<td class="num">2</td>`, string(body), "a's pending rows")
	res, err = http.Get(base + "db/" + rows[0][2] + "/dead")
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, 0, stop())

	r := runCLI(t, nil, "--dsn", a.dsn, "--dsn", "sqlite:"+filepath.Join(t.TempDir(), "none.db"), "ui")
	require.Equal(t, exitFail, r.code)
	require.Contains(t, r.stderr, "no SQLite database at")
}
