package postgres

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"reflect"
	"strings"
	"time"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// Signal implements [dialect.Notifier] with NOTIFY on a channel named after the table, carrying the
// schema and the namespace ("schema:namespace"): channels are shared by every schema of a
// database, and tables of one name in several schemas must not wake each other's
// publishers. PostgreSQL delivers it when the transaction commits, drops it on rollback,
// and folds identical notifications of one transaction into one, so a transaction that
// enqueues many events sends one signal per namespace.
func (d *Dialect) Signal(ctx context.Context, q dialect.DBTX, t dialect.Table, namespace string) error {
	st, _ := d.RenderSignal(t, namespace)
	_, err := q.ExecContext(ctx, st.Query, st.Args...)
	return err
}

// RenderSignal implements [sqlkit.Renderer]: the statement Signal runs.
func (*Dialect) RenderSignal(t dialect.Table, namespace string) (sqlkit.Statement, bool) {
	if t.Schema() != "" {
		return sqlkit.Statement{Query: `SELECT pg_notify($1, $2)`, Args: []any{pgChannel(t), t.Schema() + ":" + namespace}}, true
	}
	return sqlkit.Statement{Query: `SELECT pg_notify($1, current_schema() || ':' || $2)`, Args: []any{t.Name(), namespace}}, true
}

// pgChannel returns the NOTIFY channel of the table: its name, or for a table in a named
// schema "schema.name", so that the same table name in two schemas has two channels. A
// channel is an identifier, at most 63 bytes: a longer "schema.name" becomes the start of
// the name and a hash of the whole.
func pgChannel(t dialect.Table) string {
	if t.Schema() == "" {
		return t.Name()
	}
	c := t.Schema() + "." + t.Name()
	if len(c) <= 63 {
		return c
	}
	h := fnv.New64a()
	h.Write([]byte(c))
	return fmt.Sprintf("%.46s_%016x", t.Name(), h.Sum64())
}

// Listen implements [dialect.Notifier]: LISTEN on a connection of its own, taken from db and
// closed, never returned to the pool, when it stops. Waiting for notifications is not part
// of database/sql, so it uses the pgx driver's connection (github.com/jackc/pgx/v5/stdlib),
// found by its methods so that this package imports no driver; with another driver it
// returns an error matching [errors.ErrUnsupported].
func (*Dialect) Listen(ctx context.Context, db *sql.DB, t dialect.Table, ready func(), wake func(namespace string)) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	schema := t.Schema()
	if schema == "" {
		if err := conn.QueryRowContext(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
			return err
		}
	}
	err = conn.Raw(func(dc any) error {
		wait, closeConn, err := pgxWaiter(dc)
		if err != nil {
			return err // the connection is still clean: it goes back to the pool
		}
		// From here on the connection listens: it must never serve anyone else. ErrBadConn
		// makes database/sql close its driver connection, but a *sql.DB over a pgxpool.Pool
		// (stdlib.OpenDBFromPool) only releases it to that pool, which keeps a connection
		// that is not closed: so close the pgx connection itself too.
		defer closeConn()
		channel := sqlkit.QuoteIdent(pgChannel(t), '"')
		if err := execRaw(ctx, dc, `LISTEN `+channel); err != nil {
			return errors.Join(driver.ErrBadConn, err)
		}
		heard := func(payload string) {
			if ns, ok := strings.CutPrefix(payload, schema+":"); ok {
				wake(ns)
			}
		}
		if err := probe(ctx, db, channel, wait, heard); err != nil {
			if errors.Is(err, errDeaf) {
				// Best effort: the pooler's server connection that ran LISTEN may be another
				// client's by now, and would hear the table's signals for nothing.
				_ = execRaw(context.WithoutCancel(ctx), dc, `UNLISTEN `+channel)
			}
			return errors.Join(driver.ErrBadConn, err)
		}
		ready()
		for {
			payload, err := wait(ctx)
			if err != nil {
				return errors.Join(driver.ErrBadConn, err)
			}
			heard(payload)
		}
	})
	if errors.Is(err, errDeaf) {
		return errDeaf // without the ErrBadConn that closed the connection, for a clean log line
	}
	return err
}

// ProbeWithin is how long a listener waits for its own probe before it calls itself deaf.
const ProbeWithin = 5 * time.Second

// errDeaf is the error of a listener that did not hear its own probe.
var errDeaf = fmt.Errorf("outbox: the PostgreSQL wake-up listener did not hear its own NOTIFY: its LISTEN "+
	"went through a transaction-pooling proxy (PgBouncer pool_mode=transaction, say), which gives the listening "+
	"server connection to other clients, so signals from other processes never reach it; publishers find their "+
	"rows by polling. Give the listener a connection past the pooler (outbox.Options.ListenDB, a pool straight "+
	"to the database server) or connect in session pooling mode, or set outbox.Options.DisableNotify: %w",
	errors.ErrUnsupported)

// probe proves that the listener hears what other connections signal: it sends a NOTIFY
// on channel from another connection of db and waits, ProbeWithin at most, for it to come
// back through wait, passing on to heard what else arrives meanwhile. A probe from the
// listening connection itself would prove nothing behind a transaction-pooling proxy:
// PostgreSQL answers a session's own NOTIFY inline, on whichever server connection the
// proxy lent it. The probe's payload has no ':', so no listener takes it for a namespace.
// When db has no second connection (a pool of one) or lends none within ProbeWithin, the
// listener is taken as it is.
func probe(ctx context.Context, db *sql.DB, channel string, wait func(ctx context.Context) (string, error), heard func(string)) error {
	if db.Stats().MaxOpenConnections == 1 {
		return nil
	}
	token := make([]byte, 8)
	_, _ = rand.Read(token)
	payload := "outbox listener probe " + hex.EncodeToString(token)
	pctx, cancel := context.WithTimeout(ctx, ProbeWithin)
	defer cancel()
	conn, err := db.Conn(pctx)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return nil // the pool is busy: no proof either way
	}
	// Without arguments pgx sends the statement unprepared, which any pooler accepts.
	_, err = conn.ExecContext(pctx, `NOTIFY `+channel+`, '`+payload+`'`)
	// The probe's connection is closed, not given back: it may have heard the probe itself
	// behind a proxy, and a pool the listener leaves must hold no connection of its making.
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("outbox: listener probe: %w", err)
	}
	for {
		p, err := wait(pctx)
		switch {
		case err == nil && p == payload:
			return nil
		case err == nil:
			heard(p)
		case ctx.Err() != nil:
			return ctx.Err()
		case pctx.Err() != nil:
			return errDeaf
		default:
			return err
		}
	}
}

// execRaw runs a statement without arguments on a driver connection.
func execRaw(ctx context.Context, dc any, query string) error {
	ex, ok := dc.(driver.ExecerContext)
	if !ok {
		return fmt.Errorf("driver connection %T cannot execute statements: %w", dc, errors.ErrUnsupported)
	}
	_, err := ex.ExecContext(ctx, query, nil)
	return err
}

// pgxWaiter returns a function that waits for the next notification on dc, a connection of
// pgx's database/sql driver, and returns its payload, and a function that closes the pgx
// connection. pgx's stdlib connection has Conn() *pgx.Conn, whose
// WaitForNotification(ctx) returns (*pgconn.Notification, error) and Close(ctx) error;
// reaching them by name keeps the pgx packages out of this package's imports (and out of
// the builds of users on other databases).
//
// A driver that wraps pgx's (for instrumentation, say) is looked through when its
// connections have an Unwrap() driver.Conn method.
func pgxWaiter(dc any) (wait func(ctx context.Context) (string, error), closeConn func(), err error) {
	unsupported := fmt.Errorf("outbox: the %T driver cannot wait for PostgreSQL notifications (pgx's stdlib can): %w", dc, errors.ErrUnsupported)
	for {
		u, ok := dc.(interface{ Unwrap() driver.Conn })
		if !ok {
			break
		}
		dc = u.Unwrap()
	}
	connFn := reflect.ValueOf(dc).MethodByName("Conn")
	if !connFn.IsValid() || connFn.Type().NumIn() != 0 || connFn.Type().NumOut() != 1 {
		return nil, nil, unsupported
	}
	pgxConn := connFn.Call(nil)[0]
	waitFn := pgxConn.MethodByName("WaitForNotification")
	closeFn := pgxConn.MethodByName("Close")
	ctxType := reflect.TypeFor[context.Context]()
	errType := reflect.TypeFor[error]()
	if !waitFn.IsValid() || waitFn.Type().NumIn() != 1 || waitFn.Type().In(0) != ctxType ||
		waitFn.Type().NumOut() != 2 || waitFn.Type().Out(1) != errType {
		return nil, nil, unsupported
	}
	if !closeFn.IsValid() || closeFn.Type().NumIn() != 1 || closeFn.Type().In(0) != ctxType {
		return nil, nil, unsupported
	}
	wait = func(ctx context.Context) (string, error) {
		out := waitFn.Call([]reflect.Value{reflect.ValueOf(&ctx).Elem()})
		if err, _ := out[1].Interface().(error); err != nil {
			return "", err
		}
		n := reflect.Indirect(out[0])
		if n.Kind() != reflect.Struct {
			return "", nil
		}
		if p := n.FieldByName("Payload"); p.IsValid() && p.Kind() == reflect.String {
			return p.String(), nil
		}
		return "", nil
	}
	closeConn = func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		closeFn.Call([]reflect.Value{reflect.ValueOf(&ctx).Elem()})
	}
	return wait, closeConn, nil
}
