package outbox_test

import (
	"database/sql"
	"testing"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/conformance"
	"github.com/outboxgo/outbox/internal/testdb"
)

func TestSQLiteConformance(t *testing.T) {
	t.Parallel()
	conformance.Run(t, conformance.Harness{
		Dialect: outbox.SQLite(),
		OpenDB:  func(t testing.TB) *sql.DB { return testdb.SQLite(t) },
	})
}
