package migrations_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/pressly/goose/v3"
	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/outboxgo/outbox/migrations"
)

// goMigration runs the statements of one outbox migration as one goose Go migration of
// your own numbering.
func goMigration(id int64, v migrations.Version) *goose.Migration {
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
	return goose.NewGoMigration(id, run(v.Up), run(v.Down))
}

// openExample opens a SQLite database in a temporary directory.
func openExample() (db *sql.DB, cleanup func()) {
	dir, err := os.MkdirTemp("", "outbox-example")
	if err != nil {
		log.Fatal(err)
	}
	db, err = sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	return db, func() { _ = db.Close(); _ = os.RemoveAll(dir) }
}

// The outbox table from an application's own goose migrations: its versions 1 to 99 are its
// own, and 100 onwards run the outbox's migrations, one Go migration each.
func ExampleVersions() {
	ctx := context.Background()
	db, cleanup := openExample()
	defer cleanup()

	outboxVersions, err := migrations.Versions("sqlite", "billing_outbox")
	if err != nil {
		log.Fatal(err)
	}
	var own []*goose.Migration
	for i, v := range outboxVersions {
		own = append(own, goMigration(100+int64(i), v))
	}
	p, err := goose.NewProvider(goose.DialectSQLite3, db, nil, goose.WithGoMigrations(own...), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		log.Fatal(err)
	}
	res, err := p.Up(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for i, r := range res {
		fmt.Printf("version %d: outbox migration %d\n", r.Source.Version, outboxVersions[i].ID)
	}
	// Output:
	// version 100: outbox migration 1
	// version 101: outbox migration 2
	// version 102: outbox migration 3
}

// For ordered publishers (outbox.PublisherOptions.Ordered), the ordered set's migrations
// follow the base set's in the application's own numbering.
func ExampleOrderedVersions() {
	ctx := context.Background()
	db, cleanup := openExample()
	defer cleanup()

	base, err := migrations.Versions("sqlite", "billing_outbox")
	if err != nil {
		log.Fatal(err)
	}
	ordered, err := migrations.OrderedVersions("sqlite", "billing_outbox")
	if err != nil {
		log.Fatal(err)
	}
	var own []*goose.Migration
	for i, v := range base {
		own = append(own, goMigration(100+int64(i), v))
	}
	for i, v := range ordered {
		own = append(own, goMigration(200+int64(i), v))
	}
	p, err := goose.NewProvider(goose.DialectSQLite3, db, nil, goose.WithGoMigrations(own...), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		log.Fatal(err)
	}
	res, err := p.Up(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range res {
		if r.Source.Version < 200 {
			fmt.Printf("version %d: outbox migration %d\n", r.Source.Version, base[r.Source.Version-100].ID)
		} else {
			fmt.Printf("version %d: outbox ordered migration %d\n", r.Source.Version, ordered[r.Source.Version-200].ID)
		}
	}
	// Output:
	// version 100: outbox migration 1
	// version 101: outbox migration 2
	// version 102: outbox migration 3
	// version 200: outbox ordered migration 1
}
