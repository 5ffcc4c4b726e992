package dialect_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox/dialect"
)

func TestArgs(t *testing.T) {
	t.Parallel()
	var q dialect.Args
	require.Equal(t, "?", q.Add("a"))
	require.Equal(t, "(?, ?)", q.List(2, func(i int) any { return i }))
	require.Equal(t, []any{"a", 0, 1}, q.Values)

	n := dialect.Args{Numbered: true}
	require.Equal(t, "$1", n.Add("a"))
	require.Equal(t, "($2, $3, $4)", n.List(3, func(i int) any { return i * 10 }))
	require.Equal(t, "()", n.List(0, nil), "an empty list binds nothing")
	require.Equal(t, []any{"a", 0, 10, 20}, n.Values)
}

func TestScanTime(t *testing.T) {
	t.Parallel()
	want := time.Date(2025, 3, 4, 5, 6, 7, 123456000, time.UTC)
	paris := time.FixedZone("CET", 3600)
	for name, src := range map[string]any{
		"time":              want.In(paris),
		"unix micros":       want.UnixMicro(),
		"unix micros text":  []byte("1741064767123456"),
		"unix micros str":   "1741064767123456",
		"rfc 3339":          want.In(paris).Format(time.RFC3339Nano),
		"sqlite text":       "2025-03-04 05:06:07.123456",
		"text with zone":    []byte("2025-03-04 06:06:07.123456+01:00"),
		"rfc 3339 as bytes": []byte("2025-03-04T05:06:07.123456Z"),
	} {
		var got time.Time
		require.NoError(t, dialect.ScanTime(&got).Scan(src), name)
		require.True(t, want.Equal(got), "%s: %s", name, got)
		require.Equal(t, time.UTC, got.Location(), name)
	}
	got := time.Now()
	require.NoError(t, dialect.ScanTime(&got).Scan(nil))
	require.True(t, got.IsZero(), "NULL is the zero time")
	require.Error(t, dialect.ScanTime(&got).Scan("yesterday"))
	require.Error(t, dialect.ScanTime(&got).Scan(1.5))
}

func TestScanHeaders(t *testing.T) {
	t.Parallel()
	for name, src := range map[string]any{"text": `{"a":"1"}`, "bytes": []byte(`{"a":"1"}`)} {
		var r dialect.Record
		require.NoError(t, dialect.ScanHeaders(&r).Scan(src), name)
		require.Equal(t, dialect.Headers{"a": "1"}, r.Headers, name)
		require.NoError(t, r.HeadersErr, name)
	}
	for _, src := range []any{nil, "", []byte("null")} {
		r := dialect.Record{Headers: dialect.Headers{"old": "x"}}
		require.NoError(t, dialect.ScanHeaders(&r).Scan(src))
		require.Nil(t, r.Headers, "%v is no headers", src)
		require.NoError(t, r.HeadersErr)
	}
	for _, src := range []any{`{"a":`, `["a"]`, `{"a":1}`, 42} {
		r := dialect.Record{Payload: []byte(`{}`)}
		require.NoError(t, dialect.ScanHeaders(&r).Scan(src), "damaged headers never fail the scan")
		require.Nil(t, r.Headers)
		require.Error(t, r.HeadersErr, "%v", src)
		require.ErrorIs(t, r.Integrity(), dialect.ErrIntegrity)
	}
}

func TestLost(t *testing.T) {
	t.Parallel()
	a, b, c := uuid.New(), uuid.New(), uuid.New()
	outcomes := []dialect.Outcome{{Lease: dialect.Lease{ID: a}}, {Lease: dialect.Lease{ID: b}}, {Lease: dialect.Lease{ID: c}}}
	leases := dialect.Leases(outcomes)
	require.Equal(t, []dialect.Lease{{ID: a}, {ID: b}, {ID: c}}, leases)
	require.Nil(t, dialect.Lost(leases, []uuid.UUID{c, a, b}), "all settled, in any order")
	require.Equal(t, []uuid.UUID{a, c}, dialect.Lost(leases, []uuid.UUID{b}), "in want's order")
	require.Equal(t, []uuid.UUID{a, b, c}, dialect.Lost(leases, nil))
}

func TestSortClaimed(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(100, 0)
	lo, hi := uuid.UUID{1}, uuid.UUID{2}
	recs := []dialect.Record{
		{ID: lo, CreatedAt: t0.Add(time.Second)},
		{ID: hi, CreatedAt: t0},
		{ID: lo, CreatedAt: t0},
	}
	dialect.SortClaimed(recs)
	require.Equal(t, []dialect.Record{{ID: lo, CreatedAt: t0}, {ID: hi, CreatedAt: t0}, {ID: lo, CreatedAt: t0.Add(time.Second)}}, recs)
}

func TestNewTable(t *testing.T) {
	t.Parallel()
	tbl, err := dialect.NewTable("outbox_events")
	require.NoError(t, err)
	require.Equal(t, "outbox_events", tbl.Name())
	require.Equal(t, "outbox_events_claim_idx", tbl.Index("claim"))
	for _, bad := range []string{"", "Outbox", "1abc", "a-b", "sqlite_x", string(make([]byte, dialect.MaxTableBytes+1))} {
		_, err := dialect.NewTable(bad)
		require.Error(t, err, "%q", bad)
	}
}

func TestCheckError(t *testing.T) {
	t.Parallel()
	cause := errors.New("no such table")
	err := error(&dialect.CheckError{Problem: "table t is missing", Fix: "run the migrations", Err: cause})
	require.ErrorIs(t, err, dialect.ErrMisconfigured)
	require.ErrorIs(t, err, cause)
	require.Equal(t, "outbox: table t is missing: run the migrations (no such table)", err.Error())
}

// TestQueryIDs runs QueryIDs on a driver that returns ids, then fails when its rows close.
func TestQueryIDs(t *testing.T) {
	t.Parallel()
	a, b := uuid.New(), uuid.New()
	db := sql.OpenDB(idsConnector{ids: []uuid.UUID{a, b}})
	t.Cleanup(func() { _ = db.Close() })
	ids, err := dialect.QueryIDs(context.Background(), db, "RETURNING ids")
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{a, b}, ids)

	_, err = dialect.QueryIDs(context.Background(), db, "RETURNING ids", "fail on close")
	require.ErrorIs(t, err, errCommit, "the error of closing the rows counts")
}

var errCommit = errors.New("commit failed")

// idsConnector is a driver whose every query returns ids; given an argument, its rows fail
// when they close, as SQLite's autocommit write may.
type idsConnector struct{ ids []uuid.UUID }

func (c idsConnector) Connect(context.Context) (driver.Conn, error) { return idsConn(c), nil }
func (c idsConnector) Driver() driver.Driver                        { return nil }

type idsConn idsConnector

func (c idsConn) Prepare(string) (driver.Stmt, error) { return nil, errors.New("not supported") }
func (c idsConn) Close() error                        { return nil }
func (c idsConn) Begin() (driver.Tx, error)           { return nil, errors.New("not supported") }
func (c idsConn) QueryContext(_ context.Context, _ string, args []driver.NamedValue) (driver.Rows, error) {
	return &idsRows{ids: c.ids, failClose: len(args) > 0}, nil
}

type idsRows struct {
	ids       []uuid.UUID
	failClose bool
}

func (r *idsRows) Columns() []string { return []string{"id"} }
func (r *idsRows) Close() error {
	if r.failClose {
		return errCommit
	}
	return nil
}
func (r *idsRows) Next(dest []driver.Value) error {
	if len(r.ids) == 0 {
		return io.EOF
	}
	dest[0] = r.ids[0].String()
	r.ids = r.ids[1:]
	return nil
}

func TestClaimParamsUnsupported(t *testing.T) {
	t.Parallel()
	base := dialect.ClaimParams{Scope: dialect.Scope{Namespace: "orders", Topics: []string{"a"}, TenantID: uuid.New()},
		Limit: 10, Lease: time.Minute, MaxAttempts: 5, WorkerID: "w", Token: uuid.New()}
	require.NoError(t, base.Unsupported(), "the fields every dialect handles")
	require.NoError(t, dialect.ClaimParams{}.Unsupported())

	ordered := base
	ordered.Ordered = true
	err := ordered.Unsupported()
	require.ErrorIs(t, err, errors.ErrUnsupported, "a dialect without ordered claims")
	require.ErrorContains(t, err, "ClaimParams.Ordered")
	require.NoError(t, ordered.Unsupported("Ordered", "OrderedSkipDead"))
	runs := ordered
	runs.Runs = true
	require.NoError(t, runs.Unsupported("Ordered", "OrderedSkipDead"), "Runs is a request a dialect may ignore")

	ordered.OrderedSkipDead = true
	err = ordered.Unsupported("Ordered")
	require.ErrorIs(t, err, errors.ErrUnsupported)
	require.ErrorContains(t, err, "ClaimParams.OrderedSkipDead")

	err = base.Unsupported("Orderd")
	require.Error(t, err, "a misspelt field")
	require.NotErrorIs(t, err, errors.ErrUnsupported, "the caller's mistake is not the dialect's limit")
	require.ErrorContains(t, err, `"Orderd"`)
}
