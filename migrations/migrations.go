// Package migrations ships the outbox table's goose migrations for each built-in dialect.
//
// The SQL files in postgres/, mysql/ and sqlite/ run as they are with the goose command line:
//
//	goose -dir migrations/postgres postgres "$DSN" up
//	OUTBOX_TABLE=billing_outbox goose -dir migrations/postgres postgres "$DSN" up
//
// (they use goose's ENVSUB annotation, with outbox_events as the default table name), or
// copy them into your own migration directory. For programmatic use, [Up] and [Down] run
// the embedded files through a goose Provider that keeps its own version table,
// "<table>_goose_version", so the application's goose_db_version table is never touched.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing/fstest"

	"github.com/pressly/goose/v3"

	"github.com/outboxgo/outbox"
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

// NewProvider returns a goose Provider for the dialect named dialect ("postgres", "mysql"
// or "sqlite", as returned by [outbox.Dialect.Name]) with the files rendered for the table.
// An unknown dialect returns an error matching [errors.ErrUnsupported].
func NewProvider(db *sql.DB, dialect string, opts Options) (*goose.Provider, error) {
	gd, ok := gooseDialects[dialect]
	if !ok {
		return nil, fmt.Errorf("outbox/migrations: no migrations for dialect %q: %w", dialect, errors.ErrUnsupported)
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

// Up applies every migration for the table.
func Up(ctx context.Context, db *sql.DB, dialect string, opts Options) error {
	p, err := NewProvider(db, dialect, opts)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("outbox/migrations: up: %w", err)
	}
	return nil
}

// Down rolls every migration back, dropping the table.
func Down(ctx context.Context, db *sql.DB, dialect string, opts Options) error {
	p, err := NewProvider(db, dialect, opts)
	if err != nil {
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
