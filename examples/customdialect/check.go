package customdialect

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxgo/outbox/dialect"
)

// Check tells a server of another kind, a missing table and a missing column apart, each
// with what to do.
func (*Dialect) Check(ctx context.Context, db *sql.DB, t dialect.Table) error {
	if err := db.PingContext(ctx); err != nil {
		return err // unreachable: not a matter of configuration
	}
	var version string
	if err := db.QueryRowContext(ctx, `SELECT version()`).Scan(&version); err != nil || !strings.HasPrefix(version, "PostgreSQL") {
		return &dialect.CheckError{
			Problem: "the database is not PostgreSQL",
			Fix:     "open a PostgreSQL database with the pgx driver for this dialect",
			Err:     err,
		}
	}
	rows, err := db.QueryContext(ctx, `SELECT column_name FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name = $1`, t.Name())
	if err != nil {
		return err
	}
	have, err := collect(rows)
	if err != nil {
		return err
	}
	fix := fmt.Sprintf("run customdialect.Up(ctx, db, %q)", t.Name())
	if len(have) == 0 {
		return &dialect.CheckError{Problem: fmt.Sprintf("table %q does not exist", t.Name()), Fix: fix}
	}
	var missing []string
	for _, c := range columns {
		if !slices.Contains(have, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return &dialect.CheckError{
			Problem: fmt.Sprintf("table %q lacks column(s) %s", t.Name(), strings.Join(missing, ", ")),
			Fix:     "it was made by other migrations: drop it and " + fix,
		}
	}
	return nil
}

// CheckOrdered refuses ordered claims on a table without the index they need: without it
// each claim would walk every live row of a key.
func (*Dialect) CheckOrdered(ctx context.Context, db *sql.DB, t dialect.Table) error {
	var n int
	err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_indexes WHERE schemaname = current_schema() AND indexname = $1`,
		orderIndex(t.Name())).Scan(&n)
	if err != nil {
		return err
	}
	if n == 0 {
		return &dialect.CheckError{
			Problem: fmt.Sprintf("table %q lacks the index %q that ordered claims need", t.Name(), orderIndex(t.Name())),
			Fix:     fmt.Sprintf("run customdialect.UpOrdered(ctx, db, %q)", t.Name()),
		}
	}
	return nil
}

func collect(rows *sql.Rows) ([]string, error) {
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// channel is the LISTEN channel of a table: the schema is in the payload, so that tables
// of one name in several schemas do not wake each other's publishers.
func channel(t dialect.Table) string { return "outbox_custom_" + t.Name() }

// Signal queues a notification on the caller's transaction: PostgreSQL delivers it when
// the transaction commits, never when it rolls back, and merges duplicates within it.
func (*Dialect) Signal(ctx context.Context, q dialect.DBTX, t dialect.Table, namespace string) error {
	_, err := q.ExecContext(ctx, `SELECT pg_notify($1, current_schema() || '/' || $2)`, channel(t), namespace)
	return err
}

// Listen holds one connection of db for as long as it listens; it never returns it to the
// pool, since a connection that listens must serve nobody else.
func (*Dialect) Listen(ctx context.Context, db *sql.DB, t dialect.Table, ready func(), wake func(namespace string)) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	var schema string
	if err := conn.QueryRowContext(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return err
	}
	return conn.Raw(func(dc any) error {
		pc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("customdialect: listen needs the pgx driver, not %T: %w", dc, errors.ErrUnsupported)
		}
		c := pc.Conn()
		if _, err := c.Exec(ctx, `LISTEN `+quote(channel(t))); err != nil {
			return errors.Join(errBadConn, err)
		}
		ready()
		for {
			n, err := c.WaitForNotification(ctx)
			if err != nil {
				return errors.Join(errBadConn, err)
			}
			if ns, ok := strings.CutPrefix(n.Payload, schema+"/"); ok {
				wake(ns)
			}
		}
	})
}
