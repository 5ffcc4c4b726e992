package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"maps"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/outboxtest/testdb"
)

// TestUsage covers the commands that need no database, and the JSON error document.
func TestUsage(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "version", "--json")
	require.Equal(t, exitOK, r.code)
	var v map[string]string
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	require.Equal(t, []string{"go", "version"}, slices.Sorted(maps.Keys(v)))
	require.Equal(t, runtime.Version(), v["go"])

	r = runCLI(t, nil, "help")
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, "Commands:")
	require.Empty(t, r.stderr)
	for _, name := range []string{"migrate", "stats", "log", "dead", "purge", "ui", "version"} {
		r = runCLI(t, nil, "help", name)
		require.Equal(t, exitOK, r.code, name)
		require.Contains(t, r.stdout, "outbox "+name, name)
	}
	r = runCLI(t, nil)
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "Commands:", "usage goes to stderr when no command is given")
	require.True(t, strings.HasSuffix(r.stderr, "outbox: no command given (run: outbox help)\n"), r.stderr)
	r = runCLI(t, nil, "help", "nosuch")
	require.Equal(t, exitUsage, r.code)
	r = runCLI(t, nil, "log", "up")
	require.Equal(t, exitUsage, r.code)
	require.Equal(t, "outbox: log needs one of setup, drop (run: outbox help log)\n", r.stderr)

	// With --json, a failure is also one JSON document on stdout.
	r = runCLI(t, nil, "--json", "stats", "--dsn", "sqlite:"+filepath.Join(t.TempDir(), "none.db"))
	require.Equal(t, exitFail, r.code)
	var e map[string]string
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &e))
	require.Contains(t, e["error"], "no SQLite database at")
	require.Equal(t, "outbox: "+e["error"]+"\n", r.stderr)
}

// TestBinary builds the command and checks the exit codes of the real process.
func TestBinary(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "outbox")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(build.Environ(), "GOTOOLCHAIN=local")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	dsn := "sqlite:" + filepath.Join(dir, "ops.db")
	exit := func(args ...string) (int, string, string) {
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{"OUTBOX_DSN=" + dsn}
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), stdout.String(), stderr.String()
		}
		require.NoError(t, err)
		return 0, stdout.String(), stderr.String()
	}
	code, _, stderr := exit("stats")
	require.Equal(t, exitFail, code)
	require.Contains(t, stderr, "outbox migrate up")
	code, _, _ = exit("migrate", "up")
	require.Equal(t, exitOK, code)
	code, stdout, _ := exit("stats", "--json")
	require.Equal(t, exitOK, code)
	require.Contains(t, stdout, `"pending": 0`)
	// Several databases: every row printed, exit 1 when one cannot be read; any other
	// command refuses several with 2.
	none := "sqlite:" + filepath.Join(dir, "none.db")
	code, stdout, stderr = exit("stats", "--dsn", dsn, "--dsn", none)
	require.Equal(t, exitFail, code, stderr)
	require.Regexp(t, `(?m)^sqlite:\S+ops\.db +0 +0 +0 +0 +0 +- +- *$`, stdout)
	require.Regexp(t, `(?m)^sqlite:\S+none\.db +- .* no SQLite database at `, stdout)
	require.Equal(t, "outbox: 1 of 2 databases could not be read (see their rows)\n", stderr)
	code, _, _ = exit("stats", "--dsn", dsn, "--dsn", dsn, "--json")
	require.Equal(t, exitOK, code)
	code, _, stderr = exit("dead", "list", "--dsn", dsn, "--dsn", none)
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "only stats and ui take several databases")
	code, _, stderr = exit("dead", "show", "nope")
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "is not a UUID")
	code, stdout, _ = exit("version")
	require.Equal(t, exitOK, code)
	require.True(t, strings.HasPrefix(stdout, "outbox "), stdout)

	// purge shows progress when stderr is a terminal (here a pseudo-terminal made by
	// util-linux's script), and only then.
	if runtime.GOOS != "linux" {
		return
	}
	db, err := sql.Open("sqlite", testdb.SQLiteDSN(filepath.Join(dir, "ops.db")))
	require.NoError(t, err)
	defer db.Close()
	store, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	require.NoError(t, err)
	ctx := context.Background()
	for range 3 {
		_, err := store.EnqueueStandalone(ctx, outbox.Message{Namespace: "ns", Topic: "t", Payload: []byte(`{}`)})
		require.NoError(t, err)
	}
	recs, err := store.Claim(ctx, outbox.ClaimOptions{Limit: 3, Lease: time.Minute, MaxAttempts: 1, WorkerID: "w"})
	require.NoError(t, err)
	for _, r := range recs {
		require.NoError(t, store.Ack(ctx, r.Lease()))
	}
	code, _, stderr = exit("purge", "--dead-older-than", "1ms")
	require.Equal(t, exitOK, code)
	require.NotContains(t, stderr, "purging", "no progress when stderr is not a terminal")
	shell := strings.Join([]string{"OUTBOX_DSN='" + dsn + "'", bin, "purge", "--delivered-older-than", "1ms", "--batch-size", "1"}, " ")
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := exec.Command("script", "-qec", shell, "/dev/null").CombinedOutput()
		require.NoError(t, err, "%s", out)
		if strings.Contains(string(out), "deleted 3 delivered") {
			require.Contains(t, string(out), "\rpurging outbox_events: 1 delivered, 0 dead rows deleted")
			require.Contains(t, string(out), "\rpurging outbox_events: 3 delivered, 0 dead rows deleted")
			break
		}
		// The rows are a millisecond old on SQLite's clock only once it moves on.
		require.Contains(t, string(out), "deleted 0 delivered")
		require.True(t, time.Now().Before(deadline), "purge deleted nothing: %s", out)
	}
}

// TestScrub: a password that a driver's message might echo is removed from the error line.
func TestScrub(t *testing.T) {
	t.Parallel()
	c := &cli{secrets: secretsOf("p@ss/w0rd")}
	require.Equal(t, "dial xxxxx, xxxxx and xxxxx", c.scrub("dial p@ss/w0rd, p%40ss%2Fw0rd and p@ss%2Fw0rd"))
	require.Empty(t, secretsOf("abc"), "a short password is not scrubbed: it would garble messages")
}
