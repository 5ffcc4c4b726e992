-- Order index for ordered delivery per partition key (PublisherOptions.Ordered). An ordered
-- claim checks, for each candidate row with a partition key, that it is the first row of its
-- namespace and key that is pending, processing or dead: one descent of this index. It is
-- partial, so rows without a partition key and delivered rows are not in it. When held-back
-- rows fill the start of the claim order, an ordered claim visits the keys through the order
-- index and finds the rows without a key through the unkeyed index, in claim order per
-- namespace. Every row costs one of the two entries at enqueue, whether or not publishers
-- order.
-- On a large existing table, build it first by hand with CREATE INDEX CONCURRENTLY under
-- the same name: IF NOT EXISTS then skips it here.

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
