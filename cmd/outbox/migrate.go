package main

import (
	"context"
	"fmt"
	"path"
	"time"

	"github.com/pressly/goose/v3"

	"github.com/outboxgo/outbox/migrations"
)

const migrateUsage = `  outbox migrate up [--to V | --ordered]
                                    apply the embedded migrations (creates the table); with
                                    --ordered also the ordered set: the order index that
                                    ordered publishers need (opt in: it costs every row)
  outbox migrate down [--to V] [--force]
                                    roll back one migration of the base set, or down to
                                    version V; going below version 1 drops the table, after
                                    rolling back the ordered set; dropping a table that holds
                                    undelivered rows needs --force
  outbox migrate down --ordered     roll back the ordered set alone (drops the order index)
  outbox migrate status             list the migrations of both sets and which are applied

V is a version of the base set. The version tables are "<table>_goose_version" (base set)
and "<table>_goose_ordered" (ordered set), as in the migrations package.`

// The migration sets, as "set" in JSON and the SET column.
const (
	setBase    = "base"
	setOrdered = "ordered"
)

type migrationJSON struct {
	Set        string  `json:"set"`
	Version    int64   `json:"version"`
	Source     string  `json:"source"`
	DurationMS float64 `json:"duration_ms"`
}

type migrationStatusJSON struct {
	Set       string     `json:"set"`
	Version   int64      `json:"version"`
	Source    string     `json:"source"`
	Applied   bool       `json:"applied"`
	AppliedAt *time.Time `json:"applied_at,omitempty"`
}

// migrator is the table's two migration sets: the base set, and the ordered set, whose
// provider is only used once its version table exists (a goose Provider creates its version
// table on any operation, and status must not create one for a set nobody applied).
type migrator struct {
	cn      *conn
	base    *goose.Provider
	ordered *goose.Provider
}

// orderedExists reports whether the ordered set's version table exists: whether the set
// was ever applied to the table.
func (m *migrator) orderedExists(ctx context.Context) (bool, error) {
	ok, err := tableExists(ctx, m.cn.db, m.cn.dialect, m.cn.qualify(m.cn.table.Name()+migrations.OrderedVersionSuffix))
	if err != nil {
		return false, fmt.Errorf("read the ordered migrations of %s: %v", m.cn.table.Name(), err)
	}
	return ok, nil
}

// setResult is one migration run, with its set.
type setResult struct {
	set string
	r   *goose.MigrationResult
}

func results(set string, rs []*goose.MigrationResult) []setResult {
	out := make([]setResult, len(rs))
	for i, r := range rs {
		out[i] = setResult{set: set, r: r}
	}
	return out
}

func runMigrate(ctx context.Context, c *cli, args []string) error {
	fs := c.flagSet("migrate")
	to := fs.Int64("to", -1, "target version of the base set (up: at most V; down: down to V, 0 drops the table)")
	force := fs.Bool("force", false, "migrate down: drop the table even if it holds undelivered rows")
	ordered := fs.Bool("ordered", false, "migrate up: also apply the ordered set (the order index ordered publishers need); migrate down: roll back the ordered set alone")
	pos, err := c.parse(fs, migrateUsage, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("migrate needs one of up, down, status (run: outbox help migrate)")
	}
	verb := pos[0]
	n := needExisting
	switch verb {
	case "up":
		n = needServer
	case "down", "status":
	default:
		return usagef("unknown migrate command %q: use up, down or status", verb)
	}
	switch {
	case *ordered && verb == "status":
		return usagef("migrate status lists both sets; it takes no --ordered")
	case *ordered && *to >= 0:
		return usagef("--to names a version of the base set; use it without --ordered (run: outbox help migrate)")
	case *ordered && *force && verb == "down":
		return usagef("migrate down --ordered drops no table; it takes no --force")
	}
	cn, err := c.connect(ctx, n)
	if err != nil {
		return err
	}
	defer cn.Close()
	opts := migrations.Options{Table: cn.table.Name(), Schema: cn.table.Schema()}
	m := &migrator{cn: cn}
	if m.base, err = migrations.NewProvider(cn.db, cn.dialect, opts); err != nil {
		return err
	}
	defer m.base.Close()
	if m.ordered, err = migrations.NewOrderedProvider(cn.db, cn.dialect, opts); err != nil {
		return err
	}
	defer m.ordered.Close()
	switch verb {
	case "up":
		return c.migrateUp(ctx, m, *to, *ordered)
	case "down":
		if *ordered {
			return c.migrateDownOrdered(ctx, m)
		}
		return c.migrateDown(ctx, m, *to, *force)
	default:
		return c.migrateStatus(ctx, m)
	}
}

func (c *cli) migrateUp(ctx context.Context, m *migrator, to int64, ordered bool) error {
	cn := m.cn
	var res []*goose.MigrationResult
	var err error
	if to >= 0 {
		res, err = m.base.UpTo(ctx, to)
	} else {
		res, err = m.base.Up(ctx)
	}
	if err != nil {
		return fmt.Errorf("migrate up %s on %s: %v", cn.table.Name(), cn.shown, err)
	}
	done := results(setBase, res)
	if ordered {
		res, err := m.ordered.Up(ctx)
		if err != nil {
			return fmt.Errorf("migrate up --ordered %s on %s: %v", cn.table.Name(), cn.shown, err)
		}
		done = append(done, results(setOrdered, res)...)
	}
	return c.printMigrations(ctx, m, "applied", done)
}

func (c *cli) migrateDown(ctx context.Context, m *migrator, to int64, force bool) error {
	cn := m.cn
	current, err := m.base.GetDBVersion(ctx)
	if err != nil {
		return fmt.Errorf("migrate down %s on %s: %v", cn.table.Name(), cn.shown, err)
	}
	if to < 0 {
		to = previousVersion(m.base, current)
	}
	// Only a base set that has its first version can go below it: at version 0 there is no
	// table of the base set's to drop (its version table may be another than this command's),
	// and the order index of a table that remains must stay.
	dropping := current >= firstVersion(m.base) && to < firstVersion(m.base)
	if current > 0 && dropping && !force {
		// The first migration creates the table; going below it drops the table.
		if ok, err := cn.tableExists(ctx, cn.table.Name()); err != nil {
			return err
		} else if ok {
			n, err := cn.countUndelivered(ctx)
			if err != nil {
				return fmt.Errorf("count rows of %s: %v", cn.table.Name(), err)
			}
			if n > 0 {
				return usagef("table %s holds %d undelivered rows (pending, processing or dead) that migrate down would drop; pass --force to drop them", cn.table.Name(), n)
			}
		}
	}
	var done []setResult
	if dropping {
		// The order index lives on the table: its set goes first, so that a later
		// migrate up --ordered creates it again.
		has, err := m.orderedExists(ctx)
		if err != nil {
			return err
		}
		if has {
			res, err := m.ordered.DownTo(ctx, 0)
			if err != nil {
				return fmt.Errorf("migrate down %s on %s: the ordered set: %v", cn.table.Name(), cn.shown, err)
			}
			done = results(setOrdered, res)
		}
	}
	res, err := m.base.DownTo(ctx, to)
	if err != nil {
		return fmt.Errorf("migrate down %s on %s: %v", cn.table.Name(), cn.shown, err)
	}
	return c.printMigrations(ctx, m, "rolled back", append(done, results(setBase, res)...))
}

// migrateDownOrdered rolls back the whole ordered set: the table stays, without the order
// index, as for a table that never had it.
func (c *cli) migrateDownOrdered(ctx context.Context, m *migrator) error {
	has, err := m.orderedExists(ctx)
	if err != nil {
		return err
	}
	var done []setResult
	if has {
		res, err := m.ordered.DownTo(ctx, 0)
		if err != nil {
			return fmt.Errorf("migrate down --ordered %s on %s: %v", m.cn.table.Name(), m.cn.shown, err)
		}
		done = results(setOrdered, res)
	}
	return c.printMigrations(ctx, m, "rolled back", done)
}

// previousVersion returns the version below current among the migrations, 0 when none.
func previousVersion(p *goose.Provider, current int64) int64 {
	var prev int64
	for _, s := range p.ListSources() {
		if s.Version < current {
			prev = max(prev, s.Version)
		}
	}
	return prev
}

func firstVersion(p *goose.Provider) int64 {
	first := int64(-1)
	for _, s := range p.ListSources() {
		if first < 0 || s.Version < first {
			first = s.Version
		}
	}
	return first
}

// versions returns the base set's version and the ordered set's (0 when it was never
// applied, without creating its version table).
func (m *migrator) versions(ctx context.Context) (base, ordered int64, hasOrdered bool, err error) {
	name := m.cn.table.Name()
	if base, err = m.base.GetDBVersion(ctx); err != nil {
		return 0, 0, false, fmt.Errorf("read the migration version of %s: %v", name, err)
	}
	if hasOrdered, err = m.orderedExists(ctx); err != nil || !hasOrdered {
		return base, 0, false, err
	}
	if ordered, err = m.ordered.GetDBVersion(ctx); err != nil {
		return 0, 0, false, fmt.Errorf("read the ordered migration version of %s: %v", name, err)
	}
	return base, ordered, true, nil
}

func (c *cli) printMigrations(ctx context.Context, m *migrator, verb string, res []setResult) error {
	cn := m.cn
	version, orderedVersion, hasOrdered, err := m.versions(ctx)
	if err != nil {
		return err
	}
	out := make([]migrationJSON, 0, len(res))
	for _, r := range res {
		out = append(out, migrationJSON{Set: r.set, Version: r.r.Source.Version, Source: path.Base(r.r.Source.Path),
			DurationMS: float64(r.r.Duration.Microseconds()) / 1000})
	}
	if c.global.json {
		key := "applied"
		if verb != "applied" {
			key = "rolled_back"
		}
		c.printJSON(map[string]any{"table": cn.table.Name(), "dialect": cn.dialect, key: out, "version": version, "ordered_version": orderedVersion})
		return nil
	}
	at := fmt.Sprintf("at version %d", version)
	if hasOrdered {
		at += fmt.Sprintf(", ordered set at version %d", orderedVersion)
	}
	if len(out) == 0 {
		fmt.Fprintf(c.stdout, "%s: nothing to do, %s\n", cn.table.Name(), at)
		return nil
	}
	tw := c.table()
	for _, mj := range out {
		fmt.Fprintf(tw, "%s\t%s\t%.1fms\n", verb, sourceName(mj.Set, mj.Source), mj.DurationMS)
	}
	_ = tw.Flush()
	fmt.Fprintf(c.stdout, "%s: %s\n", cn.table.Name(), at)
	return nil
}

// sourceName is a migration's file as the tables show it: the ordered set's under
// ordered/, as in the repository.
func sourceName(set, source string) string {
	if set == setOrdered {
		return setOrdered + "/" + source
	}
	return source
}

func (c *cli) migrateStatus(ctx context.Context, m *migrator) error {
	cn := m.cn
	st, err := m.base.Status(ctx)
	if err != nil {
		return fmt.Errorf("migrate status %s on %s: %v", cn.table.Name(), cn.shown, err)
	}
	out := make([]migrationStatusJSON, 0, len(st)+1)
	add := func(set string, st []*goose.MigrationStatus) {
		for _, s := range st {
			ms := migrationStatusJSON{Set: set, Version: s.Source.Version, Source: path.Base(s.Source.Path), Applied: s.State == goose.StateApplied}
			if ms.Applied {
				at := s.AppliedAt.UTC()
				ms.AppliedAt = &at
			}
			out = append(out, ms)
		}
	}
	add(setBase, st)
	has, err := m.orderedExists(ctx)
	if err != nil {
		return err
	}
	if has {
		if st, err = m.ordered.Status(ctx); err != nil {
			return fmt.Errorf("migrate status %s on %s: the ordered set: %v", cn.table.Name(), cn.shown, err)
		}
		add(setOrdered, st)
	} else {
		for _, s := range m.ordered.ListSources() {
			out = append(out, migrationStatusJSON{Set: setOrdered, Version: s.Version, Source: path.Base(s.Path)})
		}
	}
	if c.global.json {
		c.printJSON(map[string]any{"table": cn.table.Name(), "dialect": cn.dialect, "migrations": out})
		return nil
	}
	tw := c.table()
	fmt.Fprintln(tw, "SET\tVERSION\tMIGRATION\tAPPLIED AT")
	for _, ms := range out {
		at := "pending"
		switch {
		case ms.AppliedAt != nil:
			at = ms.AppliedAt.Format(time.RFC3339)
		case ms.Set == setOrdered:
			at = "not applied (opt in: outbox migrate up --ordered)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", ms.Set, ms.Version, ms.Source, at)
	}
	return tw.Flush()
}
