package main

import (
	"context"
	"encoding/json"
	"net/url"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
)

type skipJSON struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Reason string `json:"reason"`
}

// dead discard of a row that is already gone succeeds and reports it as skipped, as
// Store.Discard does, so that a retried script does not fail.
func TestDeadDiscardIsIdempotent(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		s := f.seed(t)
		var dis struct {
			Discarded []string   `json:"discarded"`
			Skipped   []skipJSON `json:"skipped"`
		}
		f.okJSON(t, &dis, "dead", "discard", s.dead2.String())
		require.Equal(t, []string{s.dead2.String()}, dis.Discarded)
		before := f.fingerprint(t)
		never := uuid.New().String()
		f.okJSON(t, &dis, "dead", "discard", s.dead2.String(), never)
		require.Empty(t, dis.Discarded)
		require.Equal(t, []skipJSON{
			{ID: s.dead2.String(), Status: "gone", Reason: "no such row (already discarded or purged)"},
			{ID: never, Status: "gone", Reason: "no such row (already discarded or purged)"},
		}, dis.Skipped)
		require.Contains(t, f.ok(t, "dead", "discard", s.dead2.String()), "no such row")
		require.Equal(t, before, f.fingerprint(t))
		// replay still refuses an unknown id: nothing would be replayed, and a typo says so.
		f.fails(t, exitFail, "no row with id "+never, "dead", "replay", s.dead1.String(), never)
	})
}

// A namespace given by --namespace or OUTBOX_NAMESPACE, a --topic or a --tenant, scopes
// the by-id commands: ids outside it are reported and left as they are.
func TestDeadByIDScope(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		s := f.seed(t)
		before := f.fingerprint(t)
		var rep struct {
			Replayed  []string   `json:"replayed"`
			Discarded []string   `json:"discarded"`
			Skipped   []skipJSON `json:"skipped"`
		}
		for _, r := range []result{
			runCLI(t, nil, "--dsn", f.dsn, "--namespace", "billing", "dead", "replay", s.dead1.String(), "--json"),
			runCLI(t, map[string]string{"OUTBOX_NAMESPACE": "billing"}, "--dsn", f.dsn, "dead", "replay", s.dead1.String(), "--json"),
			runCLI(t, nil, "--dsn", f.dsn, "dead", "discard", "--topic", "order.paid", s.dead1.String(), "--json"),
			runCLI(t, nil, "--dsn", f.dsn, "dead", "replay", "--tenant", uuid.NewString(), s.dead1.String(), "--json"),
		} {
			require.Equal(t, 0, r.code, r.stderr)
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep))
			require.Empty(t, rep.Replayed)
			require.Empty(t, rep.Discarded)
			require.Len(t, rep.Skipped, 1)
			require.Equal(t, "dead", rep.Skipped[0].Status)
			require.Contains(t, rep.Skipped[0].Reason, "outside the scope given")
			require.Equal(t, before, f.fingerprint(t), "nothing changed")
		}
		out := runCLI(t, map[string]string{"OUTBOX_NAMESPACE": "billing"}, "--dsn", f.dsn, "dead", "replay", s.dead1.String())
		require.Equal(t, 0, out.code)
		require.Contains(t, out.stdout, "outside the scope given (namespace billing): namespace shop, topic order.placed")
		f.fails(t, exitFail, "outside the scope given", "--namespace", "billing", "dead", "show", s.dead1.String())

		// Inside the scope, the command acts.
		f.okJSON(t, &rep, "--namespace", ns, "dead", "replay", s.dead1.String(), s.dead2.String(), "--topic", "order.placed")
		require.Equal(t, []string{s.dead1.String()}, rep.Replayed)
		require.Len(t, rep.Skipped, 1)
		require.Equal(t, s.dead2.String(), rep.Skipped[0].ID)
		// purge, which works on the whole table, says why it refuses a namespace from the
		// environment.
		r := runCLI(t, map[string]string{"OUTBOX_NAMESPACE": ns}, "--dsn", f.dsn, "purge", "--dead-older-than", "1ms")
		require.Equal(t, exitUsage, r.code)
		require.Contains(t, r.stderr, "OUTBOX_NAMESPACE is set")
	})
}

// dead list --json leaves payloads out unless --payloads; dead show keeps its payload.
func TestDeadListPayloads(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		s := f.seed(t)
		var page struct {
			Records []map[string]json.RawMessage `json:"records"`
		}
		f.okJSON(t, &page, "dead", "list")
		require.Len(t, page.Records, 2)
		for _, r := range page.Records {
			require.NotContains(t, r, "payload")
			require.Contains(t, r, "last_error")
		}
		f.okJSON(t, &page, "dead", "list", "--payloads")
		for _, r := range page.Records {
			require.Contains(t, r, "payload")
		}
		var one recordJSON
		f.okJSON(t, &one, "dead", "show", s.dead1.String())
		require.JSONEq(t, s.payload[s.dead1], string(one.Payload))
		f.fails(t, exitUsage, "does not take --payloads", "dead", "show", "--payloads", s.dead1.String())
	})
}

// The next-page hint of dead list is a command that, pasted into a shell, lists the next
// page with the same filters, and never shows a password.
func TestDeadListNextPageCommand(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		s := f.seed(t)
		dsn := f.dsn
		const pw, sslpw = "Pa55-w0rd", "Ssl-Pa55-w0rd"
		if f.backend == "postgres" { // the test server trusts: any password is accepted
			u, err := url.Parse(dsn)
			require.NoError(t, err)
			u.User = url.UserPassword(u.User.Username(), pw)
			dsn = u.String()
		}
		// A DSN with no password but the client key's (unused without TLS) is secret as well.
		sslOnly := ""
		if f.backend == "postgres" {
			u, err := url.Parse(f.dsn)
			require.NoError(t, err)
			q := u.Query()
			q.Set("sslpassword", sslpw)
			u.RawQuery = q.Encode()
			sslOnly = u.String()
		}
		args := []string{"--dsn", dsn, "--table", outbox.DefaultTable, "--topic", "order.paid", "--topic", "order.placed",
			"--namespace", ns, "dead", "list", "--limit", "1", "--since", "1h"}
		r := runCLI(t, nil, args...)
		require.Equal(t, 0, r.code, r.stderr)
		require.NotContains(t, r.stdout, pw)
		m := regexp.MustCompile(`(?m)^more: (outbox .*)$`).FindStringSubmatch(r.stdout)
		require.NotNil(t, m, r.stdout)
		cmd := m[1]
		if f.backend == "postgres" {
			require.Contains(t, cmd, `--dsn "$OUTBOX_DSN"`)
		}
		require.Contains(t, cmd, "--topic order.paid --topic order.placed")
		require.Contains(t, cmd, "--limit 1")
		require.Regexp(t, `--since \d{4}-\d\d-\d\dT`, cmd, "the window as absolute times")

		// Let a POSIX shell split it, with OUTBOX_DSN set as the hint expects.
		sh := exec.Command("sh", "-c", "set -- "+strings.TrimPrefix(cmd, "outbox ")+`; for a; do printf '%s\0' "$a"; done`)
		sh.Env = []string{"OUTBOX_DSN=" + dsn, "PATH=/usr/bin:/bin"}
		words, err := sh.Output()
		require.NoError(t, err, cmd)
		next := strings.Split(strings.TrimSuffix(string(words), "\x00"), "\x00")
		r = runCLI(t, nil, next...)
		require.Equal(t, 0, r.code, "%q: %s", next, r.stderr)
		require.NotContains(t, r.stdout, "more:", "the last page")
		first := runCLI(t, nil, args...)
		both := first.stdout + r.stdout
		require.Equal(t, 1, strings.Count(both, s.dead1.String()), "both dead rows, once each: %s", both)
		require.Equal(t, 1, strings.Count(both, s.dead2.String()), "both dead rows, once each: %s", both)

		if sslOnly != "" {
			args[1] = sslOnly
			r = runCLI(t, nil, args...)
			require.Equal(t, 0, r.code, r.stderr)
			require.NotContains(t, r.stdout+r.stderr, sslpw)
			require.Contains(t, r.stdout, `--dsn "$OUTBOX_DSN"`)
		}
	})
}

// A DSN the driver cannot parse is bad input (exit 2), and its password, by key, is not
// printed even when the rest of the DSN is malformed.
func TestUnusableDSN(t *testing.T) {
	t.Parallel()
	for _, d := range []struct{ dialect, dsn, secret string }{
		{"", "postgres://postgres:Sup3r-S3cret@127.0.0.1:bad-port/test", "Sup3r-S3cret"},
		{"postgres", "host=127.0.0.1 password=s3cret longtail dbname=x", "longtail"},
		{"postgres", "host=127.0.0.1 password='s3cret longtail dbname=x", "longtail"},
		{"postgres", "host=127.0.0.1 port=notaport user=postgres password=Sup3r-S3cret dbname=test", "Sup3r-S3cret"},
	} {
		r := runCLI(t, nil, "--dialect", d.dialect, "--dsn", d.dsn, "stats")
		require.Equal(t, exitUsage, r.code, "%s: %s", d.dsn, r.stderr)
		require.Contains(t, r.stderr, "invalid PostgreSQL DSN")
		require.NotContains(t, r.stdout+r.stderr, d.secret)
		require.NotContains(t, r.stdout+r.stderr, "s3cret")
	}
}

// dead list --group counts dead rows by cause: one error on four topics is one cause with
// its four texts; --json gives the same.
func TestDeadListGroup(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		ctx := context.Background()
		topics := []string{"orders.created", "orders.paid", "orders.refunded", "orders.shipped"}
		var msgs []outbox.Message
		for _, topic := range append(topics, "orders.created") {
			msgs = append(msgs, outbox.Message{Namespace: "shop", Topic: topic, Payload: []byte(`{}`)})
		}
		_, err := f.store.EnqueueStandalone(ctx, msgs...)
		require.NoError(t, err)
		recs, err := f.store.Claim(ctx, outbox.ClaimOptions{Limit: 10, Lease: time.Hour, MaxAttempts: 5, WorkerID: "t"})
		require.NoError(t, err)
		require.Len(t, recs, 5)
		seen := map[string]bool{}
		for _, r := range recs {
			e := "kafka: produce to " + r.Topic + ": MESSAGE_TOO_LARGE"
			if seen[r.Topic] {
				e = "kafka: produce to " + r.Topic + ": UNKNOWN_TOPIC_OR_PARTITION"
			}
			seen[r.Topic] = true
			require.NoError(t, f.store.Complete(ctx, outbox.Outcome{Lease: r.Lease(), Status: outbox.StatusDead, Error: e}))
		}
		var g struct {
			Total     int64       `json:"total"`
			Ungrouped int64       `json:"ungrouped"`
			Causes    []causeJSON `json:"causes"`
		}
		f.okJSON(t, &g, "dead", "list", "--group")
		require.EqualValues(t, 5, g.Total)
		require.Len(t, g.Causes, 2)
		require.Equal(t, "kafka: produce to <name>: MESSAGE_TOO_LARGE", g.Causes[0].Fingerprint)
		require.EqualValues(t, 4, g.Causes[0].Count)
		require.Len(t, g.Causes[0].Texts, 4)
		require.Equal(t, "kafka: produce to <name>: UNKNOWN_TOPIC_OR_PARTITION", g.Causes[1].Fingerprint)
		out := f.ok(t, "dead", "list", "--group", "--limit", "1")
		require.Contains(t, out, "kafka: produce to <name>: MESSAGE_TOO_LARGE")
		require.Contains(t, out, "1 × kafka: produce to orders.paid: MESSAGE_TOO_LARGE")
		require.NotContains(t, out, "UNKNOWN_TOPIC", "--limit counts causes")
		require.Contains(t, out, "5 dead rows in 1 causes shown")
		f.fails(t, exitUsage, "no --cursor", "dead", "list", "--group", "--cursor", "x")
	})
}
