-- Outbox table for PostgreSQL. Run as is with the goose command line; set OUTBOX_TABLE in the
-- environment for another table name (lowercase letters, digits, underscores).
--
-- payload is json, not jsonb: json keeps the bytes as enqueued, which the SHA-256 integrity
-- check (payload_hash) and byte-exact delivery need; jsonb would reorder keys and drop spaces.
-- The claim index is partial: it holds only pending and processing rows, in claim order, so
-- claims never touch delivered rows however many are retained.

-- +goose Up
-- +goose ENVSUB ON
CREATE TABLE IF NOT EXISTS "${OUTBOX_TABLE:-outbox_events}" (
    id              uuid        PRIMARY KEY,
    namespace       text        NOT NULL,
    topic           text        NOT NULL,
    tenant_id       uuid,
    dedupe_key      text,
    partition_key   text,
    headers         json,
    payload         json        NOT NULL,
    payload_hash    bytea       NOT NULL,
    status          text        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'processing', 'delivered', 'dead')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    locked_by       text,
    locked_until    timestamptz,
    lease_token     uuid,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz
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
