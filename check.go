package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dbkind"
)

// ErrMisconfigured marks a database that answers but is not set up for the outbox as the
// [Store] is configured: the table is missing or incomplete, the dialect does not match
// the server, or SQLite is opened without the settings concurrent writers need. Retrying
// does not help; the [*CheckError] that matches it says what to change.
var ErrMisconfigured = dialect.ErrMisconfigured

// CheckError is a setup problem found by [Store.Check], or met by an operation (a missing
// table): its Problem says what is wrong, its Fix what to do, and Err is the database
// error behind it, if any. It matches [ErrMisconfigured].
type CheckError = dialect.CheckError

// Check verifies that the store can work: the database answers, it is the kind the dialect
// is written for, the table exists with every column the library uses, and, on SQLite, the
// connection runs in WAL mode with a busy timeout. The built-in dialects also recognise the
// distributed SQL servers that imitate PostgreSQL or MySQL, and refuse those the claim is
// unsafe on or where the Store's settings are known to fail: TiDB (which ignores SKIP
// LOCKED), CockroachDB, YugabyteDB before 2025.2.3 unless [Options.DisableNotify] is set,
// and an outbox table that Citus distributes. A setup problem returns a [*CheckError]
// (matching [ErrMisconfigured]) that says what to do; a database that cannot be reached
// returns its error, which may pass. A [Publisher] runs Check when it starts; call it from a
// readiness probe or at startup to fail fast. A dialect that does not implement [dialect.Checker]
// returns an error matching [errors.ErrUnsupported].
func (s *Store) Check(ctx context.Context) error {
	c, ok := s.dialect.(dialect.Checker)
	if !ok {
		return fmt.Errorf("outbox: check: dialect %s cannot check its database: %w", s.dialect.Name(), errors.ErrUnsupported)
	}
	// A distributed SQL server that imitates the dialect's database is recognised first:
	// the rest of the check would take it for the real thing (or, for one it does not
	// recognise at all, say only that the dialect is wrong).
	if ce := judge(ctx, s.dialect, s.db, s.table, s.notifier != nil); ce != nil {
		return ce
	}
	if err := c.Check(ctx, s.db, s.table); err != nil {
		var ce *CheckError
		if errors.As(err, &ce) {
			return err
		}
		return fmt.Errorf("outbox: check: %w", err)
	}
	return nil
}

// dialectHints name the constructor of each built-in dialect, for error messages.
var dialectHints = map[string]string{"postgres": "outbox.Postgres()", "mysql": "outbox.MySQL()", "sqlite": "outbox.SQLite()"}

// wrongDialect is the error of a pool of the given kind (described by desc) used with the
// dialect name.
func wrongDialect(desc, kind, name string) *CheckError {
	fix := "use the dialect that matches the database"
	if h, ok := dialectHints[kind]; ok {
		fix = "use " + h + " for this pool"
	}
	return &CheckError{Problem: fmt.Sprintf("this pool is %s but the dialect is %s", desc, name), Fix: fix}
}

// checkBuiltin is the check the built-in dialects share: the server kind, then the
// columns of each table the dialect needs (listed by columns, which returns none for a
// missing table).
func checkBuiltin(ctx context.Context, db *sql.DB, name string, t dialect.Table,
	columns func(ctx context.Context, db *sql.DB, table string) ([]string, error), tables map[string][]string) error {
	kind, desc, err := dbkind.Detect(ctx, db)
	if err != nil {
		return err
	}
	if kind != name {
		return wrongDialect(desc, kind, name)
	}
	migrate := migrateFix(name, t.Name())
	for _, table := range slices.Sorted(maps.Keys(tables)) {
		have, err := columns(ctx, db, table)
		if err != nil {
			return err
		}
		if len(have) == 0 {
			return &CheckError{Problem: fmt.Sprintf("table %q does not exist", table), Fix: migrate}
		}
		var missing []string
		for _, c := range tables[table] {
			if !slices.Contains(have, c) {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			return &CheckError{
				Problem: fmt.Sprintf("table %q lacks column(s) %s", table, strings.Join(missing, ", ")),
				Fix:     "it was created by other or older migrations: " + migrate,
			}
		}
	}
	return nil
}

// queryStrings runs a query returning one text column and collects it.
func queryStrings(ctx context.Context, db *sql.DB, query string, args ...any) ([]string, error) {
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

// migrateFix says how to create or update the table of the dialect name: in code, or
// with the command, whose flags name both, so that it can be pasted as it is.
func migrateFix(name, table string) string {
	return fmt.Sprintf("run migrations.Up(ctx, db, %q, migrations.Options{Table: %q}) or `outbox migrate up --dialect %s --table %s`",
		name, table, name, table)
}

// missingTable returns a [*CheckError] wrapping err, from a statement on the outbox table,
// when the database says the table does not exist, so that the caller learns to migrate;
// nil otherwise.
func missingTable(d Dialect, t dialect.Table, err error) *CheckError {
	msg := err.Error()
	var state interface{ SQLState() string }
	gone := strings.Contains(msg, "no such table") || // SQLite
		strings.Contains(msg, "Error 1146") || // MySQL, MariaDB: table doesn't exist
		(errors.As(err, &state) && state.SQLState() == "42P01") // PostgreSQL: undefined_table
	if !gone {
		return nil
	}
	return &CheckError{
		Problem: fmt.Sprintf("the outbox table %q does not exist", t.Name()),
		Fix:     migrateFix(d.Name(), t.Name()),
		Err:     err,
	}
}

// packetTooLarge returns a [*CheckError] wrapping err when MySQL or MariaDB refused a
// statement for exceeding max_allowed_packet (the server's error 1153, or its refusal of a
// long parameter, both of which name the setting), or when go-sql-driver refused to send
// it for exceeding its own maxAllowedPacket (ErrPktTooLarge, matched by its text: the root
// package imports no driver); nil otherwise. Either way the payload is bigger than the
// database accepts while [Options.MaxPayloadBytes] let it pass.
func packetTooLarge(err error) *CheckError {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "max_allowed_packet") || strings.Contains(msg, "Error 1153"):
		return &CheckError{
			Problem: "the statement is bigger than the server's max_allowed_packet (the server closes the connection, " +
				"and the transaction with it)",
			Fix: "raise max_allowed_packet on the server (SET GLOBAL max_allowed_packet = 67108864, and the same in its " +
				"configuration file), or lower Options.MaxPayloadBytes below it",
			Err: err,
		}
	case strings.Contains(msg, "packet for query is too large"):
		return &CheckError{
			Problem: "the statement is bigger than go-sql-driver's maxAllowedPacket",
			Fix: "raise maxAllowedPacket in the DSN (maxAllowedPacket=0 uses the server's max_allowed_packet), " +
				"or lower Options.MaxPayloadBytes below it",
			Err: err,
		}
	}
	return nil
}

// brokenBigWrite explains a connection that broke while MySQL or MariaDB was sent a
// payload of a mebibyte or more: the server closes the connection when a packet exceeds
// max_allowed_packet, and go-sql-driver, which sends a big bound payload in chunks,
// sometimes finds the connection closed before it reads the server's error. It returns nil
// for another dialect, a smaller write or another error. The connection may have broken for
// another reason, so the error is not a [*CheckError]; it wraps err.
func brokenBigWrite(d Dialect, err error, rows []dialect.Row) error {
	if _, ok := d.(mysqlDialect); !ok || !errors.Is(err, driver.ErrBadConn) {
		return nil
	}
	size := 0
	for _, r := range rows {
		size += len(r.Payload)
	}
	if size < 1<<20 {
		return nil
	}
	return fmt.Errorf("outbox: enqueue: the connection broke while sending %d bytes of payload; if that is more than "+
		"the server's max_allowed_packet, raise it (SET GLOBAL max_allowed_packet = 67108864, and the same in its "+
		"configuration file) or lower Options.MaxPayloadBytes below it: %w", size, err)
}

// Check implements [dialect.Checker].
func (d *postgresDialect) Check(ctx context.Context, db *sql.DB, t dialect.Table) error {
	return checkBuiltin(ctx, db, d.Name(), t, func(ctx context.Context, db *sql.DB, table string) ([]string, error) {
		return queryStrings(ctx, db, `SELECT attname FROM pg_attribute WHERE attrelid = to_regclass($1)`+
			` AND attnum > 0 AND NOT attisdropped`, quoteIdent(table, '"'))
	}, map[string][]string{t.Name(): recordColumns})
}

// Check implements [dialect.Checker]. MySQL keeps dedupe keys in a second table, <table>_dedupe,
// and their lock stripes in a third, <table>_dedupe_lock.
func (d mysqlDialect) Check(ctx context.Context, db *sql.DB, t dialect.Table) error {
	return checkBuiltin(ctx, db, d.Name(), t, func(ctx context.Context, db *sql.DB, table string) ([]string, error) {
		return queryStrings(ctx, db, `SELECT column_name FROM information_schema.columns`+
			` WHERE table_schema = DATABASE() AND table_name = ?`, table)
	}, map[string][]string{
		t.Name():                  recordColumns,
		t.Name() + "_dedupe":      {"namespace", "topic", "dedupe_key", "id"},
		t.Name() + "_dedupe_lock": {"stripe"},
	})
}

// sqliteDSN is the connection string the SQLite checks recommend.
const sqliteDSN = "file:app.db?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate"

// Check implements [dialect.Checker]. Besides the table, it reads the connection's journal mode and
// busy timeout: without WAL, readers block the writer, and without a busy timeout a writer
// that finds the database locked fails at once with SQLITE_BUSY instead of waiting its
// turn. An in-memory database (journal mode "memory") needs neither.
func (d sqliteDialect) Check(ctx context.Context, db *sql.DB, t dialect.Table) error {
	err := checkBuiltin(ctx, db, d.Name(), t, func(ctx context.Context, db *sql.DB, table string) ([]string, error) {
		return queryStrings(ctx, db, `SELECT name FROM pragma_table_info(?)`, table)
	}, map[string][]string{t.Name(): recordColumns})
	if err != nil {
		return err
	}
	// One connection answers both, so the pair describes one connection of the pool.
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	var mode string
	var timeout int
	if err := conn.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		return err
	}
	if err := conn.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&timeout); err != nil {
		return err
	}
	return sqliteSettings(mode, timeout)
}

// sqliteSettings judges a connection's journal mode and busy timeout: nil, or the error
// that says what to change.
func sqliteSettings(mode string, timeout int) error {
	mode = strings.ToLower(mode)
	if mode == "memory" || (mode == "wal" && timeout > 0) {
		return nil
	}
	return &CheckError{
		Problem: fmt.Sprintf("SQLite runs with journal_mode=%s and busy_timeout=%dms: concurrent writers will fail with "+
			"SQLITE_BUSY (database is locked)", mode, timeout),
		Fix: "open it with journal_mode WAL, a busy timeout and immediate transactions, as in the DSN " + sqliteDSN,
	}
}

// The built-in dialects check what ordered claims need.
var (
	_ dialect.OrderedClaimer = (*postgresDialect)(nil)
	_ dialect.OrderedClaimer = mysqlDialect{}
	_ dialect.OrderedClaimer = sqliteDialect{}
)

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

// checkOrderedBuiltin is the ordered check the built-in dialects share: want lists what
// ordered claims need on the table t ("index <name>", "column <name>"), and have tells which
// of them exist; exists tells whether the table does.
func checkOrderedBuiltin(name string, t dialect.Table, exists bool, want []string, have map[string]bool) error {
	if !exists {
		return &CheckError{Problem: fmt.Sprintf("the outbox table %q does not exist", t.Name()),
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
	return &CheckError{
		Problem: fmt.Sprintf("table %q lacks %s", t.Name(), strings.Join(missing, " and ")),
		Fix:     orderedFix("ordered delivery (PublisherOptions.Ordered) needs the order index", name, t),
	}
}

// CheckOrdered implements [dialect.OrderedClaimer]: the order index and the unkeyed index, found
// among the table's own indexes (so in its schema, whichever the search_path resolves the
// table to), and valid. A CREATE INDEX CONCURRENTLY that failed leaves an invalid index,
// which PostgreSQL maintains but never reads, and which the migration's CREATE INDEX IF NOT
// EXISTS would skip.
func (d *postgresDialect) CheckOrdered(ctx context.Context, db *sql.DB, t dialect.Table) error {
	want := []string{t.Index("order"), t.Index("unkeyed")}
	rows, err := db.QueryContext(ctx, `SELECT c.relname, x.indisvalid FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid`+
		` WHERE x.indrelid = to_regclass($1) AND c.relname IN ($2, $3)`, quoteIdent(t.Name(), '"'), want[0], want[1])
	if err != nil {
		return err
	}
	defer rows.Close()
	have := map[string]bool{}
	var invalid []string
	for rows.Next() {
		var name string
		var valid bool
		if err := rows.Scan(&name, &valid); err != nil {
			return err
		}
		have["index "+name] = true
		if !valid {
			invalid = append(invalid, name)
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(invalid) > 0 {
		slices.Sort(invalid)
		rebuild := make([]string, len(invalid))
		for i, n := range invalid {
			rebuild[i] = "REINDEX INDEX CONCURRENTLY " + quoteIdent(n, '"')
		}
		return &CheckError{
			Problem: fmt.Sprintf("index %s of table %q is invalid (a CREATE INDEX CONCURRENTLY failed), so ordered claims would read the whole table",
				strings.Join(invalid, " and "), t.Name()),
			Fix: "rebuild it: " + strings.Join(rebuild, "; "),
		}
	}
	exists := true
	if len(have) < len(want) {
		if err := db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, quoteIdent(t.Name(), '"')).Scan(&exists); err != nil {
			return err
		}
	}
	return checkOrderedBuiltin(d.Name(), t, exists, []string{"index " + want[0], "index " + want[1]}, have)
}

// CheckOrdered implements [dialect.OrderedClaimer]: the virtual column order_key and the order
// index on it, in the connection's database.
func (d mysqlDialect) CheckOrdered(ctx context.Context, db *sql.DB, t dialect.Table) error {
	var tables, columns, indexes int
	err := db.QueryRowContext(ctx, `SELECT`+
		` (SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?),`+
		` (SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = ? AND column_name = 'order_key'),`+
		` (SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = ? AND index_name = ?)`,
		t.Name(), t.Name(), t.Name(), t.Index("order")).Scan(&tables, &columns, &indexes)
	if err != nil {
		return err
	}
	col, idx := "column order_key", "index "+t.Index("order")
	return checkOrderedBuiltin(d.Name(), t, tables > 0, []string{col, idx}, map[string]bool{col: columns > 0, idx: indexes > 0})
}

// CheckOrdered implements [dialect.OrderedClaimer]: the order index and the unkeyed index.
func (d sqliteDialect) CheckOrdered(ctx context.Context, db *sql.DB, t dialect.Table) error {
	want := []string{t.Index("order"), t.Index("unkeyed")}
	names, err := queryStrings(ctx, db, `SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND name IN (?, ?)`,
		t.Name(), want[0], want[1])
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, n := range names {
		have["index "+n] = true
	}
	exists := true
	if len(have) < len(want) {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?`, t.Name()).Scan(&n); err != nil {
			return err
		}
		exists = n > 0
	}
	return checkOrderedBuiltin(d.Name(), t, exists, []string{"index " + want[0], "index " + want[1]}, have)
}
