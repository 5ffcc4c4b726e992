package customdialect_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/conformance"

	"example.com/customdialect"
)

// dsn is the PostgreSQL server the tests use; OUTBOX_POSTGRES_DSN overrides it.
func dsn() string {
	if d := os.Getenv("OUTBOX_POSTGRES_DSN"); d != "" {
		return d
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// withSearchPath returns the DSN with schema as its search_path.
func withSearchPath(t testing.TB, schema string) string {
	u, err := url.Parse(dsn())
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// openSchema returns a pool on a fresh schema of its own, dropped at cleanup. A test whose
// server is unreachable fails: nothing here is skipped.
func openSchema(t testing.TB) *sql.DB {
	t.Helper()
	admin, err := sql.Open("pgx", dsn())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "custom_" + hex.EncodeToString(b)
	if _, err := admin.Exec(`CREATE SCHEMA ` + schema); err != nil {
		t.Fatalf("PostgreSQL at %s: %v (start it, or set OUTBOX_POSTGRES_DSN)", dsn(), err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(`DROP SCHEMA ` + schema + ` CASCADE`) })
	db, err := sql.Open("pgx", withSearchPath(t, schema))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func harness() conformance.Harness {
	return conformance.Harness{
		Dialect:   customdialect.New(),
		OpenDB:    openSchema,
		Up:        customdialect.Up,
		UpOrdered: customdialect.UpOrdered,
		Down:      customdialect.Down,
		Count: func(ctx context.Context, db *sql.DB, table string, status outbox.Status) (int, error) {
			q := `SELECT count(*) FROM "` + table + `"`
			var args []any
			if status != "" {
				q += ` WHERE state = $1`
				args = append(args, map[outbox.Status]int{
					outbox.StatusPending: 0, outbox.StatusProcessing: 1, outbox.StatusDelivered: 2, outbox.StatusDead: 3,
				}[status])
			}
			var n int
			err := db.QueryRowContext(ctx, q, args...).Scan(&n)
			return n, err
		},
		Corrupt: func(ctx context.Context, db *sql.DB, table string, id uuid.UUID, column string) error {
			set := map[string]string{
				"headers": `headers = '{"retries":3}'::jsonb`,
				"payload": `body = convert_to('{"n":666}', 'UTF8')`,
			}[column]
			if set == "" {
				return fmt.Errorf("cannot corrupt %q", column)
			}
			_, err := db.ExecContext(ctx, `UPDATE "`+table+`" SET `+set+` WHERE id = $1`, id.String())
			return err
		},
		DropColumn: func(ctx context.Context, db *sql.DB, table string) error {
			_, err := db.ExecContext(ctx, `ALTER TABLE "`+table+`" DROP COLUMN replays`)
			return err
		},
		OtherServer: func(t testing.TB) *sql.DB {
			db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "other.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			return db
		},
		Reopen: func(t testing.TB, db *sql.DB) *sql.DB {
			other, err := sql.Open("pgx", withSearchPath(t, currentSchema(t, db)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { other.Close() })
			return other
		},
		// The test binary registers pgx (the import above), so a producer process run from
		// it opens the schema as this process does.
		DSN: func(t testing.TB, db *sql.DB) (string, string) {
			return "pgx", withSearchPath(t, currentSchema(t, db))
		},
	}
}

// currentSchema returns the schema that db's connections find the table in.
func currentSchema(t testing.TB, db *sql.DB) string {
	var schema string
	if err := db.QueryRow(`SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	return schema
}

func TestConformance(t *testing.T) {
	conformance.Run(t, harness())
}

// TestConformanceCatchesBugs plants bugs in the dialect's SQL, one per child process, and
// requires the conformance suite to fail in the tests that guard against each, within the
// suite's deadlines: the way to check that a dialect's own conformance run would notice
// its likely mistakes. A child is the test binary run again with CUSTOMDIALECT_BUG set,
// which runs this test as the suite on the dialect with that bug.
func TestConformanceCatchesBugs(t *testing.T) {
	if bug := os.Getenv("CUSTOMDIALECT_BUG"); bug != "" {
		if !customdialect.Plant(bug) {
			t.Fatalf("no bug %q", bug)
		}
		conformance.Run(t, harness())
		return
	}
	bugs := []struct {
		name, only string
		mustFail   []string
	}{
		{"now-tie", "^(Enqueue|SettleClaimer)$", []string{"SettleClaimer/RetryClaimedAgainAdvances"}},
		{"no-row-locks", "^(Enqueue|Concurrency|OrderedClaimer)$", []string{"Concurrency/NoDoubleClaim", "OrderedClaimer/Publishers"}},
	}
	const child = "TestConformanceCatchesBugs/"
	for _, b := range bugs {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			cmd := exec.Command(os.Args[0], "-test.run=^TestConformanceCatchesBugs$/"+b.only, "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "CUSTOMDIALECT_BUG="+b.name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed the dialect with the %s bug:\n%s", b.name, out)
			}
			for _, name := range b.mustFail {
				if !strings.Contains(string(out), "--- FAIL: "+child+name+" ") &&
					!strings.Contains(string(out), "conformance: "+name+" (section") {
					t.Errorf("the suite must catch the %s bug in %s:\n%s", b.name, name, out)
				}
			}
			if !strings.Contains(string(out), "--- PASS: "+child+"Enqueue/CommitLeavesExactlyOne") {
				t.Errorf("the healthy test failed too: the harness, not the bug, is at fault:\n%s", out)
			}
			t.Logf("%s caught in %s", b.name, time.Since(start).Round(time.Second))
		})
	}
}
