package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/cmd/outbox/internal/when"
)

const deadUsage = `  outbox dead list [--limit N] [--cursor C] [--since T] [--until T] [--payloads]
                                    dead rows, newest death first, one page at a time
  outbox dead list --group [--limit N] [--since T] [--until T]
                                    dead rows grouped by cause: errors with their numbers,
                                    ids, quoted names, topics and URL paths masked, the
                                    largest first, each with its distinct texts
  outbox dead show ID               one row (in any state) with its payload
  outbox dead replay ID...          move dead rows back to pending, due now, attempts 0
  outbox dead replay --all [--dry-run] [--yes]
                                    replay every dead row that --namespace, --topic,
                                    --tenant, --since and --until select; --dry-run counts
                                    them and changes nothing; with none of those filters
                                    (every dead row in the table) it needs --yes, or a
                                    "y" typed at the prompt on a terminal
  outbox dead discard ID...         delete dead rows

T is a time (2026-01-02T15:04:05Z, 2026-01-02) or an age (90m, 72h, 7d: that long ago,
by this machine's clock). For replay, an id that does not exist is an error and nothing
changes; discard reports it as skipped (gone), so that a retried discard succeeds. Ids of
rows that are not dead are reported as skipped, and so are ids of rows outside the scope
that --namespace (or OUTBOX_NAMESPACE), --topic and --tenant select, which are left as
they are.`

func runDead(ctx context.Context, c *cli, args []string) error {
	fs := c.flagSet("dead")
	limit := fs.Int("limit", 50, "list: rows per page, 1.."+fmt.Sprint(outbox.MaxBatch))
	cursor := fs.String("cursor", "", "list: the next-page cursor printed by the previous page")
	since := fs.String("since", "", "list, replay --all: rows that died at or after T")
	until := fs.String("until", "", "list, replay --all: rows that died before T")
	all := fs.Bool("all", false, "replay: every dead row the filters select")
	dryRun := fs.Bool("dry-run", false, "replay --all: count the rows it would replay, change nothing")
	yes := fs.Bool("yes", false, "replay --all: replay without asking, also with no filter (every dead row)")
	payloads := fs.Bool("payloads", false, "list --json: include each row's payload (dead show always does)")
	group := fs.Bool("group", false, "list: count the rows by cause (--limit causes) instead of listing them")
	pos, err := c.parse(fs, deadUsage, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("dead needs one of list, show, replay, discard (run: outbox help dead)")
	}
	verb, ids := pos[0], pos[1:]
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	allowed := map[string][]string{
		"list":    {"limit", "cursor", "since", "until", "payloads", "group"},
		"show":    {},
		"replay":  {"all", "since", "until", "dry-run", "yes"},
		"discard": {},
	}
	own, ok := allowed[verb]
	if !ok {
		return usagef("unknown dead command %q: use list, show, replay or discard", verb)
	}
	for _, name := range []string{"limit", "cursor", "since", "until", "all", "payloads", "dry-run", "yes", "group"} {
		if set[name] && !slices.Contains(own, name) {
			return usagef("dead %s does not take --%s", verb, name)
		}
	}
	if verb == "replay" && !*all {
		for _, name := range []string{"since", "until", "dry-run", "yes"} {
			if set[name] {
				return usagef("dead replay takes --%s only with --all", name)
			}
		}
	}
	filter, err := c.deadFilter(*since, *until)
	if err != nil {
		return err
	}
	switch verb {
	case "list":
		if len(ids) > 0 {
			return usagef("dead list takes no ids, got %q", ids[0])
		}
		if *limit < 1 || *limit > outbox.MaxBatch {
			return usagef("--limit must be between 1 and %d, got %d", outbox.MaxBatch, *limit)
		}
		if *group {
			if set["cursor"] || set["payloads"] {
				return usagef("dead list --group takes no --cursor or --payloads")
			}
			return c.deadCauses(ctx, outbox.DeadGroupsOptions{DeadFilter: filter, Limit: *limit})
		}
		o := outbox.ListDeadOptions{DeadFilter: filter, Limit: *limit, Cursor: *cursor}
		return c.deadList(ctx, o, listFlags{limitSet: set["limit"], payloads: *payloads})
	case "show":
		if len(ids) != 1 {
			return usagef("dead show takes one id")
		}
		parsed, err := parseIDs(ids)
		if err != nil {
			return err
		}
		sc, err := c.scope()
		if err != nil {
			return err
		}
		return c.deadShow(ctx, parsed[0], sc)
	case "replay":
		if *all {
			if len(ids) > 0 {
				return usagef("dead replay takes ids or --all, not both")
			}
			return c.replayAll(ctx, filter, replayAllFlags{dryRun: *dryRun, yes: *yes})
		}
		return c.replayOrDiscard(ctx, ids, "replay", filter.Scope)
	default:
		return c.replayOrDiscard(ctx, ids, "discard", filter.Scope)
	}
}

// filtered reports whether a scope was given (by flag, or OUTBOX_NAMESPACE).
func (c *cli) filtered() bool {
	return c.namespace() != "" || len(c.global.topics) > 0 || c.global.tenant != ""
}

// namespace is --namespace, or OUTBOX_NAMESPACE when the flag is not given.
func (c *cli) namespace() string {
	if c.global.namespace != "" {
		return c.global.namespace
	}
	return c.env("OUTBOX_NAMESPACE")
}

// inScope reports whether r is in the rows sc selects.
func inScope(r outbox.Record, sc outbox.Scope) bool {
	return (sc.Namespace == "" || r.Namespace == sc.Namespace) &&
		(len(sc.Topics) == 0 || slices.Contains(sc.Topics, r.Topic)) &&
		(sc.TenantID == uuid.Nil || r.TenantID == sc.TenantID)
}

// describeScope says which flags select sc, for messages.
func describeScope(sc outbox.Scope) string {
	var parts []string
	if sc.Namespace != "" {
		parts = append(parts, "namespace "+sc.Namespace)
	}
	if len(sc.Topics) > 0 {
		parts = append(parts, "topic "+strings.Join(sc.Topics, " or "))
	}
	if sc.TenantID != uuid.Nil {
		parts = append(parts, "tenant "+sc.TenantID.String())
	}
	return strings.Join(parts, ", ")
}

func (c *cli) deadFilter(since, until string) (outbox.DeadFilter, error) {
	sc, err := c.scope()
	if err != nil {
		return outbox.DeadFilter{}, err
	}
	f := outbox.DeadFilter{Scope: sc}
	now := time.Now()
	if f.Since, err = when.Parse(since, now); err != nil {
		return f, usagef("invalid --since: %v", err)
	}
	if f.Until, err = when.Parse(until, now); err != nil {
		return f, usagef("invalid --until: %v", err)
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return f, usagef("--since must be before --until")
	}
	return f, nil
}

// parseIDs parses every id before anything runs, so one bad id changes nothing.
func parseIDs(args []string) ([]uuid.UUID, error) {
	ids := make([]uuid.UUID, 0, len(args))
	seen := map[uuid.UUID]bool{}
	for _, a := range args {
		id, err := parseID(a)
		if err != nil {
			return nil, usagef("invalid id: %v; nothing was changed", err)
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// recordJSON is how a row is printed. Payload is the stored JSON, or a JSON string holding
// the stored bytes when they are not valid JSON (a row changed behind the library's back).
type recordJSON struct {
	ID            string            `json:"id"`
	Namespace     string            `json:"namespace"`
	Topic         string            `json:"topic"`
	TenantID      string            `json:"tenant_id,omitempty"`
	DedupeKey     string            `json:"dedupe_key,omitempty"`
	PartitionKey  string            `json:"partition_key,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
	Status        string            `json:"status"`
	Attempts      int               `json:"attempts"`
	Replays       int               `json:"replays"`
	LastError     string            `json:"last_error"`
	CreatedAt     *time.Time        `json:"created_at,omitempty"`
	UpdatedAt     *time.Time        `json:"updated_at,omitempty"`
	NextAttemptAt *time.Time        `json:"next_attempt_at,omitempty"`
	LockedBy      string            `json:"locked_by,omitempty"`
	LockedUntil   *time.Time        `json:"locked_until,omitempty"`
	DeliveredAt   *time.Time        `json:"delivered_at,omitempty"`
	// Payload is left out of dead list's records unless --payloads is given.
	Payload json.RawMessage `json:"payload,omitempty"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

func toJSON(r outbox.Record) recordJSON {
	out := recordJSON{
		ID: r.ID.String(), Namespace: r.Namespace, Topic: r.Topic,
		DedupeKey: r.DedupeKey, PartitionKey: r.PartitionKey, Headers: r.Headers,
		Status: string(r.Status), Attempts: r.Attempts, Replays: r.Replays, LastError: r.LastError,
		CreatedAt: timePtr(r.CreatedAt), UpdatedAt: timePtr(r.UpdatedAt),
		NextAttemptAt: timePtr(r.NextAttemptAt), LockedBy: r.LockedBy,
		LockedUntil: timePtr(r.LockedUntil), DeliveredAt: timePtr(r.DeliveredAt),
		Payload: json.RawMessage(r.Payload),
	}
	if r.TenantID != uuid.Nil {
		out.TenantID = r.TenantID.String()
	}
	if !json.Valid(r.Payload) {
		s, _ := json.Marshal(string(r.Payload))
		out.Payload = s
	}
	return out
}

// listFlags are dead list's flags beyond its options: whether --limit was given (for the
// next page's command) and --payloads.
type listFlags struct {
	limitSet, payloads bool
}

func (c *cli) deadList(ctx context.Context, o outbox.ListDeadOptions, lf listFlags) error {
	cn, err := c.connect(ctx, needTable)
	if err != nil {
		return err
	}
	defer cn.Close()
	page, err := cn.store.ListDead(ctx, o)
	if err != nil {
		return fmt.Errorf("list dead rows of %s: %w", cn.table.Name(), err)
	}
	if c.global.json {
		recs := make([]recordJSON, 0, len(page.Records))
		for _, r := range page.Records {
			j := toJSON(r)
			if !lf.payloads {
				j.Payload = nil // a page of big payloads would be megabytes; dead show has each
			}
			recs = append(recs, j)
		}
		c.printJSON(struct {
			Records []recordJSON `json:"records"`
			Next    string       `json:"next"`
		}{recs, page.Next})
		return nil
	}
	if len(page.Records) == 0 {
		fmt.Fprintln(c.stdout, "no dead rows")
		return nil
	}
	tw := c.table()
	fmt.Fprintln(tw, "ID\tNAMESPACE\tTOPIC\tATTEMPTS\tREPLAYS\tDIED\tLAST ERROR")
	for _, r := range page.Records {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\n", r.ID, r.Namespace, r.Topic, r.Attempts, r.Replays,
			r.UpdatedAt.UTC().Format(time.RFC3339), clip(r.LastError, 60))
	}
	_ = tw.Flush()
	if page.Next != "" {
		fmt.Fprintf(c.stdout, "more: %s\n", c.nextPageCommand(cn, o, lf, page.Next))
	}
	return nil
}

// causeJSON is one cause of dead list --group --json, textJSON one of its texts.
type causeJSON struct {
	Fingerprint string     `json:"fingerprint"`
	Count       int64      `json:"count"`
	FirstDied   *time.Time `json:"first_died"`
	LastDied    *time.Time `json:"last_died"`
	Texts       []textJSON `json:"texts"`
}

type textJSON struct {
	LastError string     `json:"last_error"`
	Count     int64      `json:"count"`
	FirstDied *time.Time `json:"first_died"`
	LastDied  *time.Time `json:"last_died"`
}

// deadCauses prints the dead rows grouped by cause, each cause's texts under it.
func (c *cli) deadCauses(ctx context.Context, o outbox.DeadGroupsOptions) error {
	cn, err := c.connect(ctx, needTable)
	if err != nil {
		return err
	}
	defer cn.Close()
	g, err := cn.store.DeadCauses(ctx, o)
	if err != nil {
		return fmt.Errorf("group dead rows of %s: %w", cn.table.Name(), err)
	}
	if c.global.json {
		causes := make([]causeJSON, 0, len(g.Causes))
		for _, k := range g.Causes {
			cj := causeJSON{Fingerprint: k.Fingerprint, Count: k.Count, FirstDied: timePtr(k.FirstDied), LastDied: timePtr(k.LastDied)}
			for _, t := range k.Texts {
				cj.Texts = append(cj.Texts, textJSON{LastError: t.LastError, Count: t.Count, FirstDied: timePtr(t.FirstDied), LastDied: timePtr(t.LastDied)})
			}
			causes = append(causes, cj)
		}
		c.printJSON(map[string]any{"total": g.Total, "ungrouped": g.Ungrouped, "causes": causes})
		return nil
	}
	if g.Total == 0 {
		fmt.Fprintln(c.stdout, "no dead rows")
		return nil
	}
	tw := c.table()
	fmt.Fprintln(tw, "ROWS\tFIRST DIED\tLAST DIED\tCAUSE / TEXTS")
	for _, k := range g.Causes {
		fp := k.Fingerprint
		if fp == "" {
			fp = "(no error recorded)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", k.Count, k.FirstDied.UTC().Format(time.RFC3339), k.LastDied.UTC().Format(time.RFC3339), clip(fp, 100))
		if len(k.Texts) > 1 {
			for _, t := range k.Texts {
				fmt.Fprintf(tw, "\t\t\t  %d × %s\n", t.Count, clip(t.LastError, 96))
			}
		}
	}
	_ = tw.Flush()
	fmt.Fprintf(c.stdout, "%d dead rows in %d causes shown", g.Total, len(g.Causes))
	if g.Ungrouped > 0 {
		fmt.Fprintf(c.stdout, "; %d with errors too rare to group", g.Ungrouped)
	}
	fmt.Fprintln(c.stdout)
	return nil
}

// clip makes s one line of at most n runes.
func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// nextPageCommand returns the command that lists the page after this one, ready to paste
// in a POSIX shell: the flags given on this command line, the time window resolved to
// absolute times (an age such as 7d would have moved on by the time it is pasted), and the
// cursor. Flags that came from the environment are left out, since the shell still has it.
// A --dsn without a password is repeated; one with a password (or anything else that
// redaction hides) is printed as --dsn "$OUTBOX_DSN", since the password is never printed.
func (c *cli) nextPageCommand(cn *conn, o outbox.ListDeadOptions, lf listFlags, next string) string {
	args := []string{"outbox"}
	add := func(flag, v string) { args = append(args, flag, shellQuote(v)) }
	if c.global.dsn != "" {
		if cn.password != "" || cn.shown != c.global.dsn {
			// A secret that redaction hides (sslpassword, say) is never printed either.
			args = append(args, "--dsn", `"$OUTBOX_DSN"`)
		} else {
			add("--dsn", c.global.dsn)
		}
	}
	if c.global.dialect != "" {
		add("--dialect", c.global.dialect)
	}
	if c.global.table != "" {
		add("--table", c.global.table)
	}
	if c.global.schema != "" {
		add("--schema", c.global.schema)
	}
	if c.global.namespace != "" {
		add("--namespace", c.global.namespace)
	}
	for _, t := range c.global.topics {
		add("--topic", t)
	}
	if c.global.tenant != "" {
		add("--tenant", c.global.tenant)
	}
	args = append(args, "dead", "list")
	if lf.limitSet {
		add("--limit", fmt.Sprint(o.Limit))
	}
	if !o.Since.IsZero() {
		add("--since", o.Since.UTC().Format(time.RFC3339Nano))
	}
	if !o.Until.IsZero() {
		add("--until", o.Until.UTC().Format(time.RFC3339Nano))
	}
	add("--cursor", next)
	return strings.Join(args, " ")
}

// shellQuote quotes s for a POSIX shell when it holds anything but characters no shell
// treats specially.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func (c *cli) deadShow(ctx context.Context, id uuid.UUID, sc outbox.Scope) error {
	cn, err := c.connect(ctx, needTable)
	if err != nil {
		return err
	}
	defer cn.Close()
	r, err := cn.store.Get(ctx, id)
	if errors.Is(err, outbox.ErrNotFound) {
		return fmt.Errorf("no row with id %s in table %s", id, cn.table.Name())
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", id, err)
	}
	if !inScope(r, sc) {
		return fmt.Errorf("row %s is outside the scope given (%s): it is in namespace %s, topic %s", id, describeScope(sc), r.Namespace, r.Topic)
	}
	if c.global.json {
		c.printJSON(toJSON(r))
		return nil
	}
	j := toJSON(r)
	tw := c.table()
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s\t%s\n", k, v)
		}
	}
	ts := func(t *time.Time) string {
		if t == nil {
			return ""
		}
		return t.Format(time.RFC3339Nano)
	}
	row("id", j.ID)
	row("namespace", j.Namespace)
	row("topic", j.Topic)
	row("tenant", j.TenantID)
	row("dedupe key", j.DedupeKey)
	row("partition key", j.PartitionKey)
	row("status", j.Status)
	row("attempts", fmt.Sprint(j.Attempts))
	row("replays", fmt.Sprint(j.Replays))
	row("last error", clip(j.LastError, 200))
	row("created", ts(j.CreatedAt))
	row("updated", ts(j.UpdatedAt))
	row("next attempt", ts(j.NextAttemptAt))
	row("locked by", j.LockedBy)
	row("locked until", ts(j.LockedUntil))
	row("delivered", ts(j.DeliveredAt))
	for _, k := range slices.Sorted(maps.Keys(j.Headers)) {
		row("header "+k, j.Headers[k])
	}
	_ = tw.Flush()
	var pretty bytes.Buffer
	if json.Indent(&pretty, j.Payload, "", "  ") != nil {
		pretty.Reset()
		pretty.Write(j.Payload)
	}
	fmt.Fprintf(c.stdout, "payload:\n%s\n", pretty.String())
	return nil
}

// replayOrDiscard replays or discards the rows ids names, within the scope sc. Every id is
// read first: for replay an unknown one is an error before anything changes; for discard it
// is reported as skipped (gone), as [outbox.Store.Discard] reports it, so that a retried
// discard succeeds. Rows outside sc, and rows that are not dead, are skipped, and reported.
func (c *cli) replayOrDiscard(ctx context.Context, args []string, verb string, sc outbox.Scope) error {
	if len(args) == 0 {
		return usagef("dead %s needs at least one id (or, for replay, --all)", verb)
	}
	ids, err := parseIDs(args)
	if err != nil {
		return err
	}
	cn, err := c.connect(ctx, needTable)
	if err != nil {
		return err
	}
	defer cn.Close()
	type skip struct {
		ID     string `json:"id"`
		Status string `json:"status"`           // the row's status, or "gone"
		Reason string `json:"reason,omitempty"` // why it was skipped, when not for its status
	}
	var act []uuid.UUID
	status := map[uuid.UUID]outbox.Status{}
	var unknown []string
	var skipOut []skip
	for _, id := range ids {
		r, err := cn.store.Get(ctx, id)
		switch {
		case errors.Is(err, outbox.ErrNotFound) && verb == "discard":
			skipOut = append(skipOut, skip{ID: id.String(), Status: "gone", Reason: "no such row (already discarded or purged)"})
		case errors.Is(err, outbox.ErrNotFound):
			unknown = append(unknown, id.String())
		case err != nil:
			return fmt.Errorf("read %s: %w", id, err)
		case !inScope(r, sc):
			skipOut = append(skipOut, skip{ID: id.String(), Status: string(r.Status),
				Reason: fmt.Sprintf("outside the scope given (%s): namespace %s, topic %s", describeScope(sc), r.Namespace, r.Topic)})
		default:
			status[id] = r.Status
			act = append(act, id)
		}
	}
	if len(unknown) > 0 {
		return fmt.Errorf("no row with id %s in table %s; nothing was changed", strings.Join(unknown, ", "), cn.table.Name())
	}
	var done, skipped []uuid.UUID
	if len(act) > 0 && verb == "replay" {
		res, err := cn.store.Replay(ctx, act...)
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		done, skipped = res.Replayed, res.Skipped
	} else if len(act) > 0 {
		res, err := cn.store.Discard(ctx, act...)
		if err != nil {
			return fmt.Errorf("discard: %w", err)
		}
		done, skipped = res.Discarded, res.Skipped
	}
	doneOut := make([]string, 0, len(done))
	for _, id := range done {
		doneOut = append(doneOut, id.String())
	}
	for _, id := range skipped {
		skipOut = append(skipOut, skip{ID: id.String(), Status: string(status[id])})
	}
	key := map[string]string{"replay": "replayed", "discard": "discarded"}[verb]
	if c.global.json {
		if skipOut == nil {
			skipOut = []skip{}
		}
		c.printJSON(map[string]any{key: doneOut, "skipped": skipOut})
		return nil
	}
	tw := c.table()
	for _, id := range doneOut {
		fmt.Fprintf(tw, "%s\t%s\n", key, id)
	}
	for _, s := range skipOut {
		why := s.Reason
		if why == "" {
			why = "not dead (" + s.Status + ")"
		}
		fmt.Fprintf(tw, "skipped\t%s\t%s\n", s.ID, why)
	}
	return tw.Flush()
}

// replayAllFlags are dead replay --all's own flags.
type replayAllFlags struct{ dryRun, yes bool }

// replayAll replays every dead row f selects. A dry run counts them instead. A filter
// that selects the whole table (no scope, no time window) replays every dead row at once,
// which can flood a recovering broker: it needs --yes, or a confirmation typed on a
// terminal; without either it is refused before connecting.
func (c *cli) replayAll(ctx context.Context, f outbox.DeadFilter, rf replayAllFlags) error {
	everything := f.Scope.Namespace == "" && len(f.Scope.Topics) == 0 && f.Scope.TenantID == uuid.Nil &&
		f.Since.IsZero() && f.Until.IsZero()
	ask := everything && !rf.dryRun && !rf.yes
	if ask && (c.confirm == nil || c.global.json) {
		return usagef("dead replay --all with no --namespace, --topic, --tenant, --since or --until replays every dead row " +
			"in the table at once: add --yes to do so, or --dry-run to count them first; nothing was changed")
	}
	cn, err := c.connect(ctx, needTable)
	if err != nil {
		return err
	}
	defer cn.Close()
	if rf.dryRun || ask {
		g, err := cn.store.DeadGroups(ctx, outbox.DeadGroupsOptions{DeadFilter: f, Limit: 1})
		if err != nil {
			return fmt.Errorf("count dead rows: %w", err)
		}
		if rf.dryRun {
			if c.global.json {
				c.printJSON(map[string]any{"dry_run": true, "would_replay_count": g.Total})
				return nil
			}
			fmt.Fprintf(c.stdout, "dead rows that would be replayed: %d (dry run: nothing was changed)\n", g.Total)
			return nil
		}
		if g.Total == 0 {
			fmt.Fprintln(c.stdout, "dead rows replayed: 0")
			return nil
		}
		// The rows counted are the rows replayed: those that die after the count are left.
		f.Until = g.Newest.Add(time.Microsecond)
		if !c.confirm(fmt.Sprintf("replay all %d dead rows of table %s? [y/N] ", g.Total, cn.table.Name())) {
			return usagef("not confirmed; nothing was changed")
		}
	}
	n, err := cn.store.ReplayWhere(ctx, f)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	if c.global.json {
		c.printJSON(map[string]int64{"replayed_count": n})
		return nil
	}
	fmt.Fprintf(c.stdout, "dead rows replayed: %d\n", n)
	return nil
}
