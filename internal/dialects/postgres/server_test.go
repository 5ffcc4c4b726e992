package postgres_test

import (
	"context"
	"database/sql"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
)

// TestCheckRecognisesDistributedSQL runs Check on a real PostgreSQL whose version() is
// shadowed, in the test's schema, by one that answers as YugabyteDB or CockroachDB would:
// Check reads what the server reports and refuses as the recognition says, and a real
// PostgreSQL passes.
func TestCheckRecognisesDistributedSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Open(t, "postgres")
	require.NoError(t, migrations.Up(ctx, db, "postgres", migrations.Options{}))
	var schema string
	require.NoError(t, db.QueryRow(`SELECT current_schema()`).Scan(&schema))

	// A pool that finds the schema's functions before pg_catalog's.
	u, err := url.Parse(testdb.DSN(t, "postgres", db))
	require.NoError(t, err)
	q := u.Query()
	q.Set("search_path", schema+",pg_catalog")
	u.RawQuery = q.Encode()
	shadowed, err := sql.Open("pgx", u.String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = shadowed.Close() })
	answer := func(version string) {
		t.Helper()
		_, err := db.Exec(`CREATE OR REPLACE FUNCTION ` + schema + `.version() RETURNS text LANGUAGE sql AS $$ SELECT '` + version + `'::text $$`)
		require.NoError(t, err)
	}
	check := func(opts outbox.Options) error {
		s, err := outbox.New(shadowed, outbox.Postgres(), opts)
		require.NoError(t, err)
		return s.Check(ctx)
	}

	answer("PostgreSQL 16.4 on x86_64-pc-linux-gnu")
	require.NoError(t, check(outbox.Options{}))

	answer("PostgreSQL 11.2-YB-2.18.0.0-b0 on x86_64-pc-linux-gnu")
	err = check(outbox.Options{})
	var ce *outbox.CheckError
	require.ErrorAs(t, err, &ce)
	require.Contains(t, ce.Problem, "YugabyteDB 2.18.0.0")
	require.Contains(t, ce.Fix, "DisableNotify: true")
	require.NoError(t, check(outbox.Options{DisableNotify: true}), "without notifications YugabyteDB passes")
	answer("PostgreSQL 15.12-YB-2025.2.3.0-b1")
	require.NoError(t, check(outbox.Options{}))

	answer("CockroachDB CCL v23.1.11 (aarch64-apple-darwin21.2, built 2023/09/27 02:20:44, go1.19.10)")
	err = check(outbox.Options{DisableNotify: true})
	require.ErrorAs(t, err, &ce)
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.Contains(t, ce.Problem, "CockroachDB v23.1.11")
}
