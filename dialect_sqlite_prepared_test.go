package outbox_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"modernc.org/sqlite"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
)

// TestSQLiteHotStatementsRunPrepared: once a Store has prepared its hot statements, a claim
// and an ack send none of them to the driver as unprepared text. The driver is wrapped so that every statement database/sql runs
// unprepared (QueryContext, ExecContext on the connection) is recorded; prepared ones go
// through the driver's statements and are not. Counting how many statements are cached
// (TestSQLiteOneConnectionPool) would not notice the cached ones going unused.
func TestSQLiteHotStatementsRunPrepared(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := &unpreparedLog{}
	db := sql.OpenDB(unpreparedConnector{dsn: testdb.SQLiteDSN(filepath.Join(t.TempDir(), "outbox.db")), log: rec})
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, migrations.Up(ctx, db, "sqlite", migrations.Options{}))
	s, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	require.NoError(t, err)

	require.NoError(t, s.Ack(ctx, enqueueAndClaim(ctx, t, s, db, 3)...)) // prepares them
	rec.reset()
	require.NoError(t, s.Ack(ctx, enqueueAndClaim(ctx, t, s, db, 3)...))
	var hot []string
	for _, q := range rec.all() {
		for _, mark := range []string{`SELECT 1 FROM`, `SET status = 'processing'`, `SET status = 'delivered'`} {
			if strings.Contains(q, mark) {
				hot = append(hot, q)
			}
		}
	}
	require.Empty(t, hot, "the probe, the claim and the ack run prepared")
	require.NotEmpty(t, rec.all(), "the wrapper sees unprepared statements (the enqueue's INSERT)")
}

type unpreparedLog struct {
	mu      sync.Mutex
	queries []string
}

func (l *unpreparedLog) add(q string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.queries = append(l.queries, q)
}

func (l *unpreparedLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.queries = nil
}

func (l *unpreparedLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.queries...)
}

type unpreparedConnector struct {
	dsn string
	log *unpreparedLog
}

func (c unpreparedConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := (&sqlite.Driver{}).Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return unpreparedConn{conn.(sqliteDriverConn), c.log}, nil
}

func (unpreparedConnector) Driver() driver.Driver { return &sqlite.Driver{} }

type sqliteDriverConn interface {
	driver.Conn
	driver.ConnPrepareContext
	driver.ConnBeginTx
	driver.QueryerContext
	driver.ExecerContext
}

type unpreparedConn struct {
	sqliteDriverConn
	log *unpreparedLog
}

func (c unpreparedConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	c.log.add(q)
	return c.sqliteDriverConn.QueryContext(ctx, q, args)
}

func (c unpreparedConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	c.log.add(q)
	return c.sqliteDriverConn.ExecContext(ctx, q, args)
}
