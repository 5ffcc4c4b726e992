package main

import (
	"context"
	"fmt"
	"path"
	"time"

	"github.com/pressly/goose/v3"

	"github.com/outboxgo/outbox/migrations"
)

const migrateUsage = `  outbox migrate up [--to V]        apply the embedded migrations (creates the table)
  outbox migrate down [--to V] [--force]
                                    roll back one migration, or down to version V;
                                    dropping a table that holds undelivered rows needs --force
  outbox migrate status             list the migrations and which are applied

The version table is "<table>_goose_version", as in the migrations package.`

type migrationJSON struct {
	Version    int64   `json:"version"`
	Source     string  `json:"source"`
	DurationMS float64 `json:"duration_ms"`
}

type migrationStatusJSON struct {
	Version   int64      `json:"version"`
	Source    string     `json:"source"`
	Applied   bool       `json:"applied"`
	AppliedAt *time.Time `json:"applied_at,omitempty"`
}

func runMigrate(ctx context.Context, c *cli, args []string) error {
	fs := c.flagSet("migrate")
	to := fs.Int64("to", -1, "target version (up: at most V; down: down to V, 0 drops the table)")
	force := fs.Bool("force", false, "migrate down: drop the table even if it holds undelivered rows")
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
	cn, err := c.connect(ctx, n)
	if err != nil {
		return err
	}
	defer cn.Close()
	p, err := migrations.NewProvider(cn.db, cn.dialect, migrations.Options{Table: cn.table.Name()})
	if err != nil {
		return err
	}
	defer p.Close()
	switch verb {
	case "up":
		return c.migrateUp(ctx, cn, p, *to)
	case "down":
		return c.migrateDown(ctx, cn, p, *to, *force)
	default:
		return c.migrateStatus(ctx, cn, p)
	}
}

func (c *cli) migrateUp(ctx context.Context, cn *conn, p *goose.Provider, to int64) error {
	var res []*goose.MigrationResult
	var err error
	if to >= 0 {
		res, err = p.UpTo(ctx, to)
	} else {
		res, err = p.Up(ctx)
	}
	if err != nil {
		return fmt.Errorf("migrate up %s on %s: %v", cn.table.Name(), cn.shown, err)
	}
	return c.printMigrations(ctx, cn, p, "applied", res)
}

func (c *cli) migrateDown(ctx context.Context, cn *conn, p *goose.Provider, to int64, force bool) error {
	current, err := p.GetDBVersion(ctx)
	if err != nil {
		return fmt.Errorf("migrate down %s on %s: %v", cn.table.Name(), cn.shown, err)
	}
	if to < 0 {
		to = previousVersion(p, current)
	}
	if current > 0 && to < firstVersion(p) && !force {
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
	res, err := p.DownTo(ctx, to)
	if err != nil {
		return fmt.Errorf("migrate down %s on %s: %v", cn.table.Name(), cn.shown, err)
	}
	return c.printMigrations(ctx, cn, p, "rolled back", res)
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

func (c *cli) printMigrations(ctx context.Context, cn *conn, p *goose.Provider, verb string, res []*goose.MigrationResult) error {
	version, err := p.GetDBVersion(ctx)
	if err != nil {
		return fmt.Errorf("read the migration version of %s: %v", cn.table.Name(), err)
	}
	out := make([]migrationJSON, 0, len(res))
	for _, r := range res {
		out = append(out, migrationJSON{Version: r.Source.Version, Source: path.Base(r.Source.Path),
			DurationMS: float64(r.Duration.Microseconds()) / 1000})
	}
	if c.global.json {
		key := "applied"
		if verb != "applied" {
			key = "rolled_back"
		}
		c.printJSON(map[string]any{"table": cn.table.Name(), "dialect": cn.dialect, key: out, "version": version})
		return nil
	}
	if len(out) == 0 {
		fmt.Fprintf(c.stdout, "%s: nothing to do, at version %d\n", cn.table.Name(), version)
		return nil
	}
	tw := c.table()
	for _, m := range out {
		fmt.Fprintf(tw, "%s\t%s\t%.1fms\n", verb, m.Source, m.DurationMS)
	}
	_ = tw.Flush()
	fmt.Fprintf(c.stdout, "%s: at version %d\n", cn.table.Name(), version)
	return nil
}

func (c *cli) migrateStatus(ctx context.Context, cn *conn, p *goose.Provider) error {
	st, err := p.Status(ctx)
	if err != nil {
		return fmt.Errorf("migrate status %s on %s: %v", cn.table.Name(), cn.shown, err)
	}
	out := make([]migrationStatusJSON, 0, len(st))
	for _, s := range st {
		m := migrationStatusJSON{Version: s.Source.Version, Source: path.Base(s.Source.Path), Applied: s.State == goose.StateApplied}
		if m.Applied {
			at := s.AppliedAt.UTC()
			m.AppliedAt = &at
		}
		out = append(out, m)
	}
	if c.global.json {
		c.printJSON(map[string]any{"table": cn.table.Name(), "dialect": cn.dialect, "migrations": out})
		return nil
	}
	tw := c.table()
	fmt.Fprintln(tw, "VERSION\tMIGRATION\tAPPLIED AT")
	for _, m := range out {
		at := "pending"
		if m.AppliedAt != nil {
			at = m.AppliedAt.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\n", m.Version, m.Source, at)
	}
	return tw.Flush()
}
