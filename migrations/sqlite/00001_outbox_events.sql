-- Outbox table for SQLite 3.35+. Run as is with the goose command line; set OUTBOX_TABLE in
-- the environment for another table name (lowercase letters, digits, underscores).
--
-- Ids are 16-byte BLOBs. Times are INTEGER Unix microseconds (UTC) from the process clock;
-- read them with datetime(created_at / 1000000, 'unixepoch'). The claim index is partial
-- (pending and processing rows only, in claim order) so retained rows never slow claims.

-- +goose Up
-- +goose ENVSUB ON
CREATE TABLE IF NOT EXISTS "${OUTBOX_TABLE:-outbox_events}" (
    id              BLOB    NOT NULL PRIMARY KEY,
    namespace       TEXT    NOT NULL,
    topic           TEXT    NOT NULL,
    tenant_id       BLOB,
    dedupe_key      TEXT,
    partition_key   TEXT,
    headers         TEXT,
    payload         TEXT    NOT NULL,
    payload_hash    BLOB    NOT NULL,
    status          TEXT    NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'processing', 'delivered', 'dead')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    locked_by       TEXT,
    locked_until    INTEGER,
    lease_token     BLOB,
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    delivered_at    INTEGER
);

CREATE INDEX IF NOT EXISTS "${OUTBOX_TABLE:-outbox_events}_claim_idx" ON "${OUTBOX_TABLE:-outbox_events}" (created_at, id)
    WHERE status IN ('pending', 'processing');

CREATE UNIQUE INDEX IF NOT EXISTS "${OUTBOX_TABLE:-outbox_events}_dedupe_idx" ON "${OUTBOX_TABLE:-outbox_events}" (namespace, topic, dedupe_key)
    WHERE dedupe_key IS NOT NULL;

CREATE INDEX IF NOT EXISTS "${OUTBOX_TABLE:-outbox_events}_retention_idx" ON "${OUTBOX_TABLE:-outbox_events}" (status, updated_at)
    WHERE status IN ('delivered', 'dead');

-- +goose Down
-- +goose ENVSUB ON
DROP TABLE IF EXISTS "${OUTBOX_TABLE:-outbox_events}";
