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

	"github.com/pressly/goose/v3"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/gooseset"
)

// FS holds the migration files, one directory per dialect name.
//
//go:embed postgres/*.sql mysql/*.sql sqlite/*.sql
var FS embed.FS

// set is this package's migrations: the files name the table with goose's ENVSUB
// placeholder, which the command line expands.
var set = gooseset.Set{
	Name: "outbox/migrations", FS: FS,
	Placeholder: "${OUTBOX_TABLE:-" + outbox.DefaultTable + "}", DefaultTable: outbox.DefaultTable,
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
func Dialects() []string { return gooseset.Dialects() }

// NewProvider returns a goose Provider for the dialect named dialect ("postgres", "mysql"
// or "sqlite", as returned by [outbox.Dialect.Name]) with the files rendered for the table.
// An unknown dialect returns an error matching [errors.ErrUnsupported] that lists the
// known ones.
func NewProvider(db *sql.DB, dialect string, opts Options) (*goose.Provider, error) {
	return set.Provider(db, dialect, opts.Table, opts.VersionTable)
}

// Up applies every migration for the table. It first checks that db is the kind of
// database the dialect names, and returns an error matching [outbox.ErrMisconfigured]
// when it is not.
func Up(ctx context.Context, db *sql.DB, dialect string, opts Options) error {
	return set.Up(ctx, db, dialect, opts.Table, opts.VersionTable)
}

// Down rolls every migration back, dropping the table. Like [Up], it refuses a pool of
// another kind of database.
func Down(ctx context.Context, db *sql.DB, dialect string, opts Options) error {
	return set.Down(ctx, db, dialect, opts.Table, opts.VersionTable)
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
	vs, err := set.Versions(dialect, table)
	if err != nil {
		return nil, err
	}
	out := make([]Version, len(vs))
	for i, v := range vs {
		out[i] = Version(v)
	}
	return out, nil
}
