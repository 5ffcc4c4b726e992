-- Inbox table for SQLite 3.35+: one row per message a consumer group has processed. Run as is
-- with the goose command line; set OUTBOX_INBOX_TABLE in the environment for another table
-- name (lowercase letters, digits, underscores).
--
-- The primary key is the deduplication: a delivery claims (consumer_group, message_id) with
-- INSERT ... ON CONFLICT DO NOTHING in the consumer's transaction. processed_at is INTEGER
-- Unix microseconds (UTC) from the host clock, as in the outbox table; read it with
-- datetime(processed_at / 1000000, 'unixepoch').

-- +goose Up
-- +goose ENVSUB ON
CREATE TABLE IF NOT EXISTS "${OUTBOX_INBOX_TABLE:-outbox_inbox}" (
    consumer_group TEXT    NOT NULL,
    message_id     TEXT    NOT NULL,
    processed_at   INTEGER NOT NULL,
    PRIMARY KEY (consumer_group, message_id)
);

CREATE INDEX IF NOT EXISTS "${OUTBOX_INBOX_TABLE:-outbox_inbox}_retention_idx" ON "${OUTBOX_INBOX_TABLE:-outbox_inbox}" (processed_at);

-- +goose Down
-- +goose ENVSUB ON
DROP TABLE IF EXISTS "${OUTBOX_INBOX_TABLE:-outbox_inbox}";
