// Package migrations ships the inbox table's goose migrations for each built-in dialect.
//
// For programmatic use, [Up] and [Down] run the embedded files through a goose Provider
// that keeps its own version table, "<table>_goose_version", so neither the application's
// goose_db_version table nor the outbox's version table is touched; they refuse a pool of
// another kind of database than the dialect named. The SQL files in postgres/, mysql/ and
// sqlite/ also run with the goose command line (they use goose's ENVSUB annotation, with
// outbox_inbox as the default table name); give each table its own version table:
//
//	goose -dir inbox/migrations/postgres -table outbox_inbox_goose_version postgres "$DSN" up
//	OUTBOX_INBOX_TABLE=billing_inbox goose -dir inbox/migrations/postgres -table billing_inbox_goose_version postgres "$DSN" up
package migrations

import (
	"context"
	"database/sql"
	"embed"

	"github.com/pressly/goose/v3"

	"github.com/outboxgo/outbox/inbox"
	"github.com/outboxgo/outbox/internal/gooseset"
)

// FS holds the migration files, one directory per dialect name.
//
//go:embed postgres/*.sql mysql/*.sql sqlite/*.sql
var FS embed.FS

// Placeholder is how the files name the table; goose's ENVSUB expands it on the command line.
const Placeholder = "${OUTBOX_INBOX_TABLE:-" + inbox.DefaultTable + "}"

var set = gooseset.Set{Name: "inbox/migrations", FS: FS, Placeholder: Placeholder, DefaultTable: inbox.DefaultTable}

// Options choose the table to migrate.
type Options struct {
	// Table is the inbox table name; default [inbox.DefaultTable]. It is validated with
	// dialect.NewTable.
	Table string
	// VersionTable is goose's version table; default "<Table>_goose_version".
	VersionTable string
}

// NewProvider returns a goose Provider for the dialect named dialect ("postgres", "mysql" or
// "sqlite") with the files rendered for the table. An unknown dialect returns an error
// matching [errors.ErrUnsupported]; a bad table name a [*outbox.ValidationError].
func NewProvider(db *sql.DB, dialect string, opts Options) (*goose.Provider, error) {
	return set.Provider(db, dialect, opts.Table, opts.VersionTable)
}

// Up applies every migration for the table. Running it again is a no-op.
func Up(ctx context.Context, db *sql.DB, dialect string, opts Options) error {
	return set.Up(ctx, db, dialect, opts.Table, opts.VersionTable)
}

// Down rolls every migration back, dropping the table.
func Down(ctx context.Context, db *sql.DB, dialect string, opts Options) error {
	return set.Down(ctx, db, dialect, opts.Table, opts.VersionTable)
}
