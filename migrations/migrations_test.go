package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"testing/fstest"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
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
	require.Contains(t, err.Error(), `"pg" (have: mysql, postgres, sqlite)`)
	_, err = migrations.Versions("pg", "")
	require.ErrorIs(t, err, errors.ErrUnsupported)
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
				err := migrations.Up(ctx, db, other, migrations.Options{})
				require.ErrorIs(t, err, outbox.ErrMisconfigured, "%s migrations on %s", other, backend)
				require.Contains(t, err.Error(), "migrate with dialect \""+backend+"\"")
				require.ErrorIs(t, migrations.Down(ctx, db, other, migrations.Options{}), outbox.ErrMisconfigured)
			}
			s, err := outbox.New(db, backends[backend].dialect, outbox.Options{})
			require.NoError(t, err)
			require.ErrorContains(t, s.Check(ctx), "does not exist", "nothing was created")
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

			var goMigrations []*goose.Migration
			for i, v := range versions {
				run := func(stmts []string) *goose.GoFunc {
					return &goose.GoFunc{RunTx: func(ctx context.Context, tx *sql.Tx) error {
						for _, q := range stmts {
							if _, err := tx.ExecContext(ctx, q); err != nil {
								return err
							}
						}
						return nil
					}}
				}
				goMigrations = append(goMigrations, goose.NewGoMigration(int64(10+i), run(v.Up), run(v.Down)))
			}
			own := fstest.MapFS{"00001_users.sql": {Data: []byte("-- +goose Up\nCREATE TABLE users (id INTEGER PRIMARY KEY);\n-- +goose Down\nDROP TABLE users;\n")}}
			p, err := goose.NewProvider(b.goose, db, own, goose.WithGoMigrations(goMigrations...), goose.WithDisableGlobalRegistry(true))
			require.NoError(t, err)
			_, err = p.Up(ctx)
			require.NoError(t, err)

			s, err := outbox.New(db, b.dialect, outbox.Options{Table: "billing_outbox"})
			require.NoError(t, err)
			require.NoError(t, s.Check(ctx))
			_, err = s.EnqueueStandalone(ctx, outbox.Message{Namespace: "n", Topic: "t", Payload: []byte(`{}`)})
			require.NoError(t, err)

			_, err = p.DownTo(ctx, 1)
			require.NoError(t, err)
			require.ErrorIs(t, s.Check(ctx), outbox.ErrMisconfigured, "down dropped the outbox table")
		})
	}
}
