package mysql

import (
	"context"
	"database/sql"
	"strconv"
	"time"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// The MySQL listener's probe interval: mysqlNotifyFast after a probe that found new rows,
// doubling on each probe that finds none up to mysqlNotifyIdle. An idle listener costs the
// server 1/mysqlNotifyIdle queries a second, each one descent of the due index that
// finds nothing; see docs/design.md for the figures and the other signals measured.
const (
	mysqlNotifyFast = 5 * time.Millisecond
	mysqlNotifyIdle = 20 * time.Millisecond
)

// Signal implements [dialect.Notifier]. It does nothing: MySQL cannot push a signal, and
// the listeners find committed rows themselves.
func (Dialect) Signal(context.Context, dialect.DBTX, dialect.Table, string) error { return nil }

// Listen implements [dialect.Notifier] by asking, on a connection of its own, which
// pending rows fell due in the last sqlkit.NotifyLookback that it has not reported yet (the
// newest, read through the due index), and waking their namespaces. It asks every
// mysqlNotifyFast while rows keep coming and every mysqlNotifyIdle when none do. Each probe
// is an autocommit read, so it sees only committed rows: open and rolled-back transactions
// wake nobody, and it reads only its own table of its own database.
func (Dialect) Listen(ctx context.Context, db *sql.DB, t dialect.Table, ready func(), wake func(namespace string)) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer sqlkit.CloseConn(conn)
	query := mysqlNotifyProbe(t)
	var f sqlkit.Fresh
	probe := func(wake func(string)) (bool, error) {
		rows, err := conn.QueryContext(ctx, query)
		return f.WakeNew(rows, err, wake)
	}
	if _, err := probe(func(string) {}); err != nil {
		return err // the rows already there: the publisher claims once when ready
	}
	ready()
	every := mysqlNotifyFast
	timer := time.NewTimer(every)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
		found, err := probe(wake)
		if err != nil {
			return err
		}
		if found {
			every = mysqlNotifyFast
		} else {
			every = min(2*every, mysqlNotifyIdle)
		}
		timer.Reset(every)
	}
}

// mysqlNotifyProbe is the listener's probe: the pending rows that fell due within
// sqlkit.NotifyLookback, newest first: a backward range of the due index (status,
// next_attempt_at, id), which rows scheduled for later never enter before they fall due (a
// bulk of them enqueued just now costs the probe nothing). A row enqueued due at once fell
// due when it was created.
func mysqlNotifyProbe(t dialect.Table) string {
	return `SELECT id, namespace FROM ` + mysqlTable(t) + ` FORCE INDEX (` + sqlkit.QuoteIdent(t.Index("due"), '`') + `)
	WHERE status = 'pending' AND next_attempt_at >= UTC_TIMESTAMP(6) - INTERVAL ` + strconv.FormatInt(sqlkit.NotifyLookback.Microseconds(), 10) + ` MICROSECOND
	AND next_attempt_at <= UTC_TIMESTAMP(6)
	ORDER BY next_attempt_at DESC LIMIT ` + strconv.Itoa(sqlkit.NotifyProbeLimit)
}

// IdlePollInterval implements [sqlkit.PollingListener].
func (Dialect) IdlePollInterval() time.Duration { return mysqlNotifyIdle }
