// Package migrations ships the outbox table's goose migrations for each built-in dialect,
// in two sets:
//
//   - the base set (postgres/, mysql/, sqlite/): the table and what every user needs;
//   - the ordered set (ordered/postgres/, ordered/mysql/, ordered/sqlite/): the order index
//     that [outbox.PublisherOptions.Ordered] needs. It is opt in because it costs every
//     table that has it, ordered publishers or not: an index entry per row at enqueue, and
//     index writes as rows change state. It is applied after the base set, has its own
//     numbering and its own goose version table, and can be added to an existing table
//     at any time.
//
// Three ways to apply them:
//
//  1. From the program: [Up] and [Down] run the embedded files through goose Providers
//     with version tables of their own, "<table>_goose_version" for the base set and
//     "<table>_goose_ordered" for the ordered set, so the application's goose_db_version
//     table is never touched. [Options.Ordered] adds the ordered set. [Up] refuses a pool
//     of another kind of database than the dialect named.
//
//  2. With the goose command line, from the files, which use goose's ENVSUB annotation for
//     the table name (default outbox_events). Give each outbox table and each set its own
//     version table with -table, or the second run would find the first's versions applied
//     and do nothing; apply the ordered set after the base set, and roll it back first:
//
//     goose -dir migrations/postgres -table outbox_events_goose_version postgres "$DSN" up
//     goose -dir migrations/ordered/postgres -table outbox_events_goose_ordered postgres "$DSN" up
//     OUTBOX_TABLE=billing_outbox goose -dir migrations/postgres -table billing_outbox_goose_version postgres "$DSN" up
//
//  3. Inside your own goose migrations: [Versions] and [OrderedVersions] return each
//     migration's statements for a table name, to run from Go migrations of your own
//     numbering (copying the files would collide with your own version numbers). See the
//     examples of [Versions] and [OrderedVersions].
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"io/fs"

	"github.com/pressly/goose/v3"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/dialects/postgres"
	"github.com/outboxgo/outbox/internal/gooseset"
)

// FS holds the migration files: the base set, one directory per dialect name, and the
// ordered set under ordered/, one directory per dialect name.
//
//go:embed postgres/*.sql mysql/*.sql sqlite/*.sql ordered/postgres/*.sql ordered/mysql/*.sql ordered/sqlite/*.sql
var FS embed.FS

// set is the base set: the files name the table with goose's ENVSUB placeholder, which the
// command line expands.
var set = gooseset.Set{
	Name: "outbox/migrations", FS: FS,
	Placeholder: placeholder, DefaultTable: outbox.DefaultTable,
}

// ordered is the ordered set, with its own version table.
var ordered = gooseset.Set{
	Name: "outbox/migrations (ordered)", FS: sub(FS, "ordered"),
	Placeholder: placeholder, DefaultTable: outbox.DefaultTable, VersionSuffix: OrderedVersionSuffix,
}

const placeholder = "${OUTBOX_TABLE:-" + outbox.DefaultTable + "}"

// OrderedVersionSuffix names the ordered set's goose version table: "<table>" +
// OrderedVersionSuffix, "outbox_events_goose_ordered" for the default table.
const OrderedVersionSuffix = "_goose_ordered"

// sub returns the directory dir of fsys. fs.Sub fails only for an invalid path, which a
// constant of this package is not.
func sub(fsys fs.FS, dir string) fs.FS {
	s, err := fs.Sub(fsys, dir)
	if err != nil {
		panic(err)
	}
	return s
}

// Options choose the table to migrate.
type Options struct {
	// Table is the outbox table name; default outbox.DefaultTable. It is validated with
	// [dialect.NewTable].
	Table string
	// Schema places the table, its indexes and the version tables in a named schema,
	// which must exist, named in every statement whatever the connection's search_path
	// (PostgreSQL only; the other dialects refuse it with a *outbox.ValidationError). Give
	// the Store the same [outbox.Options.Schema]. Default none.
	Schema string
	// VersionTable is goose's version table of the base set; default
	// "<Table>_goose_version".
	VersionTable string
	// Ordered also creates what [outbox.PublisherOptions.Ordered] needs: [Up] applies the
	// ordered set after the base set, with its own version table "<Table>_goose_ordered"
	// ([OrderedVersionSuffix]). It costs every row one more index entry at enqueue and
	// index writes as the row changes state, whether or not publishers order, so leave it
	// off unless they do. A table migrated without it gets it later from Up again with
	// Ordered set. [Down] rolls the ordered set back whenever it finds it, whatever Ordered
	// says.
	Ordered bool
}

// Dialects lists the dialect names that have migrations.
func Dialects() []string { return gooseset.Dialects() }

// NewProvider returns a goose Provider for the base set of the dialect named dialect
// ("postgres", "mysql" or "sqlite", as returned by [outbox.Dialect.Name]) with the files
// rendered for the table. Every function of this package that takes a dialect name also
// takes the names users give those databases, in any case: "postgresql", "pgx" and "pq"
// for "postgres", "mariadb" for "mysql", "sqlite3" for "sqlite". It ignores opts.Ordered: [NewOrderedProvider] returns the ordered
// set's. An unknown dialect returns an error matching [errors.ErrUnsupported] that lists
// the known ones.
func NewProvider(db *sql.DB, dialect string, opts Options) (*goose.Provider, error) {
	return set.In(opts.Schema).Provider(db, dialect, opts.Table, opts.VersionTable)
}

// NewOrderedProvider returns a goose Provider for the ordered set of the dialect, rendered
// for opts.Table, with the version table "<Table>_goose_ordered" (opts.VersionTable and
// opts.Ordered do not apply). Apply it after the base set ([NewProvider]) and roll it back
// before the base set goes below its first version. Like every goose Provider, it creates
// its version table on its first operation, even a status.
func NewOrderedProvider(db *sql.DB, dialect string, opts Options) (*goose.Provider, error) {
	return ordered.In(opts.Schema).Provider(db, dialect, opts.Table, "")
}

// Up applies every migration of the base set for the table and, with opts.Ordered, then
// every migration of the ordered set. It first checks that db is the kind of database the
// dialect names, and returns an error matching [outbox.ErrMisconfigured] when it is not,
// or when PostgreSQL's driver meets prepared statements of another client (behind a
// transaction-pooling proxy; the error says what to set).
func Up(ctx context.Context, db *sql.DB, dialect string, opts Options) error {
	if err := set.In(opts.Schema).Up(ctx, db, dialect, opts.Table, opts.VersionTable); err != nil {
		return explain(dialect, err)
	}
	if !opts.Ordered {
		return nil
	}
	return explain(dialect, ordered.In(opts.Schema).Up(ctx, db, dialect, opts.Table, ""))
}

// explain turns a prepared statement error of PostgreSQL into the [*outbox.CheckError]
// that the Store's operations return for it.
func explain(dialect string, err error) error {
	var state interface{ SQLState() string }
	if dialect == "postgres" && errors.As(err, &state) && (state.SQLState() == "42P05" || state.SQLState() == "26000") {
		return postgres.PreparedBehindPooler(err)
	}
	return err
}

// Down rolls every migration back, dropping the table: first the ordered set, when its
// version table exists (whatever opts.Ordered says), then the base set. A later [Up] with
// Ordered creates the order index again. Like [Up], it refuses a pool of another kind of
// database.
func Down(ctx context.Context, db *sql.DB, dialect string, opts Options) error {
	has, err := ordered.In(opts.Schema).HasVersionTable(ctx, db, dialect, opts.Table, "")
	if err != nil {
		return err
	}
	if has {
		if err := ordered.In(opts.Schema).Down(ctx, db, dialect, opts.Table, ""); err != nil {
			return err
		}
	}
	return set.In(opts.Schema).Down(ctx, db, dialect, opts.Table, opts.VersionTable)
}

// Version is one migration of the outbox table, rendered for a table name.
type Version struct {
	// ID is the migration's goose version number (1, 2, ...).
	ID int64
	// Up and Down are its statements, in order, one SQL statement each.
	Up, Down []string
}

// Versions returns the dialect's base set rendered for the table (default
// outbox.DefaultTable), oldest first, for running from your own goose Go migrations: add
// one Go migration of your own numbering per Version, and a new one when a later release
// of this package adds a Version. Statements run one per ExecContext call, inside the Go
// migration's transaction (MySQL commits DDL statements implicitly, as with goose's files).
// For ordered publishers, add [OrderedVersions] after these.
func Versions(dialect, table string) ([]Version, error) {
	return versions(set, dialect, table)
}

// OrderedVersions returns the dialect's ordered set rendered for the table, oldest first:
// the order index that [outbox.PublisherOptions.Ordered] needs (see [Options.Ordered] for
// what it costs). Its IDs are the ordered set's own numbering, from 1. Run them as with
// [Versions], from Go migrations of your own numbering after those of the base set (the
// index needs the table), and roll them back before the table is dropped.
func OrderedVersions(dialect, table string) ([]Version, error) {
	return versions(ordered, dialect, table)
}

func versions(s gooseset.Set, dialect, table string) ([]Version, error) {
	vs, err := s.Versions(dialect, table)
	if err != nil {
		return nil, err
	}
	out := make([]Version, len(vs))
	for i, v := range vs {
		out[i] = Version(v)
	}
	return out, nil
}
