package pgxv5_test

import (
	"context"
	"log"
	"net/url"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxgo/outbox/outboxtest/testdb"
)

// exampleDSN creates a schema of its own on the test server and returns a DSN whose
// search_path is that schema, and a function that drops it.
func exampleDSN() (dsn string, drop func()) {
	ctx := context.Background()
	schema := "outbox_example_" + uuid.NewString()[:8]
	conn, err := pgx.Connect(ctx, testdb.PostgresDSN())
	if err != nil {
		log.Fatalf("PostgreSQL at %s: %v", testdb.PostgresDSN(), err)
	}
	if _, err := conn.Exec(ctx, `CREATE SCHEMA `+schema); err != nil {
		log.Fatal(err)
	}
	u, err := url.Parse(testdb.PostgresDSN())
	if err != nil {
		log.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), func() {
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DROP SCHEMA `+schema+` CASCADE`); err != nil {
			log.Fatal(err)
		}
	}
}
