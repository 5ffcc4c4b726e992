package customdialect_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"

	"example.com/customdialect"
)

// plain hides every optional ability of the dialect it wraps: what a dialect without
// a Checker gets.
type plain struct{ dialect.Dialect }

// TestFirstUseAndExplain: the engine gives this dialect what it gives the built-in ones,
// through the same abilities. A pool of another database fails the first enqueue with a
// CheckError that says so, leaving the caller's transaction usable; a missing table fails
// with a CheckError that says how to create it. Without the abilities, the same mistakes
// come back as the database's own errors.
func TestFirstUseAndExplain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m := outbox.Message{Namespace: "orders", Topic: "order.created", Payload: []byte(`{"n":1}`)}

	other, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "other.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	other.SetMaxOpenConns(1)
	for _, d := range []struct {
		name     string
		dialect  outbox.Dialect
		explains bool
	}{{"with the abilities", customdialect.New(), true}, {"without them", plain{customdialect.New()}, false}} {
		t.Run(d.name, func(t *testing.T) {
			s, err := outbox.New(other, d.dialect, outbox.Options{})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				tx, err := other.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback() // the pool has one connection: a failed check must not keep it
				_, err = s.Enqueue(ctx, tx, m)
				ce, ok := checkError(err)
				if ok != d.explains {
					t.Fatalf("enqueue %d on SQLite: CheckError %v, want %v: %v", i+1, ok, d.explains, err)
				}
				if ok && ce.Problem != "the database is SQLite "+sqliteVersion(t, tx)+", not PostgreSQL" {
					t.Fatalf("enqueue %d on SQLite: problem %q", i+1, ce.Problem)
				}
				if err := tx.Rollback(); err != nil {
					t.Fatal(err)
				}
			}

			s, err = outbox.New(openSchema(t), d.dialect, outbox.Options{Table: "never_created"})
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.EnqueueStandalone(ctx, m)
			ce, ok := checkError(err)
			if ok != d.explains {
				t.Fatalf("enqueue into a missing table: CheckError %v, want %v: %v", ok, d.explains, err)
			}
			if ok && ce.Fix != `run customdialect.Up(ctx, db, "never_created")` {
				t.Fatalf("missing table: fix %q", ce.Fix)
			}
		})
	}
}

// checkError returns the CheckError in err, if there is one.
func checkError(err error) (*outbox.CheckError, bool) {
	var ce *outbox.CheckError
	ok := errors.As(err, &ce)
	return ce, ok
}

// sqliteVersion reads the version on tx, which the failed enqueue left usable.
func sqliteVersion(t *testing.T, tx *sql.Tx) string {
	t.Helper()
	var v string
	if err := tx.QueryRow(`SELECT sqlite_version()`).Scan(&v); err != nil {
		t.Fatalf("the caller's transaction is no longer usable: %v", err)
	}
	return v
}
