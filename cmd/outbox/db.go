package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/google/uuid"

	_ "github.com/go-sql-driver/mysql" // registers "mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	_ "modernc.org/sqlite"             // registers "sqlite"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/migrations"
)

// connectTimeout bounds the first contact with the server.
const connectTimeout = 15 * time.Second

// conn is an open database with the command's table on it.
type conn struct {
	target
	db    *sql.DB
	table dialect.Table
	store *outbox.Store
}

func (c *conn) Close() error { return c.db.Close() }

// needs says what a command requires of the database before it runs.
type needs int

const (
	// needTable: the outbox table exists and its migrations are applied (every command
	// but migrate).
	needTable needs = iota
	// needServer: only a reachable server; a SQLite file may be created (migrate up).
	needServer
	// needExisting: a reachable server and, for SQLite, an existing file (migrate down,
	// migrate status).
	needExisting
)

// tableName validates --table.
func (c *cli) tableName() (dialect.Table, error) {
	name := c.global.table
	if name == "" {
		name = outbox.DefaultTable
	}
	if _, err := dialect.NewTable(name); err != nil {
		return dialect.Table{}, usagef("invalid --table: %s", err)
	}
	t, err := dialect.NewTableIn(c.global.schema, name)
	if err != nil {
		return dialect.Table{}, usagef("invalid --schema: %s", err)
	}
	return t, nil
}

// scope returns the rows --namespace, --topic and --tenant select.
func (c *cli) scope() (outbox.Scope, error) {
	sc := outbox.Scope{Namespace: c.namespace(), Topics: c.global.topics}
	if c.global.tenant != "" {
		id, err := parseID(c.global.tenant)
		if err != nil {
			return outbox.Scope{}, usagef("invalid --tenant: %v", err)
		}
		sc.TenantID = id
	}
	return sc, nil
}

// parseID parses a row id, accepting only the canonical 36-character form.
func parseID(s string) (uuid.UUID, error) {
	id, err := uuid.Parse(s)
	if err != nil || len(s) != 36 {
		return uuid.Nil, fmt.Errorf("%q is not a UUID (want the form 0190f2a4-5c1e-7b3a-9d2e-4f6a8b0c1d2e)", s)
	}
	return id, nil
}

// connect validates the table name and the DSN, opens the database, checks that the server
// answers and, for needTable, that the table is there and migrated. Nothing is written.
// Only stats takes several databases; every other command refuses them here, before it
// connects to anything.
func (c *cli) connect(ctx context.Context, n needs) (*conn, error) {
	if len(c.global.dsns) > 1 || c.global.dsnFile != "" {
		return nil, usagef("only stats and ui take several databases (--dsn more than once, --dsn-file); give this command one --dsn")
	}
	table, err := c.tableName()
	if err != nil {
		return nil, err
	}
	dsn := c.global.dsn
	if dsn == "" {
		dsn = c.env("OUTBOX_DSN")
	}
	t, err := resolve(c.dialect(), dsn)
	if err != nil {
		return nil, err
	}
	c.secrets = append(c.secrets, t.secrets()...)
	return open(ctx, t, table, n)
}

// dialect is --dialect, or OUTBOX_DIALECT.
func (c *cli) dialect() string {
	if c.global.dialect != "" {
		return c.global.dialect
	}
	return c.env("OUTBOX_DIALECT")
}

// secrets returns the strings of t never to print.
func (t target) secrets() []string {
	return append(secretsOf(t.password), secretsOf(t.sslPassword)...)
}

// open opens a resolved database with the command's table on it; see [cli.connect]. It
// touches nothing of the cli, so that stats may open several side by side.
func open(ctx context.Context, t target, table dialect.Table, n needs) (*conn, error) {
	if t.sqlitePath != "" && n != needServer {
		if _, err := os.Stat(t.sqlitePath); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("no SQLite database at %s (create it with: outbox migrate up)", t.sqlitePath)
		}
	}
	db, err := sql.Open(t.driver, t.dsn)
	if err != nil {
		return nil, fmt.Errorf("cannot open %s: %v", t.shown, err)
	}
	// One connection: a command runs one statement or short transaction at a time, takes
	// no more of a production server than that, and a call that held a connection while it
	// waited for another would hang here at once rather than on a busy day (outbox ui, which
	// serves requests side by side, raises it).
	db.SetMaxOpenConns(1)
	cn := &conn{target: t, db: db, table: table}
	if err := cn.check(ctx, n); err != nil {
		_ = db.Close()
		return nil, err
	}
	d := map[string]func() outbox.Dialect{"postgres": outbox.Postgres, "mysql": outbox.MySQL, "sqlite": outbox.SQLite}[t.dialect]
	cn.store, err = outbox.New(db, d(), outbox.Options{Table: table.Name(), Schema: table.Schema()})
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	return cn, nil
}

func (cn *conn) check(ctx context.Context, n needs) error {
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := cn.db.PingContext(pctx); err != nil {
		return fmt.Errorf("cannot connect to %s: %v (check --dsn or OUTBOX_DSN, and that the server is running)", cn.shown, err)
	}
	if n != needTable {
		return nil
	}
	ok, err := cn.tableExists(ctx, cn.table.Name())
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("table %s does not exist in %s; run: outbox migrate up (with the same --dsn and --table)", cn.table.Name(), cn.shown)
	}
	current, target, known, err := cn.versions(ctx)
	if err != nil {
		return err
	}
	if known && current < target {
		return fmt.Errorf("table %s is at migration %d, this command needs %d; run: outbox migrate up", cn.table.Name(), current, target)
	}
	return nil
}

// tableExists reports whether the table is visible on the connection (PostgreSQL: in the
// --schema, or on its search_path without one; MySQL: in its database).
func (cn *conn) tableExists(ctx context.Context, name string) (bool, error) {
	var q string
	args := []any{name}
	switch cn.dialect {
	case "postgres":
		q = `SELECT count(*) FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
			WHERE c.relname = $1 AND c.relkind IN ('r', 'p')
			AND (n.nspname = $2 OR ($2 = '' AND n.nspname = ANY (current_schemas(false))))`
		args = append(args, cn.table.Schema())
	case "mysql":
		q = `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?`
	case "sqlite":
		q = `SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?`
	}
	var count int
	if err := cn.db.QueryRowContext(ctx, q, args...).Scan(&count); err != nil {
		return false, fmt.Errorf("look for table %s: %v", name, err)
	}
	return count > 0, nil
}

// versions returns the highest applied migration recorded in the table's goose version
// table (migrations.Options' default, "<table>_goose_version") and the newest embedded
// one. known is false when that version table is absent (the table was migrated another
// way, as with the goose command line and its own version table): then nothing is known.
func (cn *conn) versions(ctx context.Context) (current, target int64, known bool, err error) {
	p, err := migrations.NewProvider(cn.db, cn.dialect, migrations.Options{Table: cn.table.Name(), Schema: cn.table.Schema()})
	if err != nil {
		return 0, 0, false, err
	}
	for _, s := range p.ListSources() {
		target = max(target, s.Version)
	}
	vt := cn.table.Name() + "_goose_version"
	ok, err := cn.tableExists(ctx, vt)
	if err != nil || !ok {
		return 0, target, false, err
	}
	// The names passed validation with the outbox table's rules (NewTableIn).
	if err := cn.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version_id), 0) FROM `+cn.qualify(vt)).Scan(&current); err != nil {
		return 0, target, false, fmt.Errorf("read %s: %v", vt, err)
	}
	return current, target, true, nil
}

// countUndelivered returns how many rows are not delivered (pending, processing, dead).
func (cn *conn) countUndelivered(ctx context.Context) (int64, error) {
	var n int64
	err := cn.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+cn.qualify(cn.table.Name())+` WHERE status <> 'delivered'`).Scan(&n)
	return n, err
}

// qualify prefixes a table of the outbox's schema with that schema, when --schema is given.
func (cn *conn) qualify(name string) string {
	if s := cn.table.Schema(); s != "" {
		return s + "." + name
	}
	return name
}
