package inbox

import (
	"context"
	"database/sql"
	"embed"
	"io/fs"

	"github.com/pressly/goose/v3"

	"github.com/outboxgo/outbox/internal/gooseset"
)

// migrationFiles holds the goose files of migrations/<dialect>/.
//
//go:embed migrations/postgres/*.sql migrations/mysql/*.sql migrations/sqlite/*.sql
var migrationFiles embed.FS

// MigrationsFS holds the inbox table's goose migration files, one directory per dialect
// name ("postgres", "mysql", "sqlite"). The same files live in the repository's
// inbox/migrations/ directory and run as they are with the goose command line; they name
// the table with [MigrationPlaceholder], which goose's ENVSUB expands (default
// [DefaultTable]). Give each inbox table a version table of its own:
//
//	goose -dir inbox/migrations/postgres -table outbox_inbox_goose_version postgres "$DSN" up
//	OUTBOX_INBOX_TABLE=billing_inbox goose -dir inbox/migrations/postgres -table billing_inbox_goose_version postgres "$DSN" up
var MigrationsFS fs.FS = mustSub(migrationFiles, "migrations")

// MigrationPlaceholder is how the migration files name the table.
const MigrationPlaceholder = "${OUTBOX_INBOX_TABLE:-" + DefaultTable + "}"

var migrationSet = gooseset.Set{Name: "inbox: migrations", FS: MigrationsFS, Placeholder: MigrationPlaceholder, DefaultTable: DefaultTable}

// mustSub returns the directory dir of fsys; fs.Sub fails only for an invalid path, which a
// constant is not.
func mustSub(fsys fs.FS, dir string) fs.FS {
	s, err := fs.Sub(fsys, dir)
	if err != nil {
		panic(err)
	}
	return s
}

// MigrateOptions choose the inbox table to migrate.
type MigrateOptions struct {
	// Table is the inbox table name; default [DefaultTable]. It is validated like
	// [Options.Table].
	Table string
	// VersionTable is goose's version table; default "<Table>_goose_version", so neither
	// the application's goose_db_version nor the outbox's version table is touched.
	VersionTable string
}

// MigrateUp creates the inbox table for the dialect named dialectName ("postgres", "mysql"
// or "sqlite") by applying every embedded migration; running it again is a no-op. It
// refuses a pool of another kind of database than the dialect named, with an error
// matching [outbox.ErrMisconfigured]; an unknown dialect returns an error matching
// [errors.ErrUnsupported], a bad table name a [*outbox.ValidationError].
func MigrateUp(ctx context.Context, db *sql.DB, dialectName string, opts MigrateOptions) error {
	return migrationSet.Up(ctx, db, dialectName, opts.Table, opts.VersionTable)
}

// MigrateDown rolls every migration back, dropping the inbox table.
func MigrateDown(ctx context.Context, db *sql.DB, dialectName string, opts MigrateOptions) error {
	return migrationSet.Down(ctx, db, dialectName, opts.Table, opts.VersionTable)
}

// NewMigrationProvider returns a goose Provider of the inbox migrations for the dialect,
// rendered for the table, for status queries and step-by-step control.
func NewMigrationProvider(db *sql.DB, dialectName string, opts MigrateOptions) (*goose.Provider, error) {
	return migrationSet.Provider(db, dialectName, opts.Table, opts.VersionTable)
}
