package inbox

import (
	"context"
	"database/sql"
	"time"

	"github.com/outboxgo/outbox/dialect"
)

// statements holds the inbox's statements for one database, rendered for one table.
type statements struct {
	// claim inserts (consumer_group, message_id) with processed_at = the database clock and
	// leaves an existing row alone, without an error that would abort the transaction. It
	// affects one row when it inserts and none when the key exists.
	claim string
	// purge deletes at most a batch of rows older than a duration, oldest first. Its
	// arguments are the age in microseconds and the batch size.
	purge string
}

// sqliteNow is SQLite's clock in Unix microseconds at a millisecond's resolution, the clock
// and unit of the outbox's own SQLite statements.
const sqliteNow = `(CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)`

// dialects render the statements of each built-in database for a table.
var dialects = map[string]func(t dialect.Table) statements{
	// PostgreSQL: a claim racing a concurrent one for the same key waits for it at the
	// primary key; DO NOTHING once it commits, insert once it rolls back. statement_timestamp
	// is the time of the claim, not of the transaction's start. The purge locks its batch with
	// SKIP LOCKED, so purges running at once take different batches, and deletes by ctid (a TID
	// scan; matching the batch on the primary key made PostgreSQL scan the whole table).
	"postgres": func(t dialect.Table) statements {
		q := `"` + t.Name() + `"`
		return statements{
			claim: `INSERT INTO ` + q + ` (consumer_group, message_id, processed_at) VALUES ($1, $2, statement_timestamp())` +
				` ON CONFLICT (consumer_group, message_id) DO NOTHING`,
			purge: `DELETE FROM ` + q + ` WHERE ctid = ANY (ARRAY(SELECT ctid FROM ` + q +
				` WHERE processed_at < statement_timestamp() - $1::bigint * interval '1 microsecond'` +
				` ORDER BY processed_at LIMIT $2 FOR UPDATE SKIP LOCKED))`,
		}
	},
	// MySQL and MariaDB: INSERT IGNORE affects one row for a new key and none for a
	// duplicate, whatever the client's clientFoundRows setting. IGNORE would also turn
	// other errors into warnings (a value too long, a NULL); the inputs are validated to
	// fit the columns before any SQL runs, and processed_at is always set.
	"mysql": func(t dialect.Table) statements {
		q := "`" + t.Name() + "`"
		return statements{
			claim: `INSERT IGNORE INTO ` + q + ` (consumer_group, message_id, processed_at) VALUES (?, ?, UTC_TIMESTAMP(6))`,
			purge: `DELETE FROM ` + q + ` WHERE processed_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND` +
				` ORDER BY processed_at LIMIT ?`,
		}
	},
	// SQLite: one writer at a time, so a racing claim waits for the write lock (the busy
	// timeout) and then sees the committed row.
	"sqlite": func(t dialect.Table) statements {
		q := `"` + t.Name() + `"`
		return statements{
			claim: `INSERT INTO ` + q + ` (consumer_group, message_id, processed_at) VALUES (?, ?, ` + sqliteNow + `)` +
				` ON CONFLICT (consumer_group, message_id) DO NOTHING`,
			purge: `DELETE FROM ` + q + ` WHERE rowid IN (SELECT rowid FROM ` + q +
				` WHERE processed_at < ` + sqliteNow + ` - ? ORDER BY processed_at LIMIT ?)`,
		}
	},
}

// claimKey runs the claim on q and reports whether it inserted the key.
func (d statements) claimKey(ctx context.Context, q dialect.DBTX, group, messageID string) (bool, error) {
	res, err := q.ExecContext(ctx, d.claim, group, messageID)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, err
	}
	return n == 1, nil
}

// purgeBatch deletes one batch in one statement on the pool, a short transaction of its
// own, and returns how many rows went.
func (d statements) purgeBatch(ctx context.Context, db *sql.DB, olderThan time.Duration, batch int) (int64, error) {
	res, err := db.ExecContext(ctx, d.purge, olderThan.Microseconds(), batch)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
