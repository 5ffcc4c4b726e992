-- Order index for ordered delivery per partition key (PublisherOptions.Ordered). An ordered
-- claim checks, for each candidate row with a partition key, that it is the first row of its
-- namespace and key that is pending, processing or dead: one descent of this index.
--
-- MySQL and MariaDB have no partial indexes. order_key, a virtual column, stands in for one:
-- it is the partition key while the row is pending, processing or dead and NULL otherwise,
-- so a lookup by (namespace, order_key) meets only the rows that hold a key back, never the
-- delivered ones however many are retained. The column is computed, not stored; the index
-- costs every enqueued row one more entry (rows without a key too, under a NULL key), and
-- an ack of a row with a key moves its entry to NULL.

-- +goose Up
-- +goose ENVSUB ON
ALTER TABLE `${OUTBOX_TABLE:-outbox_events}`
    ADD COLUMN order_key VARBINARY(255)
        AS (CASE WHEN status IN ('pending', 'processing', 'dead') THEN partition_key END) VIRTUAL,
    ADD KEY `${OUTBOX_TABLE:-outbox_events}_order_idx` (namespace, order_key, created_at, id);

-- +goose Down
-- +goose ENVSUB ON
ALTER TABLE `${OUTBOX_TABLE:-outbox_events}` DROP KEY `${OUTBOX_TABLE:-outbox_events}_order_idx`, DROP COLUMN order_key;
