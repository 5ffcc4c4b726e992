package conformance_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/testdb"
)

// Broken notifiers. These wrap the PostgreSQL dialect, whose signal the database pushes,
// and TestBrokenDialectChild runs them on PostgreSQL.

// pgNotifier is the PostgreSQL dialect with its Notifier, which embedding the Dialect
// interface alone would hide; the broken notifiers below each override one method.
type pgNotifier struct{ outbox.Dialect }

func (d pgNotifier) notifier() dialect.Notifier { return d.Dialect.(dialect.Notifier) }

func (d pgNotifier) Signal(ctx context.Context, q dialect.DBTX, t dialect.Table, ns string) error {
	return d.notifier().Signal(ctx, q, t, ns)
}

func (d pgNotifier) Listen(ctx context.Context, db *sql.DB, t dialect.Table, ready func(), wake func(string)) error {
	return d.notifier().Listen(ctx, db, t, ready, wake)
}

var outside struct {
	once sync.Once
	db   *sql.DB
	err  error
}

// eagerSignalDialect notifies at once, on a connection of its own, instead of on the
// enqueue's transaction: listeners are woken before the commit, and by rollbacks.
type eagerSignalDialect struct{ pgNotifier }

func (eagerSignalDialect) Signal(ctx context.Context, q dialect.DBTX, t dialect.Table, ns string) error {
	outside.once.Do(func() { outside.db, outside.err = sql.Open("pgx", testdb.PostgresDSN()) })
	if outside.err != nil {
		return outside.err
	}
	var schema string
	if err := q.QueryRowContext(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return err
	}
	// The built-in dialect's channel and payload, so that its Listen hears it.
	_, err := outside.db.ExecContext(ctx, `SELECT pg_notify($1, $2)`, t.Name(), schema+":"+ns)
	return err
}

// silentDialect never signals: only polling finds other processes' rows.
type silentDialect struct{ pgNotifier }

func (silentDialect) Signal(context.Context, dialect.DBTX, dialect.Table, string) error { return nil }

// neverReadyDialect listens but never says so.
type neverReadyDialect struct{ pgNotifier }

func (d neverReadyDialect) Listen(ctx context.Context, db *sql.DB, t dialect.Table, _ func(), wake func(string)) error {
	return d.notifier().Listen(ctx, db, t, func() {}, wake)
}

// tableBlindDialect listens to the default table whatever table it is given.
type tableBlindDialect struct{ pgNotifier }

func (d tableBlindDialect) Listen(ctx context.Context, db *sql.DB, _ dialect.Table, ready func(), wake func(string)) error {
	def, err := dialect.NewTable(outbox.DefaultTable)
	if err != nil {
		return err
	}
	return d.notifier().Listen(ctx, db, def, ready, wake)
}

// deafDialect's Listen does not stop when its context ends: it holds its connection for
// good, and a publisher's Run never returns.
type deafDialect struct{ pgNotifier }

func (d deafDialect) Listen(ctx context.Context, db *sql.DB, t dialect.Table, ready func(), wake func(string)) error {
	return d.notifier().Listen(context.WithoutCancel(ctx), db, t, ready, wake)
}

// schemaBlindDialect's Listen hears the table's channel in every schema of the database:
// the built-in channel without the built-in's check of the schema in the payload.
type schemaBlindDialect struct{ pgNotifier }

func (schemaBlindDialect) Listen(ctx context.Context, db *sql.DB, t dialect.Table, ready func(), wake func(string)) error {
	return rawListen(ctx, db, t, ready, wake, false, false)
}

// rawListen listens on the table's channel on a connection of db with pgx, as the built-in
// does, and calls wake with the namespace of each signal: of every schema, or with
// ownSchema of the connection's schema only. When WaitForNotification fails it marks the
// connection bad, so that the pool closes it, unless pooled and the context ended.
func rawListen(ctx context.Context, db *sql.DB, t dialect.Table, ready func(), wake func(string), ownSchema, pooled bool) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		c := dc.(*stdlib.Conn).Conn()
		var schema string
		if err := c.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
			return err
		}
		if _, err := c.Exec(ctx, `LISTEN "`+t.Name()+`"`); err != nil {
			return err
		}
		ready()
		for {
			n, err := c.WaitForNotification(ctx)
			if err != nil {
				if pooled && ctx.Err() != nil {
					return nil // no driver.ErrBadConn: the pool keeps the connection
				}
				return errors.Join(driver.ErrBadConn, err)
			}
			if s, ns, _ := strings.Cut(n.Payload, ":"); !ownSchema || s == schema {
				wake(ns)
			}
		}
	})
}

func init() {
	kit = append(kit,
		mutant{name: "silent", db: "postgres", dialect: silentDialect{pgNotifier{outbox.Postgres()}},
			mustFail: []string{"Notifier/CommitWakes", "Notifier/PublisherWokenAcrossPools", "Notifier/PublisherWokenAcrossProcesses"},
			only:     onlyNotify("CommitWakes", "PublisherWokenAcrossPools", "PublisherWokenAcrossProcesses")},
		mutant{name: "eager-signal", db: "postgres", dialect: eagerSignalDialect{pgNotifier{outbox.Postgres()}},
			mustFail: []string{"Notifier/RollbackWakesNobody", "Notifier/BatchWakesAfterCommit"}, only: onlyNotify()},
		mutant{name: "never-ready", db: "postgres", dialect: neverReadyDialect{pgNotifier{outbox.Postgres()}},
			mustFail: []string{"Notifier/CommitWakes", "Notifier/ListenReturnsOnCancel", "Notifier/PublisherWokenAcrossPools"},
			only:     onlyNotify("CommitWakes", "ListenReturnsOnCancel", "PublisherWokenAcrossPools")},
		mutant{name: "table-blind", db: "postgres", dialect: tableBlindDialect{pgNotifier{outbox.Postgres()}},
			mustFail: []string{"Notifier/OtherTableWakesNobody"}, only: onlyNotify()},
		mutant{name: "schema-blind", db: "postgres", dialect: schemaBlindDialect{pgNotifier{outbox.Postgres()}},
			mustFail: []string{"Notifier/OtherDatabaseWakesNobody"}, only: onlyNotify()},
		mutant{name: "pooled-listener", db: "postgres", dialect: pooledListenerDialect{pgNotifier{outbox.Postgres()}},
			mustFail: []string{"Notifier/ListenClosesItsConnection"}, only: onlyNotify("ListenClosesItsConnection", "ListenReturnsOnCancel")},
		mutant{name: "deaf", db: "postgres", dialect: deafDialect{pgNotifier{outbox.Postgres()}},
			mustFail: []string{"Notifier/ListenReturnsOnCancel", "Notifier/PublisherWokenAcrossPools"},
			only:     onlyNotify("ListenReturnsOnCancel", "PublisherWokenAcrossPools")},
	)
}

// pooledListenerDialect's Listen hears the table's channel in its own schema, as the
// built-in does, but when its context ends it gives its connection back to the pool, still
// listening on the channel, instead of closing it.
type pooledListenerDialect struct{ pgNotifier }

func (pooledListenerDialect) Listen(ctx context.Context, db *sql.DB, t dialect.Table, ready func(), wake func(string)) error {
	return rawListen(ctx, db, t, ready, wake, true, true)
}

// onlyNotify limits a broken notifier's child to Enqueue/CommitLeavesExactlyOne, the healthy
// test, and the Notify section: the named tests of it, or all when none is named. A
// listener that is never ready or never stops costs each test a 10s deadline.
func onlyNotify(tests ...string) string {
	if len(tests) == 0 {
		return only("Notifier")
	}
	return only("Notifier", tests...)
}
