// Package migrations ships the outbox table's goose migrations for each built-in dialect.
//
// Three ways to apply them:
//
//  1. From the program: [Up] and [Down] run the embedded files through a goose Provider
//     with a version table of its own, "<table>_goose_version", so the application's
//     goose_db_version table is never touched. [Up] refuses a pool of another kind of
//     database than the dialect named.
//
//  2. With the goose command line, from the files in postgres/, mysql/ and sqlite/, which
//     use goose's ENVSUB annotation for the table name (default outbox_events). Give each
//     outbox table its own version table with -table, or the second table's migrations
//     would find the first's versions applied and do nothing:
//
//     goose -dir migrations/postgres -table outbox_goose_version postgres "$DSN" up
//     OUTBOX_TABLE=billing_outbox goose -dir migrations/postgres -table billing_outbox_goose_version postgres "$DSN" up
//
//  3. Inside your own goose migrations: [Versions] returns each migration's statements for
//     a table name, to run from Go migrations of your own numbering (copying the files
//     would collide with your own version numbers). See the example of [Versions].
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing/fstest"

	"github.com/pressly/goose/v3"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/dbkind"
)

// FS holds the migration files, one directory per dialect name.
//
//go:embed postgres/*.sql mysql/*.sql sqlite/*.sql
var FS embed.FS

// placeholder is how the files name the table; goose's ENVSUB expands it on the command line.
const placeholder = "${OUTBOX_TABLE:-outbox_events}"

var gooseDialects = map[string]goose.Dialect{
	"postgres": goose.DialectPostgres,
	"mysql":    goose.DialectMySQL,
	"sqlite":   goose.DialectSQLite3,
}

// Options choose the table to migrate.
type Options struct {
	// Table is the outbox table name; default outbox.DefaultTable. It is validated with
	// [outbox.NewTable].
	Table string
	// VersionTable is goose's version table; default "<Table>_goose_version".
	VersionTable string
}

// Dialects lists the dialect names that have migrations.
func Dialects() []string { return slices.Sorted(maps.Keys(gooseDialects)) }

// unknownDialect is the error for a dialect name without migrations.
func unknownDialect(dialect string) error {
	return fmt.Errorf("outbox/migrations: no migrations for dialect %q (have: %s): %w",
		dialect, strings.Join(Dialects(), ", "), errors.ErrUnsupported)
}

// NewProvider returns a goose Provider for the dialect named dialect ("postgres", "mysql"
// or "sqlite", as returned by [outbox.Dialect.Name]) with the files rendered for the table.
// An unknown dialect returns an error matching [errors.ErrUnsupported] that lists the
// known ones.
func NewProvider(db *sql.DB, dialect string, opts Options) (*goose.Provider, error) {
	gd, ok := gooseDialects[dialect]
	if !ok {
		return nil, unknownDialect(dialect)
	}
	name := opts.Table
	if name == "" {
		name = outbox.DefaultTable
	}
	table, err := outbox.NewTable(name)
	if err != nil {
		return nil, err
	}
	version := opts.VersionTable
	if version == "" {
		version = table.Name() + "_goose_version"
	}
	if _, err := outbox.NewTable(version); err != nil {
		return nil, err
	}
	files, err := render(dialect, table.Name())
	if err != nil {
		return nil, err
	}
	return goose.NewProvider(gd, db, files, goose.WithTableName(version), goose.WithDisableGlobalRegistry(true))
}

// Up applies every migration for the table. It first checks that db is the kind of
// database the dialect names, and returns an error matching [outbox.ErrMisconfigured]
// when it is not.
func Up(ctx context.Context, db *sql.DB, dialect string, opts Options) error {
	p, err := NewProvider(db, dialect, opts)
	if err != nil {
		return err
	}
	if err := matchServer(ctx, db, dialect); err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("outbox/migrations: up: %w", err)
	}
	return nil
}

// Down rolls every migration back, dropping the table. Like [Up], it refuses a pool of
// another kind of database.
func Down(ctx context.Context, db *sql.DB, dialect string, opts Options) error {
	p, err := NewProvider(db, dialect, opts)
	if err != nil {
		return err
	}
	if err := matchServer(ctx, db, dialect); err != nil {
		return err
	}
	if _, err := p.DownTo(ctx, 0); err != nil {
		return fmt.Errorf("outbox/migrations: down: %w", err)
	}
	return nil
}

// render returns the dialect's files with the table name written in, so goose's ENVSUB
// finds nothing left to expand and the process environment cannot change the result.
func render(dialect, table string) (fs.FS, error) {
	entries, err := fs.ReadDir(FS, dialect)
	if err != nil {
		return nil, err
	}
	out := fstest.MapFS{}
	for _, e := range entries {
		b, err := fs.ReadFile(FS, dialect+"/"+e.Name())
		if err != nil {
			return nil, err
		}
		out[e.Name()] = &fstest.MapFile{Data: []byte(strings.ReplaceAll(string(b), placeholder, table))}
	}
	return out, nil
}

// matchServer checks that db is the kind of database dialect names. A database it does not
// recognise passes: goose will say what it makes of it.
func matchServer(ctx context.Context, db *sql.DB, dialect string) error {
	kind, desc, err := dbkind.Detect(ctx, db)
	if err != nil {
		return fmt.Errorf("outbox/migrations: %w", err)
	}
	if kind == "" || kind == dialect {
		return nil
	}
	return &outbox.CheckError{
		Problem: fmt.Sprintf("this pool is %s but the migrations asked for are %s's", desc, dialect),
		Fix:     fmt.Sprintf("migrate with dialect %q", kind),
	}
}

// Version is one migration of the outbox table, rendered for a table name.
type Version struct {
	// ID is the migration's goose version number (1, 2, ...).
	ID int64
	// Up and Down are its statements, in order, one SQL statement each.
	Up, Down []string
}

// Versions returns the dialect's migrations rendered for the table (default
// outbox.DefaultTable), oldest first, for running from your own goose Go migrations: add
// one Go migration of your own numbering per Version, and a new one when a later release
// of this package adds a Version. Statements run one per ExecContext call, inside the Go
// migration's transaction (MySQL commits DDL statements implicitly, as with goose's files).
func Versions(dialect, table string) ([]Version, error) {
	if _, ok := gooseDialects[dialect]; !ok {
		return nil, unknownDialect(dialect)
	}
	if table == "" {
		table = outbox.DefaultTable
	}
	t, err := outbox.NewTable(table)
	if err != nil {
		return nil, err
	}
	files, err := render(dialect, t.Name())
	if err != nil {
		return nil, err
	}
	names, err := fs.Glob(files, "*.sql")
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	out := make([]Version, 0, len(names))
	for _, name := range names {
		id, err := strconv.ParseInt(strings.SplitN(name, "_", 2)[0], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("outbox/migrations: %s: no version number", name)
		}
		b, err := fs.ReadFile(files, name)
		if err != nil {
			return nil, err
		}
		up, down := splitGoose(string(b))
		out = append(out, Version{ID: id, Up: up, Down: down})
	}
	return out, nil
}

// splitGoose splits one of this package's goose files into its Up and Down statements.
// The files hold plain statements, each ending with a semicolon at the end of a line, and
// no StatementBegin blocks; comment lines are dropped.
func splitGoose(src string) (up, down []string) {
	var cur *[]string
	var stmt strings.Builder
	for _, line := range strings.Split(src, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "-- +goose Up"):
			cur = &up
			continue
		case strings.HasPrefix(trimmed, "-- +goose Down"):
			cur = &down
			continue
		case cur == nil, trimmed == "", strings.HasPrefix(trimmed, "--"):
			continue
		}
		stmt.WriteString(line)
		stmt.WriteString("\n")
		if strings.HasSuffix(trimmed, ";") {
			*cur = append(*cur, strings.TrimSpace(stmt.String()))
			stmt.Reset()
		}
	}
	return up, down
}
