-- Inbox table for MySQL 8.0+ and MariaDB 10.6+: one row per message a consumer group has
-- processed. Run as is with the goose command line; set OUTBOX_INBOX_TABLE in the environment
-- for another table name (lowercase letters, digits, underscores).
--
-- Keys are VARBINARY so that equality is byte for byte, as on the other databases. The
-- uniqueness is the PRIMARY KEY, never a secondary unique index: InnoDB checks a unique
-- secondary index with next-key locks, and deliveries racing for one key then deadlock as
-- soon as neighbouring keys are inserted. A delivery claims its key with INSERT IGNORE.
-- processed_at is UTC_TIMESTAMP(6) at the claim, so the session time zone never matters.

-- +goose Up
-- +goose ENVSUB ON
CREATE TABLE IF NOT EXISTS `${OUTBOX_INBOX_TABLE:-outbox_inbox}` (
    consumer_group VARBINARY(128) NOT NULL,
    message_id     VARBINARY(255) NOT NULL,
    processed_at   DATETIME(6)    NOT NULL,
    PRIMARY KEY (consumer_group, message_id),
    KEY `${OUTBOX_INBOX_TABLE:-outbox_inbox}_retention_idx` (processed_at)
) ENGINE = InnoDB;

-- +goose Down
-- +goose ENVSUB ON
DROP TABLE IF EXISTS `${OUTBOX_INBOX_TABLE:-outbox_inbox}`;
