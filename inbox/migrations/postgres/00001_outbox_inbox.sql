-- Inbox table for PostgreSQL: one row per message a consumer group has processed. Run as is
-- with the goose command line; set OUTBOX_INBOX_TABLE in the environment for another table
-- name (lowercase letters, digits, underscores).
--
-- The primary key is the deduplication: a delivery claims (consumer_group, message_id) with
-- INSERT ... ON CONFLICT DO NOTHING in the consumer's transaction. processed_at is the
-- database clock at the claim; the retention index serves batched purges by age.

-- +goose Up
-- +goose ENVSUB ON
CREATE TABLE IF NOT EXISTS "${OUTBOX_INBOX_TABLE:-outbox_inbox}" (
    consumer_group text        NOT NULL,
    message_id     text        NOT NULL,
    processed_at   timestamptz NOT NULL DEFAULT statement_timestamp(),
    PRIMARY KEY (consumer_group, message_id)
);

CREATE INDEX IF NOT EXISTS "${OUTBOX_INBOX_TABLE:-outbox_inbox}_retention_idx" ON "${OUTBOX_INBOX_TABLE:-outbox_inbox}" (processed_at);

-- +goose Down
-- +goose ENVSUB ON
DROP TABLE IF EXISTS "${OUTBOX_INBOX_TABLE:-outbox_inbox}";
