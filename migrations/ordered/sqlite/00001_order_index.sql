-- Order index for ordered delivery per partition key (PublisherOptions.Ordered), on SQLite.
-- This is the ordered migration set: apply it after the outbox table's own migrations, with a
-- goose version table of its own, only where publishers deliver in order. It is separate
-- because it costs every table that has it, whether or not any publisher orders: each row
-- gets one more index entry at enqueue, and each change of its state writes to the index
-- again (a claim, a retry, leaving it). Apply it later to an existing table the same way;
-- roll it back to opt out again.
--
-- An ordered claim checks, for each candidate row with a partition key, that it is the first
-- row of its namespace and key that is pending, processing or dead: one descent of the order
-- index. It is partial, so rows without a partition key and delivered rows are not in it.
-- When held-back rows fill the start of the claim order, an ordered claim visits the keys
-- through the order index and finds the rows without a key through the unkeyed index, in
-- claim order per namespace. Every live row is in one of the two.
--
--   goose -dir migrations/ordered/sqlite -table outbox_events_goose_ordered sqlite3 app.db up

-- +goose Up
-- +goose ENVSUB ON
CREATE INDEX IF NOT EXISTS "${OUTBOX_TABLE:-outbox_events}_order_idx" ON "${OUTBOX_TABLE:-outbox_events}" (namespace, partition_key, created_at, id)
    WHERE partition_key IS NOT NULL AND status IN ('pending', 'processing', 'dead');

CREATE INDEX IF NOT EXISTS "${OUTBOX_TABLE:-outbox_events}_unkeyed_idx" ON "${OUTBOX_TABLE:-outbox_events}" (namespace, created_at, id)
    WHERE partition_key IS NULL AND status IN ('pending', 'processing');

-- +goose Down
-- +goose ENVSUB ON
DROP INDEX IF EXISTS "${OUTBOX_TABLE:-outbox_events}_unkeyed_idx";
DROP INDEX IF EXISTS "${OUTBOX_TABLE:-outbox_events}_order_idx";
