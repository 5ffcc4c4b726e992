package customdialect_test

import (
	"database/sql"
	"path/filepath"
	"testing"

	_ "modernc.org/sqlite"

	"github.com/outboxgo/outbox/conformance"

	"example.com/customdialect"
)

func TestConformance(t *testing.T) {
	d := customdialect.New()
	conformance.Run(t, conformance.Harness{
		Dialect: d,
		OpenDB: func(t testing.TB) *sql.DB {
			dsn := "file:" + filepath.Join(t.TempDir(), "x.db") + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate"
			db, err := sql.Open("sqlite", dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			return db
		},
	})
	t.Cleanup(func() {
		if d.Claims.Load() == 0 || d.Completes.Load() == 0 {
			t.Error("the suite did not go through the custom dialect")
		}
	})
}
