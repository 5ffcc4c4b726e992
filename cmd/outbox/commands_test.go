package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
	"github.com/outboxgo/outbox/outboxtest/testdb"
)

// TestStats checks stats' JSON document (its exact keys and every count) and its table,
// on rows in every state.
func TestStats(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		f.seed(t)

		out := f.ok(t, "stats", "--json")
		var keys map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(out), &keys))
		require.ElementsMatch(t, []string{"pending", "scheduled", "processing", "delivered", "dead", "oldest_pending_age_seconds", "oldest_undelivered_age_seconds", "delivered_estimated", "delivered_since", "topics"},
			slices.Collect(maps.Keys(keys)))
		var topics []map[string]any
		require.NoError(t, json.Unmarshal(keys["topics"], &topics))
		require.Len(t, topics, 2)
		require.ElementsMatch(t, []string{"namespace", "topic", "pending", "scheduled", "processing", "delivered", "dead", "oldest_pending_age_seconds", "oldest_undelivered_age_seconds", "delivered_estimated"},
			slices.Collect(maps.Keys(topics[0])))

		var st statsJSON
		f.okJSON(t, &st, "stats")
		require.Equal(t, [5]int64{2, 1, 1, 1, 2}, [5]int64{st.Pending, st.Scheduled, st.Processing, st.Delivered, st.Dead})
		require.GreaterOrEqual(t, st.OldestPendingAgeSeconds, 0.0)
		require.Less(t, st.OldestPendingAgeSeconds, 600.0)
		require.Len(t, st.Topics, 2)
		require.Equal(t, topicStatsJSON{Namespace: ns, Topic: "order.paid", countsJSON: countsJSON{Pending: 1, Scheduled: 1, Dead: 1,
			OldestPendingAgeSeconds: st.Topics[0].OldestPendingAgeSeconds, OldestUndeliveredAgeSeconds: st.Topics[0].OldestUndeliveredAgeSeconds}}, st.Topics[0])
		require.Equal(t, topicStatsJSON{Namespace: ns, Topic: "order.placed", countsJSON: countsJSON{Pending: 1, Processing: 1, Delivered: 1, Dead: 1,
			OldestPendingAgeSeconds: st.Topics[1].OldestPendingAgeSeconds, OldestUndeliveredAgeSeconds: st.Topics[1].OldestUndeliveredAgeSeconds}}, st.Topics[1])
		require.GreaterOrEqual(t, st.Topics[1].OldestUndeliveredAgeSeconds, st.Topics[1].OldestPendingAgeSeconds, "the processing row is undelivered since its enqueue")
		require.Nil(t, st.DeliveredSince, "a handful of delivered rows are counted all")

		// Scope flags, before and after the command.
		f.okJSON(t, &st, "--topic", "order.paid", "stats")
		require.Equal(t, [5]int64{1, 1, 0, 0, 1}, [5]int64{st.Pending, st.Scheduled, st.Processing, st.Delivered, st.Dead})
		f.okJSON(t, &st, "stats", "--namespace", "elsewhere")
		require.Equal(t, statsJSON{Topics: []topicStatsJSON{}}, st)

		// The same database through the other DSN forms a user may type.
		var all statsJSON
		f.okJSON(t, &all, "stats")
		for _, alt := range otherForms(t, f) {
			r := runCLI(t, nil, append(alt, "stats", "--json")...)
			require.Equal(t, 0, r.code, "%v: %s", alt, r.stderr)
			var got statsJSON
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &got))
			require.Equal(t, all.Pending, got.Pending, alt)
			require.Equal(t, all.Dead, got.Dead, alt)
		}

		table := f.ok(t, "stats")
		require.Regexp(t, `(?m)^NAMESPACE +TOPIC +PENDING +SCHEDULED +PROCESSING +DELIVERED +DEAD +OLDEST PENDING +OLDEST UNDELIVERED$`, table)
		require.Regexp(t, `(?m)^shop +order\.placed +1 +0 +1 +1 +1 `, table)
		require.Regexp(t, `(?m)^total +2 +1 +1 +1 +2 `, table)
	})
}

// TestDead checks dead list (pages, filters), show, replay (then a Publisher delivers the
// replayed row) and discard.
func TestDead(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		s := f.seed(t)
		ctx := context.Background()

		type page struct {
			Records []recordJSON `json:"records"`
			Next    string       `json:"next"`
		}
		var p page
		f.okJSON(t, &p, "dead", "list", "--payloads")
		require.Len(t, p.Records, 2)
		require.Empty(t, p.Next)
		require.False(t, p.Records[0].UpdatedAt.Before(*p.Records[1].UpdatedAt), "newest death first")
		byID := map[string]recordJSON{}
		for _, r := range p.Records {
			byID[r.ID] = r
			require.Equal(t, "dead", r.Status)
			require.Equal(t, ns, r.Namespace)
			require.Equal(t, 1, r.Attempts)
			require.Zero(t, r.Replays)
			require.NotNil(t, r.CreatedAt)
		}
		d1 := byID[s.dead1.String()]
		require.Equal(t, "order.placed", d1.Topic)
		require.Equal(t, "broker said no\nsecond line", d1.LastError)
		require.JSONEq(t, s.payload[s.dead1], string(d1.Payload))
		require.JSONEq(t, s.payload[s.dead2], string(byID[s.dead2.String()].Payload))

		// Keyset pages of one: both rows, once each.
		var p1, p2 page
		f.okJSON(t, &p1, "dead", "list", "--limit", "1")
		require.Len(t, p1.Records, 1)
		require.NotEmpty(t, p1.Next)
		f.okJSON(t, &p2, "dead", "list", "--limit", "1", "--cursor", p1.Next)
		require.Len(t, p2.Records, 1)
		require.Empty(t, p2.Next)
		require.Equal(t, []string{p.Records[0].ID, p.Records[1].ID}, []string{p1.Records[0].ID, p2.Records[0].ID})

		// Filters.
		f.okJSON(t, &p, "dead", "list", "--topic", "order.paid")
		require.Len(t, p.Records, 1)
		require.Equal(t, s.dead2.String(), p.Records[0].ID)
		f.okJSON(t, &p, "dead", "list", "--since", "1h")
		require.Len(t, p.Records, 2)
		f.okJSON(t, &p, "dead", "list", "--until", "1h")
		require.Empty(t, p.Records)
		f.okJSON(t, &p, "dead", "list", "--since", time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
		require.Empty(t, p.Records)

		table := f.ok(t, "dead", "list")
		require.Regexp(t, `(?m)^ID +NAMESPACE +TOPIC +ATTEMPTS +REPLAYS +DIED +LAST ERROR$`, table)
		require.Contains(t, table, s.dead1.String())
		require.Contains(t, table, "broker said no second line", "the error is one line in the table")

		// show: a dead row, and a row in another state.
		var r recordJSON
		f.okJSON(t, &r, "dead", "show", s.dead2.String())
		require.Equal(t, s.dead2.String(), r.ID)
		require.Equal(t, "schema refused", r.LastError)
		require.JSONEq(t, s.payload[s.dead2], string(r.Payload))
		f.okJSON(t, &r, "dead", "show", s.scheduled.String())
		require.Equal(t, "pending", r.Status)
		shown := f.ok(t, "dead", "show", s.dead1.String())
		require.Regexp(t, `(?m)^status +dead$`, shown)
		require.Contains(t, shown, "payload:\n{\n  \"order\": 3\n}")

		// replay: a dead row is replayed, a pending one reported as skipped.
		var rep struct {
			Replayed []string `json:"replayed"`
			Skipped  []struct {
				ID     string `json:"id"`
				Status string `json:"status"`
			} `json:"skipped"`
		}
		f.okJSON(t, &rep, "dead", "replay", s.dead1.String(), s.pending1.String())
		require.Equal(t, []string{s.dead1.String()}, rep.Replayed)
		require.Len(t, rep.Skipped, 1)
		require.Equal(t, s.pending1.String(), rep.Skipped[0].ID)
		require.Equal(t, "pending", rep.Skipped[0].Status)
		got, err := f.store.Get(ctx, s.dead1)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusPending, got.Status)
		require.Zero(t, got.Attempts)
		require.Equal(t, 1, got.Replays)
		require.Equal(t, "broker said no\nsecond line", got.LastError, "the last error stays until the next outcome")
		// Replaying again changes nothing and says so.
		f.okJSON(t, &rep, "dead", "replay", s.dead1.String())
		require.Empty(t, rep.Replayed)
		require.Equal(t, "pending", rep.Skipped[0].Status)

		// A publisher delivers the replayed row.
		delivered := publishUntil(t, f, s.dead1)
		require.Contains(t, delivered, s.dead1)
		got, err = f.store.Get(ctx, s.dead1)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusDelivered, got.Status)
		require.Equal(t, 1, got.Replays)

		// discard.
		var dis struct {
			Discarded []string `json:"discarded"`
			Skipped   []struct {
				ID     string `json:"id"`
				Status string `json:"status"`
			} `json:"skipped"`
		}
		f.okJSON(t, &dis, "dead", "discard", s.dead2.String(), s.processing.String())
		require.Equal(t, []string{s.dead2.String()}, dis.Discarded)
		require.Len(t, dis.Skipped, 1)
		require.Equal(t, "processing", dis.Skipped[0].Status)
		_, err = f.store.Get(ctx, s.dead2)
		require.ErrorIs(t, err, outbox.ErrNotFound)
		require.Contains(t, f.ok(t, "dead", "list"), "no dead rows")
	})
}

// publishUntil runs a Publisher on the fixture's namespace until the row want is
// delivered, and returns the ids it published.
func publishUntil(t *testing.T, f *fixture, want uuid.UUID) []uuid.UUID {
	t.Helper()
	var mu sync.Mutex
	var seen []uuid.UUID
	p, err := outbox.NewPublisher(f.store, outbox.TransportFunc(func(_ context.Context, batch []outbox.Delivery) []error {
		mu.Lock()
		defer mu.Unlock()
		for _, d := range batch {
			seen = append(seen, d.ID)
		}
		return make([]error, len(batch))
	}), outbox.PublisherOptions{
		Scope: outbox.Scope{Namespace: ns}, PollInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := f.store.Get(context.Background(), want)
		require.NoError(t, err)
		if r.Status == outbox.StatusDelivered {
			break
		}
		require.True(t, time.Now().Before(deadline), "row %s not delivered within 30s (status %s)", want, r.Status)
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		require.True(t, err == nil || errors.Is(err, context.Canceled), "Run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("publisher did not stop")
	}
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(seen)
}

// TestReplayAll replays every dead row a filter selects.
func TestReplayAll(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		s := f.seed(t)
		var n map[string]int64
		f.okJSON(t, &n, "dead", "replay", "--all", "--topic", "order.paid")
		require.Equal(t, map[string]int64{"replayed_count": 1}, n)
		r, err := f.store.Get(context.Background(), s.dead2)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusPending, r.Status)
		r, err = f.store.Get(context.Background(), s.dead1)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusDead, r.Status, "another topic's dead row stays dead")
		require.Equal(t, "dead rows replayed: 1\n", f.ok(t, "dead", "replay", "--all", "--yes"))
		require.Equal(t, "dead rows replayed: 0\n", f.ok(t, "dead", "replay", "--all", "--yes"))
	})
}

// An unfiltered replay --all (every dead row in the table) is refused without --yes when
// no one can be asked, and asks on a terminal; --dry-run counts and changes nothing.
func TestReplayAllConfirms(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		f.seed(t)
		before := f.fingerprint(t)
		f.fails(t, exitUsage, "add --yes", "dead", "replay", "--all")
		f.fails(t, exitUsage, "add --yes", "dead", "replay", "--all", "--json")
		f.fails(t, exitUsage, "only with --all", "dead", "replay", "--dry-run", uuid.NewString())
		require.Equal(t, "dead rows that would be replayed: 2 (dry run: nothing was changed)\n", f.ok(t, "dead", "replay", "--all", "--dry-run"))
		var dry map[string]any
		f.okJSON(t, &dry, "dead", "replay", "--all", "--dry-run", "--topic", "order.paid")
		require.Equal(t, map[string]any{"dry_run": true, "would_replay_count": float64(1)}, dry)
		require.Equal(t, before, f.fingerprint(t), "nothing changed")

		// On a terminal, the command asks; anything but y/yes changes nothing.
		ask := func(answer string) (result, string) {
			var out, errb, prompt bytes.Buffer
			c := newCLI(func(string) string { return "" }, &out, &errb)
			c.confirm = promptOn(strings.NewReader(answer), &prompt)
			code := c.run(context.Background(), []string{"--dsn", f.dsn, "dead", "replay", "--all"})
			return result{code: code, stdout: out.String(), stderr: errb.String()}, prompt.String()
		}
		r, prompt := ask("n\n")
		require.Equal(t, exitUsage, r.code, r.stderr)
		require.Contains(t, prompt, "replay all 2 dead rows of table outbox_events? [y/N]")
		require.Contains(t, r.stderr, "not confirmed; nothing was changed")
		require.Equal(t, before, f.fingerprint(t))
		r, _ = ask("yes\n")
		require.Equal(t, 0, r.code, r.stderr)
		require.Equal(t, "dead rows replayed: 2\n", r.stdout)
	})
}

// TestPurge deletes old delivered and dead rows and never pending or processing ones.
func TestPurge(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		s := f.seed(t)
		var res map[string]int64
		f.okJSON(t, &res, "purge", "--delivered-older-than", "7d", "--dead-older-than", "72h")
		require.Equal(t, map[string]int64{"delivered": 0, "dead": 0}, res)

		// The seeded rows are at least a millisecond old once the database clock moves on.
		deadline := time.Now().Add(10 * time.Second)
		total := map[string]int64{}
		for total["delivered"] < 1 || total["dead"] < 2 {
			require.True(t, time.Now().Before(deadline), "purge deleted %v", total)
			f.okJSON(t, &res, "purge", "--delivered-older-than", "1ms", "--dead-older-than", "1ms", "--batch-size", "1")
			total["delivered"] += res["delivered"]
			total["dead"] += res["dead"]
		}
		require.Equal(t, map[string]int64{"delivered": 1, "dead": 2}, total)
		for _, id := range []uuid.UUID{s.delivered, s.dead1, s.dead2} {
			_, err := f.store.Get(context.Background(), id)
			require.ErrorIs(t, err, outbox.ErrNotFound)
		}
		for _, id := range []uuid.UUID{s.processing, s.pending1, s.pending2, s.scheduled} {
			_, err := f.store.Get(context.Background(), id)
			require.NoError(t, err, "purge must not touch pending or processing rows")
		}
		require.Equal(t, "deleted 0 delivered and 0 dead rows from outbox_events\n", f.ok(t, "purge", "--dead-older-than", "1ms"))
	})
}

// TestMigrate runs migrate up, status and down, and the checks other commands make on the
// schema.
func TestMigrate(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		type status struct {
			Migrations []migrationStatusJSON `json:"migrations"`
		}
		var st status
		f.okJSON(t, &st, "migrate", "status")
		require.NotEmpty(t, st.Migrations)
		var last int64
		for _, m := range st.Migrations {
			require.Equal(t, m.Set == "base", m.Applied, "the base set only: %+v", m)
			if m.Set == "base" {
				last = m.Version
			}
		}
		require.Contains(t, f.ok(t, "migrate", "up"), "nothing to do, at version")

		// A table behind the embedded migrations is refused until migrate up.
		if last > 1 {
			var down map[string]any
			f.okJSON(t, &down, "migrate", "down")
			require.EqualValues(t, last-1, down["version"])
			f.fails(t, exitFail, "run: outbox migrate up", "stats")
			f.okJSON(t, &down, "migrate", "up")
		}

		// Another table name: missing until migrated.
		f.fails(t, exitFail, "table billing_outbox does not exist", "stats", "--table", "billing_outbox")
		f.fails(t, exitFail, "run: outbox migrate up", "dead", "list", "--table", "billing_outbox")
		f.ok(t, "--table", "billing_outbox", "migrate", "up")
		f.ok(t, "--table", "billing_outbox", "stats")

		// migrate down to zero refuses to drop undelivered rows without --force.
		f.seed(t)
		before := f.fingerprint(t)
		f.fails(t, exitUsage, "pass --force", "migrate", "down", "--to", "0")
		require.Equal(t, before, f.fingerprint(t))
		f.ok(t, "migrate", "down", "--to", "0", "--force")
		f.fails(t, exitFail, "run: outbox migrate up", "stats")
		f.okJSON(t, &st, "migrate", "status")
		for _, m := range st.Migrations {
			require.False(t, m.Applied)
		}
	})
}

// TestMigrateOrdered: the ordered set is opt in. migrate up --ordered applies it after the
// base set, status lists both sets (without creating the ordered set's version table before
// it is applied), down --ordered rolls it back alone, and down below version 1 rolls it
// back before dropping the table; an ordered claim works only while it is applied.
func TestMigrateOrdered(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		ctx := context.Background()
		orderedVT := outbox.DefaultTable + migrations.OrderedVersionSuffix
		vtExists := func() bool {
			ok, err := tableExists(ctx, f.db, f.backend, orderedVT)
			require.NoError(t, err)
			return ok
		}
		claimOrdered := func() error {
			s, err := outbox.New(f.db, dialectOf(f.backend), outbox.Options{})
			require.NoError(t, err)
			_, err = s.Claim(ctx, outbox.ClaimOptions{Scope: outbox.Scope{Namespace: ns}, Limit: 1, Lease: time.Minute,
				MaxAttempts: 5, WorkerID: "w", Ordered: true})
			return err
		}
		type status struct {
			Migrations []migrationStatusJSON `json:"migrations"`
		}
		applied := func() map[string][]int64 {
			var st status
			f.okJSON(t, &st, "migrate", "status")
			out := map[string][]int64{}
			for _, m := range st.Migrations {
				if m.Applied {
					out[m.Set] = append(out[m.Set], m.Version)
				}
			}
			return out
		}
		type run struct {
			Applied        []migrationJSON `json:"applied"`
			RolledBack     []migrationJSON `json:"rolled_back"`
			Version        int64           `json:"version"`
			OrderedVersion int64           `json:"ordered_version"`
		}

		// The base set's versions differ between dialects (MySQL has one more).
		vs, err := migrations.Versions(f.backend, "")
		require.NoError(t, err)
		top := int64(len(vs))
		all := make([]int64, top)
		for i := range all {
			all[i] = int64(i + 1)
		}
		topSource := map[string]string{"mysql": "00004_due_index.sql"}[f.backend]
		if topSource == "" {
			topSource = "00003_due_index.sql"
		}

		// Not applied: status says how to opt in, and creates nothing.
		var st status
		f.okJSON(t, &st, "migrate", "status")
		require.Equal(t, migrationStatusJSON{Set: "ordered", Version: 1, Source: "00001_order_index.sql"}, st.Migrations[len(st.Migrations)-1])
		require.Regexp(t, `(?m)^ordered +1 +00001_order_index\.sql +not applied \(opt in: outbox migrate up --ordered\)$`, f.ok(t, "migrate", "status"))
		require.Regexp(t, `(?m)^SET +VERSION +MIGRATION +APPLIED AT$`, f.ok(t, "migrate", "status"))
		require.False(t, vtExists(), "status created the ordered set's version table")
		require.ErrorContains(t, claimOrdered(), "outbox migrate up --ordered")

		var r run
		f.okJSON(t, &r, "migrate", "up", "--ordered")
		require.Len(t, r.Applied, 1)
		require.Equal(t, "ordered", r.Applied[0].Set)
		require.Equal(t, int64(1), r.Applied[0].Version)
		require.Equal(t, "00001_order_index.sql", r.Applied[0].Source)
		require.Equal(t, [2]int64{top, 1}, [2]int64{r.Version, r.OrderedVersion})
		require.Equal(t, map[string][]int64{"base": all, "ordered": {1}}, applied())
		require.NoError(t, claimOrdered())
		nothing := fmt.Sprintf("outbox_events: nothing to do, at version %d, ordered set at version 1\n", top)
		require.Equal(t, nothing, f.ok(t, "migrate", "up", "--ordered"))
		require.Equal(t, nothing, f.ok(t, "migrate", "up"))

		// down --ordered: the ordered set alone.
		out := f.ok(t, "migrate", "down", "--ordered")
		require.Regexp(t, `(?m)^rolled back +ordered/00001_order_index\.sql +[0-9.]+ms$`, out)
		require.Contains(t, out, fmt.Sprintf("outbox_events: at version %d, ordered set at version 0\n", top))
		require.Equal(t, map[string][]int64{"base": all}, applied())
		require.ErrorIs(t, claimOrdered(), outbox.ErrMisconfigured)
		require.Contains(t, f.ok(t, "migrate", "down", "--ordered"), "nothing to do")

		// down one step and down --to 1 leave the ordered set; below version 1 it goes first.
		out = f.ok(t, "migrate", "up", "--ordered")
		require.Regexp(t, `(?m)^applied +ordered/00001_order_index\.sql +[0-9.]+ms$`, out)
		f.okJSON(t, &r, "migrate", "down")
		require.Equal(t, []migrationJSON{{Set: "base", Version: top, Source: topSource, DurationMS: r.RolledBack[0].DurationMS}}, r.RolledBack)
		require.Equal(t, map[string][]int64{"base": all[:top-1], "ordered": {1}}, applied())
		f.okJSON(t, &r, "migrate", "down", "--to", "0")
		require.Len(t, r.RolledBack, int(top))
		require.Equal(t, [2]string{"ordered", "base"}, [2]string{r.RolledBack[0].Set, r.RolledBack[1].Set}, "the ordered set first")
		require.Equal(t, [2]int64{0, 0}, [2]int64{r.Version, r.OrderedVersion})
		require.Empty(t, applied())

		// Up again without --ordered: no order index, no stale version of it.
		f.okJSON(t, &r, "migrate", "up")
		require.Equal(t, [2]int64{top, 0}, [2]int64{r.Version, r.OrderedVersion})
		require.Equal(t, map[string][]int64{"base": all}, applied())
		require.ErrorIs(t, claimOrdered(), outbox.ErrMisconfigured)

		f.fails(t, exitUsage, "--to names a version of the base set", "migrate", "up", "--ordered", "--to", "1")
		f.fails(t, exitUsage, "takes no --ordered", "migrate", "status", "--ordered")
		f.fails(t, exitUsage, "takes no --force", "migrate", "down", "--ordered", "--force")
		require.Equal(t, map[string][]int64{"base": all}, applied(), "bad input changed nothing")
	})
}

// TestMigrateDownKeepsOrderedIndexOfKeptTable: a table whose base set goose records in a
// version table of the program's own (migrations.Options.VersionTable), which the command
// does not read, is at version 0 for the command; migrate down must then leave its order
// index, since the table stays.
func TestMigrateDownKeepsOrderedIndexOfKeptTable(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		ctx := context.Background()
		const table = "own_versions_events"
		require.NoError(t, migrations.Up(ctx, f.db, f.backend, migrations.Options{Table: table, VersionTable: "app_outbox_versions", Ordered: true}))
		require.Contains(t, f.ok(t, "--table", table, "migrate", "down"), "nothing to do")
		s, err := outbox.New(f.db, dialectOf(f.backend), outbox.Options{Table: table})
		require.NoError(t, err)
		_, err = s.Claim(ctx, outbox.ClaimOptions{Scope: outbox.Scope{Namespace: ns}, Limit: 1, Lease: time.Minute,
			MaxAttempts: 5, WorkerID: "w", Ordered: true})
		require.NoError(t, err, "the order index is still there")
	})
}

// TestBadInput runs each kind of bad input and checks that it is a one-line error with
// the right exit code and that the table is unchanged.
func TestBadInput(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		s := f.seed(t)
		before := f.fingerprint(t)
		unknown := uuid.New().String()
		cases := []struct {
			code int
			want string
			args []string
		}{
			{exitUsage, `"not-a-uuid" is not a UUID`, []string{"dead", "replay", s.dead1.String(), "not-a-uuid"}},
			{exitUsage, "is not a UUID", []string{"dead", "discard", strings.ToUpper(s.dead1.String())[:35]}},
			{exitUsage, "is not a UUID", []string{"dead", "show", "42"}},
			{exitFail, "no row with id " + unknown, []string{"dead", "replay", s.dead1.String(), unknown}},
			{exitFail, "no row with id " + unknown, []string{"dead", "show", unknown}},
			{exitUsage, "invalid --table", []string{"dead", "replay", "--table", "Outbox-Events", s.dead1.String()}},
			{exitUsage, "invalid --table", []string{"stats", "--table", "outbox_events; DROP TABLE outbox_events"}},
			{exitUsage, "invalid --table", []string{"purge", "--table", strings.Repeat("t", 49), "--dead-older-than", "1ms"}},
			{exitUsage, "needs at least one id", []string{"dead", "replay"}},
			{exitUsage, "ids or --all, not both", []string{"dead", "replay", "--all", s.dead1.String()}},
			{exitUsage, "does not take --limit", []string{"dead", "show", "--limit", "3", s.dead1.String()}},
			{exitUsage, "--limit must be between", []string{"dead", "list", "--limit", "0"}},
			{exitUsage, "invalid --since", []string{"dead", "replay", "--all", "--since", "yesterday"}},
			{exitUsage, "invalid --tenant", []string{"dead", "replay", "--all", "--tenant", "acme"}},
			{exitUsage, "purge needs", []string{"purge"}},
			{exitUsage, "whole table", []string{"purge", "--namespace", ns, "--dead-older-than", "1ms"}},
			{exitUsage, "must be more than zero", []string{"purge", "--delivered-older-than", "0s"}},
			{exitUsage, "must be more than zero", []string{"purge", "--dead-older-than", "-1h"}},
			{exitUsage, "not a duration", []string{"purge", "--dead-older-than", "soon"}},
			{exitUsage, "unknown command", []string{"replay"}},
			{exitUsage, "unknown dead command", []string{"dead", "revive", s.dead1.String()}},
			{exitUsage, "flag provided but not defined", []string{"stats", "--since", "1h"}},
			{exitUsage, "does not match the DSN", []string{"stats", "--dialect", otherDialect(f.backend)}},
		}
		for _, tc := range cases {
			f.fails(t, tc.code, tc.want, tc.args...)
			require.Equal(t, before, f.fingerprint(t), "outbox %s changed the table", strings.Join(tc.args, " "))
		}
		// An unknown cursor is the library's validation error.
		f.fails(t, exitUsage, "invalid Cursor", "dead", "list", "--cursor", "bogus")
		require.Equal(t, before, f.fingerprint(t))
	})
}

func otherDialect(backend string) string {
	if backend == "sqlite" {
		return "postgres"
	}
	return "sqlite"
}

// otherForms returns the fixture's database as other DSN forms, with the flags they need:
// go-sql-driver's own DSN for MariaDB, libpq's key=value form for PostgreSQL, a bare path
// and a file: URI for SQLite.
func otherForms(t *testing.T, f *fixture) [][]string {
	t.Helper()
	switch f.backend {
	case "mysql":
		var name string
		require.NoError(t, f.db.QueryRow(`SELECT DATABASE()`).Scan(&name))
		cfg, err := mysql.ParseDSN(testdb.MySQLDSN())
		require.NoError(t, err)
		cfg.DBName = name
		return [][]string{{"--dialect", "mysql", "--dsn", cfg.FormatDSN()}}
	case "postgres":
		u, err := url.Parse(f.dsn)
		require.NoError(t, err)
		kv := fmt.Sprintf("host=%s port=%s dbname=%s search_path=%s sslmode=disable", u.Hostname(), u.Port(),
			strings.TrimPrefix(u.Path, "/"), u.Query().Get("search_path"))
		if u.User != nil {
			kv += " user=" + u.User.Username()
			if p, ok := u.User.Password(); ok {
				kv += " password=" + p
			}
		}
		return [][]string{{"--dialect", "postgres", "--dsn", kv}}
	default:
		path := strings.TrimPrefix(f.dsn, "sqlite:")
		return [][]string{{"--dialect", "sqlite", "--dsn", path}, {"--dsn", "file:" + path + "?_pragma=busy_timeout(5000)"}}
	}
}
