// Package migrations ships the inbox table's goose migrations for each built-in dialect.
//
// The SQL files in postgres/, mysql/ and sqlite/ run as they are with the goose command line:
//
//	goose -dir inbox/migrations/postgres postgres "$DSN" up
//	OUTBOX_INBOX_TABLE=billing_inbox goose -dir inbox/migrations/postgres postgres "$DSN" up
//
// (they use goose's ENVSUB annotation, with outbox_inbox as the default table name), or copy
// them into your own migration directory. For programmatic use, [Up] and [Down] run the
// embedded files through a goose Provider that keeps its own version table,
// "<table>_goose_version", so neither the application's goose_db_version table nor the
// outbox's version table is touched.
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
	"github.com/outboxgo/outbox/inbox"
)

// FS holds the migration files, one directory per dialect name.
//
//go:embed postgres/*.sql mysql/*.sql sqlite/*.sql
var FS embed.FS

// Placeholder is how the files name the table; goose's ENVSUB expands it on the command line.
const Placeholder = "${OUTBOX_INBOX_TABLE:-" + inbox.DefaultTable + "}"

var gooseDialects = map[string]goose.Dialect{
	"postgres": goose.DialectPostgres,
	"mysql":    goose.DialectMySQL,
	"sqlite":   goose.DialectSQLite3,
}

// Options choose the table to migrate.
type Options struct {
	// Table is the inbox table name; default [inbox.DefaultTable]. It is validated with
	// [outbox.NewTable].
	Table string
	// VersionTable is goose's version table; default "<Table>_goose_version".
	VersionTable string
}

// NewProvider returns a goose Provider for the dialect named dialect ("postgres", "mysql" or
// "sqlite") with the files rendered for the table. An unknown dialect returns an error
// matching [errors.ErrUnsupported]; a bad table name a [*outbox.ValidationError].
func NewProvider(db *sql.DB, dialect string, opts Options) (*goose.Provider, error) {
	gd, ok := gooseDialects[dialect]
	if !ok {
		return nil, fmt.Errorf("inbox/migrations: no migrations for dialect %q: %w", dialect, errors.ErrUnsupported)
	}
	name := opts.Table
	if name == "" {
		name = inbox.DefaultTable
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

// Up applies every migration for the table. Running it again is a no-op.
func Up(ctx context.Context, db *sql.DB, dialect string, opts Options) error {
	p, err := NewProvider(db, dialect, opts)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("inbox/migrations: up: %w", err)
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
		return fmt.Errorf("inbox/migrations: down: %w", err)
	}
	return nil
}

// render returns the dialect's files with the table name written in, so goose's ENVSUB finds
// nothing left to expand and the process environment cannot change the result.
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
		out[e.Name()] = &fstest.MapFile{Data: []byte(strings.ReplaceAll(string(b), Placeholder, table))}
	}
	return out, nil
}
