package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/gooseset"
	"github.com/outboxgo/outbox/internal/testdb"
	"github.com/outboxgo/outbox/migrations"
)

var backends = map[string]struct {
	dialect outbox.Dialect
	goose   goose.Dialect
}{
	"postgres": {outbox.Postgres(), goose.DialectPostgres},
	"mysql":    {outbox.MySQL(), goose.DialectMySQL},
	"sqlite":   {outbox.SQLite(), goose.DialectSQLite3},
}

func TestUnknownDialectListsTheKnownOnes(t *testing.T) {
	t.Parallel()
	db := testdb.SQLite(t)
	err := migrations.Up(context.Background(), db, "pg", migrations.Options{})
	require.ErrorIs(t, err, errors.ErrUnsupported)
	require.Contains(t, err.Error(), `"pg" (use one of mysql, postgres, sqlite;`)
	_, err = migrations.Versions("pg", "")
	require.ErrorIs(t, err, errors.ErrUnsupported)
	_, err = migrations.OrderedVersions("pg", "")
	require.ErrorIs(t, err, errors.ErrUnsupported)
	_, err = migrations.NewOrderedProvider(db, "pg", migrations.Options{})
	require.ErrorIs(t, err, errors.ErrUnsupported)
	err = migrations.Up(context.Background(), db, "pg", migrations.Options{Ordered: true})
	require.ErrorIs(t, err, errors.ErrUnsupported)
}

// The names users type for a database (its driver's, its other spellings, in any case)
// migrate as its dialect name does, through every entry point.
func TestDialectAliases(t *testing.T) {
	t.Parallel()
	aliases := map[string][]string{
		"postgres": {"postgresql", "pgx", "PostgreSQL", "pq"},
		"mysql":    {"mariadb", "MySQL"},
		"sqlite":   {"sqlite3", " SQLite "},
	}
	for backend, names := range aliases {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			want, err := migrations.Versions(backend, "")
			require.NoError(t, err)
			for _, name := range names {
				got, err := migrations.Versions(name, "")
				require.NoError(t, err, name)
				require.Equal(t, want, got, name)
				_, err = migrations.OrderedVersions(name, "")
				require.NoError(t, err, name)
			}
			db := testdb.Open(t, backend)
			name := names[0]
			require.NoError(t, migrations.Up(ctx, db, name, migrations.Options{Ordered: true}), name)
			s, err := outbox.New(db, backends[backend].dialect, outbox.Options{})
			require.NoError(t, err)
			require.NoError(t, s.Check(ctx))
			p, err := migrations.NewProvider(db, name, migrations.Options{})
			require.NoError(t, err)
			v, err := p.GetDBVersion(ctx)
			require.NoError(t, err)
			require.Equal(t, want[len(want)-1].ID, v)
			require.NoError(t, migrations.Down(ctx, db, name, migrations.Options{}), name)
			require.ErrorContains(t, s.Check(ctx), "does not exist", "Down with an alias dropped the table")
		})
	}
}

// Migrations of one dialect refuse a pool of another kind, before goose runs anything.
func TestUpRefusesAnotherDatabase(t *testing.T) {
	t.Parallel()
	for backend := range backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.Open(t, backend)
			for other := range backends {
				if other == backend {
					continue
				}
				for _, ordered := range []bool{false, true} {
					err := migrations.Up(ctx, db, other, migrations.Options{Ordered: ordered})
					require.ErrorIs(t, err, outbox.ErrMisconfigured, "%s migrations on %s", other, backend)
					require.Contains(t, err.Error(), "migrate with dialect \""+backend+"\"")
				}
				require.ErrorIs(t, migrations.Down(ctx, db, other, migrations.Options{}), outbox.ErrMisconfigured)
			}
			s, err := outbox.New(db, backends[backend].dialect, outbox.Options{})
			require.NoError(t, err)
			require.ErrorContains(t, s.Check(ctx), "does not exist", "nothing was created")
			for _, vt := range []string{"outbox_events_goose_version", "outbox_events_goose_ordered"} {
				ok, err := gooseset.TableExists(ctx, db, backend, vt)
				require.NoError(t, err)
				require.False(t, ok, "%s was not created", vt)
			}
		})
	}
}

// Versions serve an application's own goose migrations: its version 1 is its own table,
// and its versions 2.. are the outbox's, numbered as it likes. The table passes the Store's
// check afterwards, and down removes it again.
func TestVersionsInOwnGooseMigrations(t *testing.T) {
	t.Parallel()
	for backend, b := range backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.Open(t, backend)
			versions, err := migrations.Versions(backend, "billing_outbox")
			require.NoError(t, err)
			require.NotEmpty(t, versions)
			require.Equal(t, int64(1), versions[0].ID)
			ordered, err := migrations.OrderedVersions(backend, "billing_outbox")
			require.NoError(t, err)
			require.NotEmpty(t, ordered)
			require.Equal(t, int64(1), ordered[0].ID, "the ordered set has its own numbering")
			for _, v := range ordered {
				for _, q := range append(v.Up, v.Down...) {
					require.Contains(t, q, "billing_outbox", "rendered for the table")
					require.NotContains(t, q, "${", "no placeholder left")
				}
			}
			versions = append(versions, ordered...) // the ordered set after the base set

			var goMigrations []*goose.Migration
			for i, v := range versions {
				goMigrations = append(goMigrations, goMigration(int64(10+i), v)) // example_test.go
			}
			own := fstest.MapFS{"00001_users.sql": {Data: []byte("-- +goose Up\nCREATE TABLE users (id INTEGER PRIMARY KEY);\n-- +goose Down\nDROP TABLE users;\n")}}
			p, err := goose.NewProvider(b.goose, db, own, goose.WithGoMigrations(goMigrations...), goose.WithDisableGlobalRegistry(true))
			require.NoError(t, err)
			_, err = p.Up(ctx)
			require.NoError(t, err)

			s, err := outbox.New(db, b.dialect, outbox.Options{Table: "billing_outbox"})
			require.NoError(t, err)
			require.NoError(t, s.Check(ctx))
			_, err = s.EnqueueStandalone(ctx, outbox.Message{Namespace: "n", Topic: "t", PartitionKey: "k", Payload: []byte(`{}`)})
			require.NoError(t, err)
			recs, err := s.Claim(ctx, orderedClaim)
			require.NoError(t, err, "the ordered versions created what ordered claims need")
			require.Len(t, recs, 1)

			_, err = p.DownTo(ctx, 1)
			require.NoError(t, err)
			require.ErrorIs(t, s.Check(ctx), outbox.ErrMisconfigured, "down dropped the outbox table")
		})
	}
}

// orderedClaim is an ordered claim of the namespace "n".
var orderedClaim = outbox.ClaimOptions{Scope: outbox.Scope{Namespace: "n"}, Limit: 10, Lease: time.Minute, MaxAttempts: 5,
	WorkerID: "w", Ordered: true}

// orderObjects returns what of the ordered set exists on table: its indexes and, on MySQL,
// the order_key column.
func orderObjects(t *testing.T, backend string, db *sql.DB, table string) []string {
	t.Helper()
	var q string
	args := []any{table}
	switch backend {
	case "postgres":
		q = `SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND tablename = $1 AND indexname IN ($2, $3)`
		args = append(args, table+"_order_idx", table+"_unkeyed_idx")
	case "mysql":
		q = `SELECT DISTINCT index_name FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = ? AND index_name = ?` +
			` UNION ALL SELECT column_name FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = ? AND column_name = 'order_key'`
		args = append(args, table+"_order_idx", table)
	case "sqlite":
		q = `SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND name IN (?, ?)`
		args = append(args, table+"_order_idx", table+"_unkeyed_idx")
	}
	rows, err := db.Query(q, args...)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var name string
		require.NoError(t, rows.Scan(&name))
		out = append(out, strings.ToLower(name))
	}
	require.NoError(t, rows.Err())
	slices.Sort(out)
	return out
}

// wantOrderObjects is what the ordered set creates on table.
func wantOrderObjects(backend, table string) []string {
	if backend == "mysql" {
		return []string{"order_key", table + "_order_idx"}
	}
	return []string{table + "_order_idx", table + "_unkeyed_idx"}
}

// versionRows returns the versions a goose version table records as applied, or nil when
// the table does not exist.
func versionRows(t *testing.T, backend string, db *sql.DB, vt string) []int64 {
	t.Helper()
	ok, err := gooseset.TableExists(context.Background(), db, backend, vt)
	require.NoError(t, err)
	if !ok {
		return nil
	}
	rows, err := db.Query(`SELECT version_id FROM ` + vt + ` WHERE version_id > 0 ORDER BY version_id`)
	require.NoError(t, err)
	defer rows.Close()
	out := []int64{}
	for rows.Next() {
		var v int64
		require.NoError(t, rows.Scan(&v))
		out = append(out, v)
	}
	require.NoError(t, rows.Err())
	return out
}

// The ordered set is opt in: Up creates the order index only with Ordered, in its own
// version table; Up with Ordered adds it to a table migrated without it; Down rolls it
// back first, and a later Up without Ordered finds neither the index nor a stale version.
func TestOrderedSetUpDown(t *testing.T) {
	t.Parallel()
	for backend, b := range backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.Open(t, backend)
			const table = outbox.DefaultTable
			want := wantOrderObjects(backend, table)
			claimOrdered := func() error {
				s, err := outbox.New(db, b.dialect, outbox.Options{})
				require.NoError(t, err)
				_, err = s.Claim(ctx, orderedClaim)
				return err
			}
			all := baseVersions(t, backend)
			state := func(what string, objects []string, base, ordered []int64) {
				t.Helper()
				require.Equal(t, objects, orderObjects(t, backend, db, table), "%s: order index", what)
				require.Equal(t, base, versionRows(t, backend, db, table+"_goose_version"), "%s: base versions", what)
				require.Equal(t, ordered, versionRows(t, backend, db, table+migrations.OrderedVersionSuffix), "%s: ordered versions", what)
			}

			require.NoError(t, migrations.Up(ctx, db, backend, migrations.Options{}))
			state("up", nil, all, nil)
			err := claimOrdered()
			require.ErrorIs(t, err, outbox.ErrMisconfigured)
			require.ErrorContains(t, err, "outbox migrate up --ordered")
			require.NoError(t, migrations.Down(ctx, db, backend, migrations.Options{}))
			state("down without the ordered set", nil, []int64{}, nil)

			require.NoError(t, migrations.Up(ctx, db, backend, migrations.Options{}))
			require.NoError(t, migrations.Up(ctx, db, backend, migrations.Options{Ordered: true}))
			state("up, then up with Ordered", want, all, []int64{1})
			require.NoError(t, claimOrdered())
			require.NoError(t, migrations.Up(ctx, db, backend, migrations.Options{Ordered: true}), "again: nothing to do")

			require.NoError(t, migrations.Down(ctx, db, backend, migrations.Options{}))
			state("down", nil, []int64{}, []int64{})
			require.NoError(t, migrations.Up(ctx, db, backend, migrations.Options{}))
			state("down, then up without Ordered", nil, all, []int64{})
			require.ErrorIs(t, claimOrdered(), outbox.ErrMisconfigured)

			require.NoError(t, migrations.Up(ctx, db, backend, migrations.Options{Ordered: true}))
			state("up with Ordered", want, all, []int64{1})
			require.NoError(t, claimOrdered())

			// The ordered set's own Provider, as the outbox command uses it.
			p, err := migrations.NewOrderedProvider(db, backend, migrations.Options{})
			require.NoError(t, err)
			_, err = p.DownTo(ctx, 0)
			require.NoError(t, err)
			state("the ordered set rolled back alone", nil, all, []int64{})
		})
	}
}

// A table name of the longest length allowed gets both version tables by default: they are
// longer than a table name may be, and still within PostgreSQL's identifier limit.
func TestLongestTableName(t *testing.T) {
	t.Parallel()
	table := strings.Repeat("t", dialect.MaxTableBytes)
	for backend, b := range backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.Open(t, backend)
			opts := migrations.Options{Table: table, Ordered: true}
			require.NoError(t, migrations.Up(ctx, db, backend, opts))
			require.Equal(t, baseVersions(t, backend), versionRows(t, backend, db, table+"_goose_version"))
			require.Equal(t, []int64{1}, versionRows(t, backend, db, table+"_goose_ordered"))
			require.Equal(t, wantOrderObjects(backend, table), orderObjects(t, backend, db, table))
			s, err := outbox.New(db, b.dialect, outbox.Options{Table: table})
			require.NoError(t, err)
			require.NoError(t, s.Check(ctx))
			_, err = s.Claim(ctx, orderedClaim)
			require.NoError(t, err)
			require.NoError(t, migrations.Down(ctx, db, backend, opts))
			require.ErrorIs(t, s.Check(ctx), outbox.ErrMisconfigured)
		})
	}
}

// baseVersions lists the versions of backend's base set, 1 to the newest (MySQL has one
// more than the others: its dedupe lock stripes).
func baseVersions(t *testing.T, backend string) []int64 {
	t.Helper()
	vs, err := migrations.Versions(backend, "")
	require.NoError(t, err)
	out := make([]int64, len(vs))
	for i := range out {
		out[i] = int64(i + 1)
	}
	return out
}

// The due index reaches a table that already holds rows: migrated to the version before
// it, rows enqueued (some delayed an hour), then migrated up, a claim takes the due rows
// in the order they fell due and leaves the delayed ones.
func TestDueIndexOnExistingTable(t *testing.T) {
	t.Parallel()
	for backend, b := range backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.Open(t, backend)
			versions, err := migrations.Versions(backend, outbox.DefaultTable)
			require.NoError(t, err)
			var goMigrations []*goose.Migration
			for _, v := range versions {
				goMigrations = append(goMigrations, goMigration(v.ID, v)) // example_test.go
			}
			p, err := goose.NewProvider(b.goose, db, nil, goose.WithGoMigrations(goMigrations...), goose.WithDisableGlobalRegistry(true))
			require.NoError(t, err)
			last := versions[len(versions)-1].ID
			_, err = p.UpTo(ctx, last-1)
			require.NoError(t, err)

			s, err := outbox.New(db, b.dialect, outbox.Options{})
			require.NoError(t, err)
			err = s.Check(ctx)
			require.ErrorIs(t, err, outbox.ErrMisconfigured, "the check names the missing due index")
			require.ErrorContains(t, err, outbox.DefaultTable+"_due_idx")
			var due []string
			for i := range 6 {
				m := outbox.Message{Namespace: "n", Topic: "t", Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))}
				if i%2 == 0 {
					m.Delay = time.Hour
				} else {
					due = append(due, string(m.Payload))
				}
				_, err := s.EnqueueStandalone(ctx, m)
				require.NoError(t, err)
			}
			_, err = p.Up(ctx)
			require.NoError(t, err)
			require.NoError(t, s.Check(ctx))
			for _, want := range due {
				recs, err := s.Claim(ctx, outbox.ClaimOptions{Scope: outbox.Scope{Namespace: "n"}, Limit: 1, Lease: time.Minute, MaxAttempts: 5, WorkerID: "w"})
				require.NoError(t, err)
				require.Len(t, recs, 1)
				require.JSONEq(t, want, string(recs[0].Payload))
			}
			recs, err := s.Claim(ctx, outbox.ClaimOptions{Scope: outbox.Scope{Namespace: "n"}, Limit: 10, Lease: time.Minute, MaxAttempts: 5, WorkerID: "w"})
			require.NoError(t, err)
			require.Empty(t, recs, "the delayed rows wait")
			_, err = p.DownTo(ctx, last-1)
			require.NoError(t, err, "down drops the index again")
		})
	}
}
