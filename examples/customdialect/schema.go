package customdialect

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/outboxgo/outbox/dialect"
)

// The schema is this dialect's own, not the built-in PostgreSQL one: state is a smallint
// (see the state* constants), headers are jsonb, the payload is bytea (kept byte for byte,
// so that its SHA-256 still matches), and the columns have names of their own. The meaning
// of each column is the one dialect.Record gives its field:
//
//	id uuid            Record.ID            state smallint       Record.Status
//	namespace text     Record.Namespace     attempts integer     Record.Attempts
//	topic text         Record.Topic         due_at timestamptz   Record.NextAttemptAt
//	tenant uuid        Record.TenantID      owner text           Record.LockedBy
//	dedupe_key text    Record.DedupeKey     lease_until tstz     Record.LockedUntil
//	partition_key text Record.PartitionKey  lease_token uuid     Record.LeaseToken
//	headers jsonb      Record.Headers       error text           Record.LastError
//	body bytea         Record.Payload       created_at tstz      Record.CreatedAt
//	body_sha256 bytea  Record.PayloadHash   updated_at tstz      Record.UpdatedAt
//	replays integer    Record.Replays       delivered_at tstz    Record.DeliveredAt
const (
	statePending    = 0
	stateProcessing = 1
	stateDelivered  = 2
	stateDead       = 3
)

// columns is every column Check requires.
var columns = []string{
	"id", "namespace", "topic", "tenant", "dedupe_key", "partition_key", "headers", "body",
	"body_sha256", "state", "attempts", "due_at", "owner", "lease_until", "lease_token", "error",
	"created_at", "updated_at", "delivered_at", "replays",
}

// baseDDL creates the table and the indexes every operation needs: the claim order over
// live rows only, the dedupe key (rows without one coexist), and settled rows by state and
// time for the admin reads and retention. Each statement is idempotent.
func baseDDL(t string) []string {
	q := quote(t)
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + q + ` (
			id            uuid        PRIMARY KEY,
			namespace     text        NOT NULL,
			topic         text        NOT NULL,
			tenant        uuid,
			dedupe_key    text,
			partition_key text,
			headers       jsonb,
			body          bytea       NOT NULL,
			body_sha256   bytea       NOT NULL,
			state         smallint    NOT NULL DEFAULT 0 CHECK (state BETWEEN 0 AND 3),
			attempts      integer     NOT NULL DEFAULT 0,
			due_at        timestamptz NOT NULL,
			owner         text,
			lease_until   timestamptz,
			lease_token   uuid,
			error         text,
			created_at    timestamptz NOT NULL,
			updated_at    timestamptz NOT NULL,
			delivered_at  timestamptz,
			replays       integer     NOT NULL DEFAULT 0
		)`,
		`CREATE INDEX IF NOT EXISTS ` + quote(t+"_live") + ` ON ` + q + ` (created_at, id) WHERE state IN (0, 1)`,
		`CREATE UNIQUE INDEX IF NOT EXISTS ` + quote(t+"_dedupe") + ` ON ` + q + ` (namespace, topic, dedupe_key) WHERE dedupe_key IS NOT NULL`,
		`CREATE INDEX IF NOT EXISTS ` + quote(t+"_settled") + ` ON ` + q + ` (state, updated_at) WHERE state IN (2, 3)`,
	}
}

// orderIndex names the index that ordered claims need.
func orderIndex(t string) string { return t + "_heads" }

// orderedDDL adds what ordered claims need: the rows of each key that can hold it back
// (pending, processing, dead), in claim order.
func orderedDDL(t string) []string {
	return []string{
		`CREATE INDEX IF NOT EXISTS ` + quote(orderIndex(t)) + ` ON ` + quote(t) +
			` (namespace, partition_key, created_at, id) WHERE partition_key IS NOT NULL AND state IN (0, 1, 3)`,
	}
}

// Up creates the outbox table named table with everything but what ordered claims need.
// It is idempotent.
func Up(ctx context.Context, db *sql.DB, table string) error {
	return runDDL(ctx, db, table, baseDDL)
}

// UpOrdered adds the index that ordered claims need to a table made by Up. It is
// idempotent; [Dialect.CheckOrdered] refuses ordered claims until it ran.
func UpOrdered(ctx context.Context, db *sql.DB, table string) error {
	return runDDL(ctx, db, table, orderedDDL)
}

// Down drops the table, and its indexes with it.
func Down(ctx context.Context, db *sql.DB, table string) error {
	return runDDL(ctx, db, table, func(t string) []string { return []string{`DROP TABLE IF EXISTS ` + quote(t)} })
}

func runDDL(ctx context.Context, db *sql.DB, table string, ddl func(string) []string) error {
	t, err := dialect.NewTable(table)
	if err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	for _, s := range ddl(t.Name()) {
		if _, err := tx.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("customdialect: migrate %s: %w", t.Name(), err)
		}
	}
	return tx.Commit()
}

func quote(name string) string { return `"` + name + `"` }
