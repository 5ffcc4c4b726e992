-- Adds the replay counter: how often an operator moved a row from dead back to pending.
-- The admin queries need no new index: stats read the claim index (pending and processing)
-- and the retention index (dead), and the dead-letter list and purge walk the retention
-- index on (status, updated_at). Every index would cost each enqueue and each settle.

-- +goose Up
-- +goose ENVSUB ON
ALTER TABLE "${OUTBOX_TABLE:-outbox_events}" ADD COLUMN replays INTEGER NOT NULL DEFAULT 0;

-- +goose Down
-- +goose ENVSUB ON
ALTER TABLE "${OUTBOX_TABLE:-outbox_events}" DROP COLUMN replays;
