-- Due-order claim index. An unordered claim takes the pending rows that are due in the
-- order they fell due (next_attempt_at, then id) through this index: an equality on status
-- and a range of next_attempt_at, in exactly the claim's ORDER BY, so a locking read walks
-- it in order and stops at the first row not yet due. Rows delayed for later or waiting
-- for a retry are never read, however many there are; with any other column order each
-- locking read would sort, and lock, the whole pending set.
--
-- The claim index stays: expired leases are found in its processing range (rows in flight
-- only), and ordered claims, the sweep of exhausted rows, the stats and the listener read
-- the live rows in creation order through it. Enqueue adds one entry here. MySQL 8.0 and
-- MariaDB add a secondary index online, without blocking writes.

-- +goose Up
-- +goose ENVSUB ON
ALTER TABLE `${OUTBOX_TABLE:-outbox_events}` ADD KEY `${OUTBOX_TABLE:-outbox_events}_due_idx` (status, next_attempt_at, id);

-- +goose Down
-- +goose ENVSUB ON
ALTER TABLE `${OUTBOX_TABLE:-outbox_events}` DROP KEY `${OUTBOX_TABLE:-outbox_events}_due_idx`;
