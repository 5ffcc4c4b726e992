package outbox

// Micro-benchmarks of the in-process hot paths: validation, hashing, ids, header encoding,
// SQL rendering, and each dialect's client-side work for Enqueue, Claim and Complete with
// the database replaced by a driver that answers instantly (benchNullDriver). They isolate
// what the library spends per call on top of the round trip, which cmd/outbox-bench
// measures end to end against raw SQL. Compare runs with benchstat:
//
//	go test -run '^$' -bench . -benchmem -count 6 . > old.txt
//	# change something
//	go test -run '^$' -bench . -benchmem -count 6 . > new.txt
//	benchstat old.txt new.txt

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// benchPayload is a typical 350-byte order event.
var benchPayload = json.RawMessage(`{"order_id":100042,"customer_id":734512,"status":"paid","amount_cents":45990,"currency":"EUR",` +
	`"items":[{"sku":"SKU-00412","qty":2},{"sku":"SKU-09871","qty":1},{"sku":"SKU-55120","qty":4},{"sku":"SKU-77311","qty":1}],` +
	`"shipping":{"method":"express","country":"DE","postcode":"10115"},"note":"leave at the door, ring twice please"}`)

func benchMessage(i int) Message {
	return Message{
		Namespace:    "shop",
		Topic:        "order.paid",
		PartitionKey: fmt.Sprintf("order-%d", i),
		Headers:      Headers{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "content-type": "application/json"},
		Payload:      benchPayload,
	}
}

func BenchmarkValidate(b *testing.B) {
	s := &Store{maxPayload: DefaultMaxPayloadBytes}
	m := benchMessage(1)
	for b.Loop() {
		if err := s.validate(&m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPayloadHash(b *testing.B) {
	for _, size := range []int{len(benchPayload), 512, 4096} {
		p := make([]byte, size)
		copy(p, benchPayload)
		b.Run(fmt.Sprintf("bytes=%d", size), func(b *testing.B) {
			b.SetBytes(int64(size))
			for b.Loop() {
				_ = sha256.Sum256(p)
			}
		})
	}
}

func BenchmarkNewV7(b *testing.B) {
	for b.Loop() {
		if _, err := uuid.NewV7(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkHeadersValue(b *testing.B) {
	h := benchMessage(1).Headers
	for b.Loop() {
		if _, err := h.Value(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRender covers the SQL rendering that can be called apart from execution: the
// shared select list, and the placeholder builder every per-call statement uses (the
// PostgreSQL statements rendered once per table are BenchmarkRenderStatements of package
// internal/dialects/postgres). Claim, Complete and Insert render and
// execute in one function; their client-side total is BenchmarkClaim, BenchmarkComplete and
// BenchmarkEnqueue below.
func BenchmarkRender(b *testing.B) {
	b.Run("select-list", func(b *testing.B) {
		for b.Loop() {
			_ = sqlkit.SelectList(sqlkit.RecordColumns, "t.", nil)
		}
	})
	for _, dollar := range []bool{false, true} {
		b.Run(fmt.Sprintf("placeholders=100x5/dollar=%v", dollar), func(b *testing.B) {
			for b.Loop() {
				a := &dialect.Args{Numbered: dollar}
				var sb strings.Builder
				for range 100 {
					for range 5 {
						sb.WriteString(a.Add(nil))
					}
				}
			}
		})
	}
}

// benchDialects are the built-in dialects.
var benchDialects = []struct {
	name string
	d    Dialect
}{{"postgres", Postgres()}, {"mysql", MySQL()}, {"sqlite", SQLite()}}

// BenchmarkEnqueue is Store.Enqueue and Store.EnqueueBatch without a database: validation,
// ids, hashes, header encoding, SQL rendering and argument binding through database/sql.
func BenchmarkEnqueue(b *testing.B) {
	db := benchNullDB()
	ctx := context.Background()
	for _, bd := range benchDialects {
		s, err := New(db, bd.d, Options{})
		if err != nil {
			b.Fatal(err)
		}
		for _, n := range []int{1, 100} {
			msgs := make([]Message, n)
			for i := range msgs {
				msgs[i] = benchMessage(i)
			}
			b.Run(fmt.Sprintf("%s/batch=%d", bd.name, n), func(b *testing.B) {
				for b.Loop() {
					if _, err := s.EnqueueStandalone(ctx, msgs...); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/row")
			})
		}
	}
}

// BenchmarkRawInsert is the reference for BenchmarkEnqueue/*/batch=1: what a hand-written
// insert of the same row costs the client (an id, a hash, one ExecContext of the bench's
// raw statement).
func BenchmarkRawInsert(b *testing.B) {
	db := benchNullDB()
	ctx := context.Background()
	const q = `INSERT INTO outbox_events (id, namespace, topic, partition_key, payload, payload_hash, status, attempts, next_attempt_at, created_at, updated_at)` +
		` VALUES ($1, $2, $3, $4, $5, $6, 'pending', 0, now(), now(), now())`
	m := benchMessage(1)
	for b.Loop() {
		id, _ := uuid.NewV7()
		sum := sha256.Sum256(m.Payload)
		if _, err := db.ExecContext(ctx, q, id.String(), m.Namespace, m.Topic, m.PartitionKey, string(m.Payload), sum[:]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClaim is Store.Claim against a database that has no eligible row: the client-side
// cost of rendering and sending a claim.
func BenchmarkClaim(b *testing.B) {
	db := benchNullDB()
	ctx := context.Background()
	for _, bd := range benchDialects {
		s, err := New(db, bd.d, Options{})
		if err != nil {
			b.Fatal(err)
		}
		o := ClaimOptions{Scope: Scope{Namespace: "shop"}, Limit: 100, Lease: 30 * time.Second, MaxAttempts: 10, WorkerID: "worker-1"}
		b.Run(bd.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := s.Claim(ctx, o); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkComplete is Store.Ack of one claimed batch (one token, as a Publisher settles
// it) without a database.
func BenchmarkComplete(b *testing.B) {
	db := benchNullDB()
	ctx := context.Background()
	for _, bd := range benchDialects {
		s, err := New(db, bd.d, Options{})
		if err != nil {
			b.Fatal(err)
		}
		for _, n := range []int{100, 500} {
			leases := make([]Lease, n)
			token := uuid.New()
			for i := range leases {
				leases[i] = Lease{ID: uuid.Must(uuid.NewV7()), Token: token}
			}
			b.Run(fmt.Sprintf("%s/n=%d", bd.name, n), func(b *testing.B) {
				for b.Loop() {
					// The null database confirms no row, so every lease reads as lost:
					// the lost-lease bookkeeping is included.
					_ = s.Ack(ctx, leases...)
				}
			})
		}
	}
}

// BenchmarkScanRecords reads 100 claimed rows through database/sql into Records, with the
// column types each driver family returns: "claimed" is what a claim reads back
// (sqlkit.ClaimColumns, then sqlkit.StampClaimed), "record" every column (sqlkit.ScanRecord, as Get reads).
func BenchmarkScanRecords(b *testing.B) {
	db := benchNullDB()
	ctx := context.Background()
	p := dialect.ClaimParams{Lease: 30 * time.Second, WorkerID: "worker-1", Token: uuid.New()}
	for _, read := range []string{"claimed", "record"} {
		for _, flavor := range []string{"native", "micros"} {
			b.Run(fmt.Sprintf("%s/%s/rows=100", read, flavor), func(b *testing.B) {
				q := benchRecordsQuery + read + " " + flavor
				for b.Loop() {
					var (
						recs []Record
						err  error
					)
					if read == "claimed" {
						recs, err = sqlkit.QueryClaimed(ctx, db, p, q)
					} else {
						recs, err = sqlkit.QueryAll(ctx, db, q, nil, sqlkit.ScanRecord)
					}
					if err != nil || len(recs) != 100 {
						b.Fatal(len(recs), err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*100), "ns/row")
			})
		}
	}
}

// benchNullDriver is a database/sql driver that executes nothing: every Exec reports many
// affected rows, every query returns no row, except benchRecordsQuery, which returns 100
// claimed rows in the column order of sqlkit.RecordColumns. It accepts any argument type, as pgx
// does, so each dialect binds exactly what it binds for real.
type benchNullDriver struct{}

const benchRecordsQuery = "BENCH RECORDS "

var (
	benchNullOnce sync.Once
	benchNull     *sql.DB
)

func benchNullDB() *sql.DB {
	benchNullOnce.Do(func() {
		sql.Register("outbox-bench-null", benchNullDriver{})
		db, err := sql.Open("outbox-bench-null", "")
		if err != nil {
			panic(err)
		}
		db.SetMaxIdleConns(4)
		benchNull = db
	})
	return benchNull
}

func (benchNullDriver) Open(string) (driver.Conn, error) { return benchNullConn{}, nil }

type benchNullConn struct{}

func (benchNullConn) Prepare(string) (driver.Stmt, error) {
	return nil, fmt.Errorf("benchNullConn: Prepare is not supported")
}
func (benchNullConn) Close() error              { return nil }
func (benchNullConn) Begin() (driver.Tx, error) { return benchNullTx{}, nil }
func (benchNullConn) BeginTx(context.Context, driver.TxOptions) (driver.Tx, error) {
	return benchNullTx{}, nil
}
func (benchNullConn) CheckNamedValue(*driver.NamedValue) error { return nil }

func (benchNullConn) ExecContext(context.Context, string, []driver.NamedValue) (driver.Result, error) {
	return driver.RowsAffected(1 << 30), nil
}

func (benchNullConn) QueryContext(_ context.Context, query string, _ []driver.NamedValue) (driver.Rows, error) {
	if spec, ok := strings.CutPrefix(query, benchRecordsQuery); ok {
		read, flavor, _ := strings.Cut(spec, " ")
		cols := sqlkit.RecordColumns
		if read == "claimed" {
			cols = sqlkit.ClaimColumns
		}
		rows, ok := benchRecordRows.Load(spec)
		if !ok {
			rows, _ = benchRecordRows.LoadOrStore(spec, newBenchRecordRows(100, cols, flavor))
		}
		return &benchRows{cols: cols, rows: rows.(*benchRows).rows}, nil
	}
	return &benchRows{cols: []string{"id"}}, nil
}

type benchNullTx struct{}

func (benchNullTx) Commit() error   { return nil }
func (benchNullTx) Rollback() error { return nil }

type benchRows struct {
	cols []string
	rows [][]driver.Value
	i    int
}

func (r *benchRows) Columns() []string { return r.cols }
func (r *benchRows) Close() error      { return nil }
func (r *benchRows) Next(dest []driver.Value) error {
	if r.i >= len(r.rows) {
		return io.EOF
	}
	copy(dest, r.rows[r.i])
	r.i++
	return nil
}

// benchRecordRows keeps the rows of each benchRecordsQuery, built once, so that the scan
// benchmarks time the scan and not the making of fake rows.
var benchRecordRows sync.Map // "read flavor" -> *benchRows

// newBenchRecordRows returns n claimed rows with the columns cols. "native" returns what
// pgx gives (uuid as text, times as time.Time); "micros" what SQLite and the MySQL dialect
// give (16-byte ids, times as Unix microseconds).
func newBenchRecordRows(n int, cols []string, flavor string) *benchRows {
	r := &benchRows{cols: cols}
	now := time.Now()
	token := uuid.New()
	sum := sha256.Sum256(benchPayload)
	for i := range n {
		id := uuid.Must(uuid.NewV7())
		var idv, tokv, t0, t1 driver.Value
		if flavor == "native" {
			idv, tokv, t0, t1 = id.String(), token.String(), now, now.Add(30*time.Second)
		} else {
			idv, tokv, t0, t1 = id[:], token[:], now.UnixMicro(), now.Add(30*time.Second).UnixMicro()
		}
		v := map[string]driver.Value{
			"id": idv, "namespace": "shop", "topic": "order.paid", "tenant_id": nil, "dedupe_key": nil,
			"partition_key": fmt.Sprintf("order-%d", i), "headers": []byte(`{"content-type":"application/json"}`),
			"payload": []byte(benchPayload), "payload_hash": sum[:], "status": "processing", "attempts": int64(1),
			"next_attempt_at": t0, "locked_by": "worker-1", "locked_until": t1, "lease_token": tokv,
			"last_error": nil, "created_at": t0, "updated_at": t0, "delivered_at": nil, "replays": int64(0),
		}
		row := make([]driver.Value, len(cols))
		for j, c := range cols {
			row[j] = v[c]
		}
		r.rows = append(r.rows, row)
	}
	return r
}
