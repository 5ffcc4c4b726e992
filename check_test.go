package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"log/slog"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/internal/testproxy"
	"github.com/outboxgo/outbox/migrations"
)

// Every built-in dialect passes its check on a migrated database of its own kind, and
// fails with a CheckError naming both sides on another kind.
func TestCheckDialectMatchesServer(t *testing.T) {
	t.Parallel()
	for _, backend := range pubBackends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := pubSetup(t, backend)
			require.NoError(t, e.store.Check(ctx))
			for _, other := range pubBackends {
				if other == backend {
					continue
				}
				s, err := outbox.New(e.db, pubDialect(other), outbox.Options{})
				require.NoError(t, err)
				err = s.Check(ctx)
				var ce *outbox.CheckError
				require.ErrorAs(t, err, &ce, "dialect %s on a %s pool", other, backend)
				require.ErrorIs(t, err, outbox.ErrMisconfigured)
				require.Contains(t, err.Error(), "but the dialect is "+other)
				require.Contains(t, err.Error(), "use outbox."+map[string]string{"postgres": "Postgres()", "mysql": "MySQL()", "sqlite": "SQLite()"}[backend])
			}
		})
	}
}

// Without migrations, Check, Enqueue and Claim all say to migrate; with a table that lacks a
// column, Check names the column.
func TestCheckMissingTable(t *testing.T) {
	t.Parallel()
	for _, backend := range pubBackends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.Open(t, backend)
			s, err := outbox.New(db, pubDialect(backend), outbox.Options{})
			require.NoError(t, err)

			err = s.Check(ctx)
			require.ErrorIs(t, err, outbox.ErrMisconfigured)
			require.Contains(t, err.Error(), `table "outbox_events" does not exist`)
			require.Contains(t, err.Error(), "migrations.Up")
			hint := "`outbox migrate up --dialect " + backend + " --table outbox_events`"
			require.Contains(t, err.Error(), hint)

			_, err = s.EnqueueStandalone(ctx, outbox.Message{Namespace: "n", Topic: "t", Payload: json.RawMessage(`{}`)})
			require.ErrorIs(t, err, outbox.ErrMisconfigured, "enqueue: %v", err)
			require.Contains(t, err.Error(), "migrations.Up")
			require.Contains(t, err.Error(), hint, "the same fix as Check's")
			_, err = s.Claim(ctx, outbox.ClaimOptions{Limit: 1, Lease: time.Second, MaxAttempts: 1, WorkerID: "w"})
			require.ErrorIs(t, err, outbox.ErrMisconfigured, "claim: %v", err)

			// A table of the right name that lacks a column.
			_, err = db.ExecContext(ctx, `CREATE TABLE outbox_events (id INTEGER PRIMARY KEY, namespace TEXT)`)
			require.NoError(t, err)
			err = s.Check(ctx)
			require.ErrorIs(t, err, outbox.ErrMisconfigured)
			require.Contains(t, err.Error(), "lacks column(s) topic, tenant_id")
		})
	}
}

// SQLite without WAL or without a busy timeout fails the check with the DSN to use.
func TestCheckSQLiteSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	open := func(t *testing.T, params string) *outbox.Store {
		db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "x.db")+params)
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{}))
		s, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
		require.NoError(t, err)
		return s
	}
	for name, params := range map[string]string{
		"NoPragmas":     "",
		"NoBusyTimeout": "?_pragma=journal_mode(WAL)",
		"NoWAL":         "?_pragma=busy_timeout(10000)",
	} {
		t.Run(name, func(t *testing.T) {
			err := open(t, params).Check(ctx)
			require.ErrorIs(t, err, outbox.ErrMisconfigured)
			require.Contains(t, err.Error(), "SQLITE_BUSY")
			require.Contains(t, err.Error(), "_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate")
		})
	}
	t.Run("Documented", func(t *testing.T) {
		require.NoError(t, open(t, "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate").Check(ctx))
	})
}

// A dialect without the Checker ability reports ErrUnsupported, and a Publisher runs anyway.
func TestCheckUnsupported(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := pubSetup(t, "sqlite")
	s := e.newStore(t, e.db, struct{ outbox.Dialect }{outbox.SQLite()})
	require.ErrorIs(t, s.Check(ctx), errors.ErrUnsupported)
}

// Publisher.Run returns the check's error at once instead of logging failed claims forever.
func TestPublisherRunFailsFastWhenMisconfigured(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := testdb.SQLite(t) // not migrated
	s, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	require.NoError(t, err)
	p, err := outbox.NewPublisher(s, outbox.PerMessage(func(context.Context, outbox.Delivery) error { return nil }), fastOptions(t, "n"))
	require.NoError(t, err)
	err = p.Run(ctx)
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.NoError(t, ctx.Err(), "Run returned the error; it did not wait for the context")
}

// A database that cannot be reached at start is waited for, not treated as a setup problem:
// the publisher delivers once it comes back.
func TestPublisherWaitsForUnreachableDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := pubSetup(t, "postgres")
	ids := e.enqueue(t, "n", 3)

	u, err := url.Parse(e.dsn)
	require.NoError(t, err)
	proxy := testproxy.New(t, u.Host)
	proxy.Cut()
	u.Host = proxy.Addr()
	q := u.Query()
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	db, err := sql.Open("pgx", u.String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })

	var logs syncBuffer
	opts := fastOptions(t, "n")
	opts.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rec := newRecorder(nil)
	p, err := outbox.NewPublisher(e.newStore(t, db, outbox.Postgres()), rec.transport("p"), opts)
	require.NoError(t, err)
	start(t, p)
	testdb.Poll(t, 20*time.Second, "a warning that the database is unreachable", func() bool {
		return strings.Contains(logs.String(), "database not reachable at start")
	})
	proxy.Restore()
	testdb.Poll(t, 30*time.Second, "delivery after the database came back", func() bool {
		for _, id := range ids {
			if len(rec.seen(id)) == 0 {
				return false
			}
		}
		return true
	})
	_ = ctx
}

// A transport that hangs is cancelled after PublishTimeout; its messages are retried with
// an error matching ErrPublishTimeout, and a warning names the batch. A transport that
// ignores the cancellation is abandoned and its messages are retried all the same.
func TestPublisherPublishTimeout(t *testing.T) {
	t.Parallel()
	for _, ignore := range []bool{false, true} {
		name := map[bool]string{false: "Cancelled", true: "IgnoresCancel"}[ignore]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := pubSetup(t, "sqlite")
			ids := e.enqueue(t, "n", 2)
			var calls atomic.Int32
			release := make(chan struct{})
			t.Cleanup(func() { close(release) })
			tr := outbox.TransportFunc(func(ctx context.Context, batch []outbox.Delivery) []error {
				if calls.Add(1) > 1 {
					return nil // later attempts deliver
				}
				if ignore {
					<-release
				} else {
					<-ctx.Done()
				}
				errs := make([]error, len(batch))
				for i := range errs {
					errs[i] = ctx.Err()
				}
				return errs
			})
			var logs syncBuffer
			opts := fastOptions(t, "n")
			opts.PublishTimeout = 200 * time.Millisecond
			opts.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
			p, err := outbox.NewPublisher(e.store, tr, opts)
			require.NoError(t, err)
			start(t, p)
			e.waitCounts(t, 20*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDelivered] == 2 })
			for _, id := range ids {
				r := e.get(t, id)
				require.Equal(t, 2, r.Attempts)
				require.Contains(t, r.LastError, "publish timed out after 200ms")
			}
			require.Contains(t, logs.String(), "publish timed out")
			if ignore {
				require.Contains(t, logs.String(), "abandoning it")
			}
		})
	}
}

// Failed deliveries show at Warn and dead letters at Error, one line per batch, so a
// failing transport is visible at the default log level without flooding it.
func TestPublisherLogsFailuresAtWarn(t *testing.T) {
	t.Parallel()
	e := pubSetup(t, "sqlite")
	e.enqueue(t, "n", 5)
	var logs syncBuffer
	opts := fastOptions(t, "n")
	opts.Retry = outbox.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond, MaxAttempts: 2}
	opts.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	p, err := outbox.NewPublisher(e.store, outbox.PerMessage(func(context.Context, outbox.Delivery) error {
		return errors.New("broker says no")
	}), opts)
	require.NoError(t, err)
	start(t, p)
	e.waitCounts(t, 20*time.Second, func(m map[outbox.Status]int) bool { return m[outbox.StatusDead] == 5 })
	// The dead-letter line follows the settle's commit, which the table shows first.
	testdb.Poll(t, 20*time.Second, "the dead-letter line", func() bool { return strings.Contains(logs.String(), "dead-lettered") })
	var warn, errLines int
	for _, l := range strings.Split(logs.String(), "\n") {
		switch {
		case strings.Contains(l, "level=WARN") && strings.Contains(l, "delivery failed; will retry"):
			warn++
			require.Contains(t, l, "err=\"broker says no\"")
			require.Contains(t, l, "count=5", "one line per batch: %s", l)
			require.Contains(t, l, "topic=")
			require.Contains(t, l, "attempt=1")
			require.Contains(t, l, "next_attempt_at=")
		case strings.Contains(l, "level=ERROR") && strings.Contains(l, "dead-lettered"):
			errLines++
			require.Contains(t, l, "count=5")
		}
	}
	require.Equal(t, 1, warn, "logs:\n%s", logs.String())
	require.Equal(t, 1, errLines, "logs:\n%s", logs.String())
}

// An ordered publisher on a table without the order index returns the check's error once,
// in lines short enough to read, each way to fix it on a line of its own; it does not log
// it as well (a caller that prints Run's error would show it twice).
func TestPublisherOrderedCheckErrorOnce(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *pubEnv) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var logs lockedBuffer
		opts := fastOptions(t, "n")
		opts.Ordered = true
		opts.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		p, err := outbox.NewPublisher(e.store, outbox.PerMessage(func(context.Context, outbox.Delivery) error { return nil }), opts)
		require.NoError(t, err)
		err = p.Run(ctx)
		var ce *outbox.CheckError
		require.ErrorAs(t, err, &ce)
		msg := err.Error()
		require.Contains(t, msg, "\n  outbox migrate up --ordered --dialect "+e.backend+" --table outbox_events\n", "a command on a line of its own")
		require.Contains(t, msg, "\n  migrations.Up(ctx, db, \""+e.backend+"\"")
		for line := range strings.SplitSeq(msg, "\n") {
			require.LessOrEqual(t, len(line), 120, "line %q", line)
		}
		require.NotContains(t, logs.String(), "level=ERROR", "returned, not logged as well")
		require.NotContains(t, logs.String(), "ordered migration set")
	})
}

// lockedBuffer is a bytes.Buffer that a logger may write from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
