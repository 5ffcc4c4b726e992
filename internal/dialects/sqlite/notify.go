package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// The SQLite listener's pace. Where the system tells when a file changes (Linux's
// inotify), it reads PRAGMA data_version when the database file or its write-ahead log
// was written, every sqliteNotifyEvery for sqliteNotifyHot after each write (a commit's
// last step, the shared-memory index that the pragma reads, follows its write by a little),
// and every sqliteNotifyIdle otherwise, as a backstop. Elsewhere it reads the pragma every
// sqliteNotifyEvery. The pragma reads no page (it is the pager's change counter), but it
// is a statement through database/sql: docs/design.md gives the figures.
const (
	sqliteNotifyEvery = 2 * time.Millisecond
	sqliteNotifyHot   = 50 * time.Millisecond
	sqliteNotifyIdle  = 250 * time.Millisecond
)

// sqliteFileCheckEvery is how often the listener checks that the database file is still
// the one it opened: a file removed or replaced (a restored backup) would leave it
// watching a counter that never changes again.
const sqliteFileCheckEvery = time.Second

// Signal implements [dialect.Notifier]. It does nothing: every process of a SQLite
// database shares its file, and a commit there is what the listeners watch for.
func (Dialect) Signal(context.Context, dialect.DBTX, dialect.Table, string) error { return nil }

// Listen implements [dialect.Notifier] by watching the database file for commits: on a
// connection of its own, it reads PRAGMA data_version, which changes when any other
// connection, in this process or another, commits to the file, when the file or its
// write-ahead log was written (or at a short interval where the system cannot tell). On
// a change it probes the table for rows that became claimable in the last sqlkit.NotifyLookback
// that it has not reported yet (one read of the due index, newest first), and wakes
// their namespaces. Rolled-back and open transactions change nothing it can see; commits
// to other tables of the file change the counter but find no new row of this table.
//
// An in-memory database has no other process: Listen returns an error matching
// [errors.ErrUnsupported] (the Store's own enqueues wake its publishers). When the file
// is removed or replaced, Listen returns an error saying so.
func (Dialect) Listen(ctx context.Context, db *sql.DB, t dialect.Table, ready func(), wake func(namespace string)) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if ctx.Err() != nil {
			sqlkit.CloseConn(conn) // stopped: the connection served a listener, it serves no one else
		} else {
			// Failed (the file was removed or replaced): the connection holds no listener
			// state, and it may be the pool's only way to the data the old file still holds.
			_ = conn.Close()
		}
	}()
	file, err := sqliteMainFile(ctx, conn)
	if err != nil {
		return err
	}
	if file == "" {
		return fmt.Errorf("outbox: an in-memory SQLite database has no other process to hear from: %w", errors.ErrUnsupported)
	}
	opened, err := os.Stat(file)
	if err != nil {
		return fmt.Errorf("outbox: sqlite listener: %w", err)
	}
	version, err := conn.PrepareContext(ctx, `PRAGMA data_version`)
	if err != nil {
		return err
	}
	defer version.Close()
	probe, err := conn.PrepareContext(ctx, sqliteNotifyProbe(t))
	if err != nil {
		return err
	}
	defer probe.Close()

	var last int64
	if err := version.QueryRowContext(ctx).Scan(&last); err != nil {
		return err
	}
	var f sqlkit.Fresh
	probeNew := func(wake func(string)) error {
		rows, err := probe.QueryContext(ctx, sqlkit.NotifyLookback.Microseconds())
		_, err = f.WakeNew(rows, err, wake)
		return err
	}
	if err := probeNew(func(string) {}); err != nil {
		return err // the rows already there: the publisher claims once when ready
	}
	watch, err := watchFiles(file, file+"-wal")
	if err != nil {
		watch = nil // polling at sqliteNotifyEvery
	} else {
		defer watch.close()
	}
	ready()
	var hotUntil, read time.Time // read: when the counter was last read
	checked := time.Now()
	for {
		if watch == nil {
			if !sqlkit.Sleep(ctx, sqliteNotifyEvery) {
				return ctx.Err()
			}
		} else {
			d := sqliteNotifyIdle
			if time.Now().Before(hotUntil) {
				d = sqliteNotifyEvery
			}
			written, err := watch.wait(ctx, d)
			if err != nil {
				return err
			}
			if written {
				hotUntil = time.Now().Add(sqliteNotifyHot)
				// A commit writes the log many times, and a busy file (a publisher draining
				// a backlog, in this process) raises events without pause: the counter is
				// read at most every sqliteNotifyEvery, not on each event. Read on each,
				// a drain of 100,000 rows read it about 5,000 times a second, and its rate
				// fell to 0.65 of the raw loop (0.74 before SQLite listened).
				if rest := sqliteNotifyEvery - time.Since(read); rest > 0 && !sqlkit.Sleep(ctx, rest) {
					return ctx.Err()
				}
			}
		}
		var v int64
		read = time.Now()
		if err := version.QueryRowContext(ctx).Scan(&v); err != nil {
			return err
		}
		if v != last {
			last = v
			if err := probeNew(wake); err != nil {
				return err
			}
		}
		if time.Since(checked) >= sqliteFileCheckEvery {
			checked = time.Now()
			now, err := os.Stat(file)
			if err != nil || !os.SameFile(opened, now) {
				return fmt.Errorf("outbox: sqlite listener: the database file %s was removed or replaced; "+
					"the connections still open on it no longer see other processes' commits", strconv.Quote(file))
			}
		}
	}
}

// sqliteMainFile returns the file of the main database of conn, "" for an in-memory one.
func sqliteMainFile(ctx context.Context, conn *sql.Conn) (string, error) {
	rows, err := conn.QueryContext(ctx, `PRAGMA database_list`)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	for rows.Next() {
		var seq int
		var name, file string
		if err := rows.Scan(&seq, &name, &file); err != nil {
			return "", err
		}
		if name == "main" {
			return file, rows.Err()
		}
	}
	return "", rows.Err()
}

// sqliteNotifyProbe is the listener's probe: the rows that became claimable within the
// lookback (bound in microseconds), newest first: one backward range of the due index,
// which rows scheduled for later never enter before they fall due (a bulk of them enqueued
// just now costs the probe nothing). A row enqueued due at once became due when created.
func sqliteNotifyProbe(t dialect.Table) string {
	return `SELECT id, namespace FROM ` + sqlkit.QuoteIdent(t.Name(), '"') + ` INDEXED BY ` + sqlkit.QuoteIdent(t.Index("due"), '"') + `
	WHERE ` + sqliteDueAt + ` <= ` + sqliteNow + ` AND ` + sqliteDueAt + ` >= ` + sqliteNow + ` - ?
	ORDER BY ` + sqliteDueAt + ` DESC LIMIT ` + strconv.Itoa(sqlkit.NotifyProbeLimit)
}

// IdlePollInterval implements [sqlkit.PollingListener].
func (Dialect) IdlePollInterval() time.Duration {
	if _, err := watchFiles(); errors.Is(err, errors.ErrUnsupported) {
		return sqliteNotifyEvery
	}
	return sqliteNotifyIdle
}
