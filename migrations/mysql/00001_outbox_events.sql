-- Outbox table for MySQL 8.0+ and MariaDB 10.6+. Run as is with the goose command line; set
-- OUTBOX_TABLE in the environment for another table name (lowercase letters, digits, underscores).
--
-- Keys are VARBINARY so that equality is byte for byte, as on the other databases (a _ci
-- collation would make "A" and "a" one dedupe key; PAD SPACE collations ignore trailing blanks).
-- payload is LONGBLOB, not JSON: MySQL 8 re-serialises its JSON type, and the SHA-256
-- integrity check (payload_hash) and byte-exact delivery need the bytes as enqueued.
-- Times are DATETIME(6) in UTC, written only with UTC_TIMESTAMP(6), so the session time
-- zone never matters. The claim index matches the claim's ORDER BY exactly (status, then
-- created_at, id): a locking read then walks it in order instead of sorting and locking the
-- whole pending set. Its last column, locked_until, lets each claim's search for expired
-- leases test the lease in the index (index condition pushdown) instead of reading every row
-- in flight from the table; rows already change their entry when they change status, and
-- only a lease renewal moves one for locked_until alone. Indexes are declared inside CREATE
-- TABLE because MySQL 8 has no CREATE INDEX IF NOT EXISTS.

-- +goose Up
-- +goose ENVSUB ON
CREATE TABLE IF NOT EXISTS `${OUTBOX_TABLE:-outbox_events}` (
    id              BINARY(16)     NOT NULL,
    namespace       VARBINARY(128) NOT NULL,
    topic           VARBINARY(255) NOT NULL,
    tenant_id       BINARY(16)     NULL,
    dedupe_key      VARBINARY(255) NULL,
    partition_key   VARBINARY(255) NULL,
    headers         MEDIUMBLOB     NULL,
    payload         LONGBLOB       NOT NULL,
    payload_hash    BINARY(32)     NOT NULL,
    status          ENUM('pending', 'processing', 'delivered', 'dead') NOT NULL DEFAULT 'pending',
    attempts        INT            NOT NULL DEFAULT 0,
    next_attempt_at DATETIME(6)    NOT NULL,
    locked_by       VARCHAR(128)   NULL,
    locked_until    DATETIME(6)    NULL,
    lease_token     BINARY(16)     NULL,
    last_error      TEXT           NULL,
    created_at      DATETIME(6)    NOT NULL,
    updated_at      DATETIME(6)    NOT NULL,
    delivered_at    DATETIME(6)    NULL,
    PRIMARY KEY (id),
    KEY `${OUTBOX_TABLE:-outbox_events}_claim_idx` (status, created_at, id, locked_until),
    KEY `${OUTBOX_TABLE:-outbox_events}_retention_idx` (status, updated_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One row per dedupe key, reserved in the enqueueing transaction before its event row is
-- written. Uniqueness is this table's primary key rather than a unique index on the outbox
-- table: InnoDB checks a unique secondary index for duplicates with a next-key lock, so
-- producers racing for one key deadlock (error 1213) as soon as the winner inserts another
-- row next to the key, while a duplicate primary key is locked as a record only.
CREATE TABLE IF NOT EXISTS `${OUTBOX_TABLE:-outbox_events}_dedupe` (
    namespace  VARBINARY(128) NOT NULL,
    topic      VARBINARY(255) NOT NULL,
    dedupe_key VARBINARY(255) NOT NULL,
    id         BINARY(16)     NOT NULL,
    PRIMARY KEY (namespace, topic, dedupe_key)
) ENGINE = InnoDB;

-- +goose Down
-- +goose ENVSUB ON
DROP TABLE IF EXISTS `${OUTBOX_TABLE:-outbox_events}_dedupe`;
DROP TABLE IF EXISTS `${OUTBOX_TABLE:-outbox_events}`;
