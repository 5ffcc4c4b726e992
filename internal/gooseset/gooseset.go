// Package gooseset runs a set of embedded goose migration files, one directory per dialect,
// whose table name is a goose ENVSUB placeholder: the outbox's migrations and the inbox's
// share it. The files are rendered with the table name written in, so the process
// environment cannot change what runs, and each table gets a goose version table of its own.
package gooseset

import (
	"context"
	"database/sql"
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
	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dbkind"
)

// dialects maps the built-in dialect names to goose's.
var dialects = map[string]goose.Dialect{
	"postgres": goose.DialectPostgres,
	"mysql":    goose.DialectMySQL,
	"sqlite":   goose.DialectSQLite3,
}

// Set is one family of migrations.
type Set struct {
	// Name prefixes errors, such as "outbox/migrations".
	Name string
	// FS holds the files, one directory per dialect name.
	FS fs.FS
	// Placeholder is how the files name the table, such as "${OUTBOX_TABLE:-outbox_events}".
	Placeholder string
	// DefaultTable is the table name when none is given.
	DefaultTable string
	// VersionSuffix names the default goose version table, "<table>" + VersionSuffix;
	// default "_goose_version". Two sets on one table need different suffixes. At most
	// 14 bytes, so that the name fits PostgreSQL's 63-byte identifiers after a table name
	// of [dialect.MaxTableBytes].
	VersionSuffix string
	// Schema places the table and the version table in a named schema (PostgreSQL only),
	// named in every statement rather than found through the search_path. Default none.
	Schema string
}

// In returns the set for tables in the named schema ("" for none).
func (s Set) In(schema string) Set {
	s.Schema = schema
	return s
}

// checkSchema validates the set's schema for the dialect: a *outbox.ValidationError for a
// bad name or a dialect other than PostgreSQL.
func (s Set) checkSchema(dialectName string) error {
	if s.Schema == "" {
		return nil
	}
	if dialectName != "postgres" {
		return &outbox.ValidationError{Index: -1, Field: "Schema",
			Reason: fmt.Sprintf("the %s migrations cannot place the table in a schema; leave Schema empty", dialectName)}
	}
	if _, err := dialect.NewTableIn(s.Schema, s.DefaultTable); err != nil {
		return &outbox.ValidationError{Index: -1, Field: "Schema", Reason: err.Error()}
	}
	return nil
}

// maxSuffixBytes is the longest VersionSuffix: 48 + 14 is within PostgreSQL's 63 bytes.
const maxSuffixBytes = 63 - dialect.MaxTableBytes - 1

// aliases maps the other names users give a database (its driver's name, its other
// spellings) to the dialect name, so that "postgresql", "pgx", "sqlite3" or "mariadb"
// migrate as "postgres", "sqlite" and "mysql" do.
var aliases = map[string]string{
	"postgresql": "postgres", "pgx": "postgres", "pgx/v5": "postgres", "pq": "postgres", "lib/pq": "postgres",
	"sqlite3": "sqlite", "mariadb": "mysql",
}

// Dialects lists the dialect names that have migrations.
func Dialects() []string { return slices.Sorted(maps.Keys(dialects)) }

// Canonical returns the dialect name that name stands for: a dialect name, or one of its
// aliases, in any case. ok is false for a name it does not know.
func Canonical(name string) (dialect string, ok bool) {
	n := strings.ToLower(strings.TrimSpace(name))
	if a, found := aliases[n]; found {
		n = a
	}
	_, ok = dialects[n]
	return n, ok
}

// dialect returns the dialect name that name stands for, or an error that lists the names
// it knows.
func (s Set) dialect(name string) (string, error) {
	if d, ok := Canonical(name); ok {
		return d, nil
	}
	return "", fmt.Errorf("%s: no migrations for dialect %q (use one of %s; postgresql, pgx, sqlite3 and mariadb name them too): %w",
		s.Name, name, strings.Join(Dialects(), ", "), errors.ErrUnsupported)
}

// Provider returns a goose Provider for dialect with the files rendered for table (default
// DefaultTable) and the version table versionTable (default "<table>" + VersionSuffix).
// Like every goose Provider, it creates its version table on its first operation.
func (s Set) Provider(db *sql.DB, dialect, table, versionTable string) (*goose.Provider, error) {
	dialect, err := s.dialect(dialect)
	if err != nil {
		return nil, err
	}
	gd := dialects[dialect]
	t, vt, err := s.tables(table, versionTable)
	if err != nil {
		return nil, err
	}
	if err := s.checkSchema(dialect); err != nil {
		return nil, err
	}
	files, err := s.render(dialect, t)
	if err != nil {
		return nil, err
	}
	return goose.NewProvider(gd, db, files, goose.WithTableName(vt), goose.WithDisableGlobalRegistry(true))
}

// Up applies every migration, after checking that db is the kind of database dialect names.
func (s Set) Up(ctx context.Context, db *sql.DB, dialect, table, versionTable string) error {
	dialect, err := s.dialect(dialect)
	if err != nil {
		return err
	}
	p, err := s.Provider(db, dialect, table, versionTable)
	if err != nil {
		return err
	}
	if err := s.matchServer(ctx, db, dialect); err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("%s: up: %w", s.Name, err)
	}
	return nil
}

// HasVersionTable reports whether the set's version table exists, without creating it (a
// goose Provider would): whether the set was ever migrated on this table, by [Set.Up] or a
// [Set.Provider]. It runs the same check of the server as Up first.
func (s Set) HasVersionTable(ctx context.Context, db *sql.DB, dialect, table, versionTable string) (bool, error) {
	dialect, err := s.dialect(dialect)
	if err != nil {
		return false, err
	}
	_, vt, err := s.tables(table, versionTable)
	if err != nil {
		return false, err
	}
	if err := s.checkSchema(dialect); err != nil {
		return false, err
	}
	if err := s.matchServer(ctx, db, dialect); err != nil {
		return false, err
	}
	ok, err := TableExists(ctx, db, dialect, vt)
	if err != nil {
		return false, fmt.Errorf("%s: %w", s.Name, err)
	}
	return ok, nil
}

// TableExists reports whether a table of that name exists where a goose Provider of the
// dialect looks for its version table: PostgreSQL's current schema (the first existing one
// on the search_path) or the schema of a name "schema.table", MySQL's current database,
// SQLite's main database.
func TableExists(ctx context.Context, db *sql.DB, dialect, name string) (bool, error) {
	var q string
	args := []any{name}
	switch dialect {
	case "postgres":
		schema, table, _ := strings.Cut(name, ".")
		if table == "" {
			schema, table = "", name
		}
		q = `SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = coalesce(nullif($2, ''), current_schema()) AND tablename = $1`
		args = []any{table, schema}
	case "mysql":
		q = `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?`
	case "sqlite":
		q = `SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?`
	default:
		return false, fmt.Errorf("no catalog query for dialect %q: %w", dialect, errors.ErrUnsupported)
	}
	var n int
	if err := db.QueryRowContext(ctx, q, args...).Scan(&n); err != nil {
		return false, fmt.Errorf("look for table %s: %w", name, err)
	}
	return n > 0, nil
}

// Down rolls every migration back, after the same check as Up.
func (s Set) Down(ctx context.Context, db *sql.DB, dialect, table, versionTable string) error {
	dialect, err := s.dialect(dialect)
	if err != nil {
		return err
	}
	p, err := s.Provider(db, dialect, table, versionTable)
	if err != nil {
		return err
	}
	if err := s.matchServer(ctx, db, dialect); err != nil {
		return err
	}
	if _, err := p.DownTo(ctx, 0); err != nil {
		return fmt.Errorf("%s: down: %w", s.Name, err)
	}
	return nil
}

func (s Set) table(name string) (string, error) {
	if name == "" {
		name = s.DefaultTable
	}
	t, err := dialect.NewTable(name)
	if err != nil {
		return "", invalidTable(err)
	}
	return t.Name(), nil
}

// invalidTable reports a name dialect.NewTable refused as the library reports bad input: a
// *outbox.ValidationError matching outbox.ErrInvalid.
func invalidTable(err error) error {
	return &outbox.ValidationError{Index: -1, Field: "table", Reason: err.Error()}
}

// tables validates the table name and returns it with the version table's. A version table
// given by the caller must pass [dialect.NewTable]; the default one is the valid table name
// and the set's fixed suffix, which may take it past [dialect.MaxTableBytes] but never past
// PostgreSQL's identifier limit.
func (s Set) tables(table, versionTable string) (t, vt string, err error) {
	t, err = s.table(table)
	if err != nil {
		return "", "", err
	}
	if versionTable != "" {
		if _, err := dialect.NewTable(versionTable); err != nil {
			return "", "", invalidTable(err)
		}
		return t, s.qualify(versionTable), nil
	}
	suffix := s.VersionSuffix
	if suffix == "" {
		suffix = "_goose_version"
	}
	if len(suffix) > maxSuffixBytes {
		return "", "", fmt.Errorf("%s: version table suffix %q is longer than %d bytes", s.Name, suffix, maxSuffixBytes)
	}
	return t, s.qualify(t + suffix), nil
}

// qualify prefixes a version table's name with the set's schema, which goose's PostgreSQL
// store reads as "schema.table".
func (s Set) qualify(name string) string {
	if s.Schema == "" {
		return name
	}
	return s.Schema + "." + name
}

// matchServer checks that db is the kind of database dialect names. A database it does not
// recognise passes: goose will say what it makes of it.
func (s Set) matchServer(ctx context.Context, db *sql.DB, dialect string) error {
	kind, desc, err := dbkind.Detect(ctx, db)
	if err != nil {
		return fmt.Errorf("%s: %w", s.Name, err)
	}
	if kind == "" || kind == dialect {
		return nil
	}
	return &outbox.CheckError{
		Problem: fmt.Sprintf("this pool is %s but the migrations asked for are %s's", desc, dialect),
		Fix:     fmt.Sprintf("migrate with dialect %q", kind),
	}
}

// render returns the dialect's files with the table name written in.
func (s Set) render(dialect, table string) (fs.FS, error) {
	entries, err := fs.ReadDir(s.FS, dialect)
	if err != nil {
		return nil, err
	}
	out := fstest.MapFS{}
	for _, e := range entries {
		b, err := fs.ReadFile(s.FS, dialect+"/"+e.Name())
		if err != nil {
			return nil, err
		}
		text := string(b)
		if s.Schema != "" {
			// Qualify every reference to the table, and the indexes that DROP INDEX names;
			// CREATE INDEX names its index bare, and PostgreSQL puts it in the table's schema.
			q := `"` + s.Schema + `".`
			text = strings.ReplaceAll(text, `DROP INDEX IF EXISTS "`+s.Placeholder, `DROP INDEX IF EXISTS `+q+`"`+s.Placeholder)
			text = strings.ReplaceAll(text, `"`+s.Placeholder+`"`, q+`"`+s.Placeholder+`"`)
		}
		out[e.Name()] = &fstest.MapFile{Data: []byte(strings.ReplaceAll(text, s.Placeholder, table))}
	}
	return out, nil
}

// Version is one migration rendered for a table name.
type Version struct {
	ID       int64
	Up, Down []string
}

// Versions returns the dialect's migrations rendered for table, oldest first, split into
// statements.
func (s Set) Versions(dialect, table string) ([]Version, error) {
	dialect, err := s.dialect(dialect)
	if err != nil {
		return nil, err
	}
	t, err := s.table(table)
	if err != nil {
		return nil, err
	}
	files, err := s.render(dialect, t)
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
			return nil, fmt.Errorf("%s: %s: no version number", s.Name, name)
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

// splitGoose splits one goose file of plain statements (each ending with a semicolon at the
// end of a line, no StatementBegin blocks) into its Up and Down statements; comment lines
// are dropped.
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
