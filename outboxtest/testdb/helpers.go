package testdb

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/outboxgo/outbox/migrations"
)

// Migrated is [Open] with the outbox table of package migrations created (migrations.Up
// with opts, the default table when none is given): the database a test's Store starts
// on.
func Migrated(t testing.TB, backend string, opts ...migrations.Options) *sql.DB {
	t.Helper()
	db := Open(t, backend)
	o := migrations.Options{}
	if len(opts) > 0 {
		o = opts[0]
	}
	if err := migrations.Up(context.Background(), db, backend, o); err != nil {
		t.Fatalf("migrations.Up on %s: %v", backend, err)
	}
	return db
}

// Poll calls cond every 10ms until it holds, failing t (saying it waited for what) once
// within has passed: how a test waits for something that happens in the background,
// instead of sleeping and hoping.
func Poll(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
