-- Order index for ordered delivery per partition key (PublisherOptions.Ordered), on MySQL 8.0+
-- and MariaDB 10.6+. This is the ordered migration set: apply it after the outbox table's own
-- migrations, with a goose version table of its own, only where publishers deliver in order.
-- It is separate because it costs every table that has it, whether or not any publisher
-- orders (see the end of this comment). Apply it later to an existing table the same way
-- (on a large table the ALTER TABLE takes a while); roll it back to opt out again.
--
-- An ordered claim checks, for each candidate row with a partition key, that it is the first
-- row of its namespace and key that is pending, processing or dead: one descent of this index.
-- MySQL and MariaDB have no partial indexes. order_key, a virtual column, stands in for two:
-- it is the partition key while a row with a key is pending, processing or dead, '' (never
-- a partition key) while a row without a key is pending or processing, and NULL otherwise.
-- So a lookup by (namespace, order_key) meets only the rows that hold a key back, and one
-- by (namespace, '') only the live rows without a key, which an ordered claim that visits
-- the keys reads in claim order; neither meets the delivered rows, however many are
-- retained. The column is computed, not stored; the index costs every enqueued row one more
-- entry, and a delivered row's entry (a dead one's too, without a key) moves to NULL.
--
--   goose -dir migrations/ordered/mysql -table outbox_events_goose_ordered mysql "$DSN" up

-- +goose Up
-- +goose ENVSUB ON
ALTER TABLE `${OUTBOX_TABLE:-outbox_events}`
    ADD COLUMN order_key VARBINARY(255)
        AS (CASE WHEN partition_key IS NULL THEN CASE WHEN status IN ('pending', 'processing') THEN '' END
                 WHEN status IN ('pending', 'processing', 'dead') THEN partition_key END) VIRTUAL,
    ADD KEY `${OUTBOX_TABLE:-outbox_events}_order_idx` (namespace, order_key, created_at, id);

-- +goose Down
-- +goose ENVSUB ON
ALTER TABLE `${OUTBOX_TABLE:-outbox_events}` DROP KEY `${OUTBOX_TABLE:-outbox_events}_order_idx`, DROP COLUMN order_key;
