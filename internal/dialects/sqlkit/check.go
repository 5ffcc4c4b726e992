package sqlkit

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dbkind"
)

// dialectHints name the constructor of each built-in dialect, for error messages.
var dialectHints = map[string]string{"postgres": "outbox.Postgres()", "mysql": "outbox.MySQL()", "sqlite": "outbox.SQLite()"}

// WrongDialect is the error of a pool of the given kind (described by desc) used with the
// dialect name.
func WrongDialect(desc, kind, name string) *dialect.CheckError {
	fix := "use the dialect that matches the database"
	if h, ok := dialectHints[kind]; ok {
		fix = "use " + h + " for this pool"
	}
	return &dialect.CheckError{Problem: fmt.Sprintf("this pool is %s but the dialect is %s", desc, name), Fix: fix}
}

// CheckTables is the check the built-in dialects share: the server kind, then the
// columns of each table the dialect needs (listed by columns, which returns none for a
// missing table).
func CheckTables(ctx context.Context, db *sql.DB, name string, t dialect.Table,
	columns func(ctx context.Context, db *sql.DB, table string) ([]string, error), tables map[string][]string) error {
	kind, desc, err := dbkind.Detect(ctx, db)
	if err != nil {
		return err
	}
	if kind != name {
		return WrongDialect(desc, kind, name)
	}
	migrate := migrateFix(name, t)
	for _, table := range slices.Sorted(maps.Keys(tables)) {
		have, err := columns(ctx, db, table)
		if err != nil {
			return err
		}
		if len(have) == 0 {
			return &dialect.CheckError{Problem: fmt.Sprintf("table %q does not exist", table), Fix: migrate}
		}
		var missing []string
		for _, c := range tables[table] {
			if !slices.Contains(have, c) {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			return &dialect.CheckError{
				Problem: fmt.Sprintf("table %q lacks column(s) %s", table, strings.Join(missing, ", ")),
				Fix:     "it was created by other or older migrations: " + migrate,
			}
		}
	}
	return nil
}

// CheckDueIndex is the check of the due index that unordered claims read, for the dialect
// name: found tells whether the table t has it (valid, where a database can hold an invalid
// one). A table migrated before the index existed lacks it.
func CheckDueIndex(name string, t dialect.Table, found bool) error {
	if found {
		return nil
	}
	return &dialect.CheckError{
		Problem: fmt.Sprintf("table %q lacks index %s, which claims read", t.Name(), t.Index("due")),
		Fix:     "it was created by older migrations: " + migrateFix(name, t),
	}
}

// QueryStrings runs a query returning one text column and collects it.
func QueryStrings(ctx context.Context, db *sql.DB, query string, args ...any) ([]string, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, strings.ToLower(s))
	}
	return out, rows.Err()
}

// migrateFix says how to migrate the table t for the dialect name, with its schema if any.
func migrateFix(name string, t dialect.Table) string {
	opts, flags := fmt.Sprintf("Table: %q", t.Name()), " --table "+t.Name()
	if s := t.Schema(); s != "" {
		opts += fmt.Sprintf(", Schema: %q", s)
		flags += " --schema " + s
	}
	return fmt.Sprintf("run migrations.Up(ctx, db, %q, migrations.Options{%s}) or `outbox migrate up --dialect %s%s`", name, opts, name, flags)
}

// MissingTable returns the [*dialect.CheckError] of a statement on the outbox table t that
// failed with err because the table does not exist, for the dialect name: it says to
// migrate, and wraps err. Each dialect recognises its database's error itself.
func MissingTable(name string, t dialect.Table, err error) *dialect.CheckError {
	return &dialect.CheckError{
		Problem: fmt.Sprintf("the outbox table %q does not exist", t.Name()),
		Fix:     migrateFix(name, t),
		Err:     err,
	}
}

// CheckKind is the part of a [dialect.Checker] the built-in dialects share: is the
// pool the database the dialect name is written for? The kind comes from the type of the
// pool's driver drv (pgx, lib/pq, go-sql-driver/mysql, modernc.org/sqlite,
// mattn/go-sqlite3), without a query; only a driver it does not know (one wrapped by a
// tracing package) makes it ask tx SELECT version() (valid on PostgreSQL and MySQL) and,
// where that fails, as it does on SQLite without harm to the transaction, SELECT
// sqlite_version(). A mismatch is described as Check describes it, by the server's own
// version query.
//
// It reports same when the pool is the dialect's database; otherwise the error is
// [WrongDialect]'s, the error of a version query, or nil for a server it does not
// recognise (which passes: Check says what it is).
func CheckKind(ctx context.Context, name string, drv driver.Driver, tx dialect.DBTX) (same bool, err error) {
	kind := dbkind.FromDriver(drv)
	if kind == name {
		return true, nil
	}
	found, desc, err := dbkind.Version(ctx, tx, kind)
	switch {
	case err != nil:
		return false, err
	case found == "":
		return false, nil
	case found != name:
		return false, WrongDialect(desc, found, name)
	}
	return true, nil
}

// CheckServer is the [dialect.Checker] of a built-in dialect that reads info: it
// judges the server info describes ([JudgeServer]), given what the Store uses.
func CheckServer(info ServerInfo, err error, p dialect.ServerParams) error {
	if err != nil {
		return err
	}
	info.Notify = p.Notify
	if ce := JudgeServer(info); ce != nil {
		return ce
	}
	return nil
}

// orderedFix says how to create what ordered claims need on the table t, after why, on
// lines of their own, one way to fix it each, so that the error reads well where it is
// printed whole (log.Fatal(err) of Publisher.Run, say).
func orderedFix(why, name string, t dialect.Table) string {
	return fmt.Sprintf("\n%s.\nIt is in the ordered migration set, which is opt in; create it with one of:\n"+
		"  migrations.Up(ctx, db, %q, migrations.Options{Table: %q, Ordered: true})\n"+
		"  outbox migrate up --ordered --dialect %s --table %s\n"+
		"  migrations.OrderedVersions(%q, %q), added to the goose migrations that create the table",
		why, name, t.Name(), name, t.Name(), name, t.Name())
}

// CheckOrderedTable is the ordered check the built-in dialects share: want lists what
// ordered claims need on the table t ("index <name>", "column <name>"), and have tells which
// of them exist; exists tells whether the table does.
func CheckOrderedTable(name string, t dialect.Table, exists bool, want []string, have map[string]bool) error {
	if !exists {
		return &dialect.CheckError{Problem: fmt.Sprintf("the outbox table %q does not exist", t.Name()),
			Fix: orderedFix("ordered delivery (PublisherOptions.Ordered) needs it with its order index", name, t)}
	}
	var missing []string
	for _, w := range want {
		if !have[w] {
			missing = append(missing, w)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return &dialect.CheckError{
		Problem: fmt.Sprintf("table %q lacks %s", t.Name(), strings.Join(missing, " and ")),
		Fix:     orderedFix("ordered delivery (PublisherOptions.Ordered) needs the order index", name, t),
	}
}
