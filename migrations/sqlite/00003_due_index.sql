-- Due-order claim index. Each live row is keyed by when it can next be claimed: a pending
-- row by next_attempt_at (when it falls due), a row in flight by locked_until (when its
-- lease runs out); delivered and dead rows are not in it. An unordered claim reads one
-- range of it, up to now, in exactly its order (then id): the rows that became claimable
-- first come first, and the read stops at the first row not claimable yet, so rows delayed
-- for later, waiting for a retry or leased are never read, however many there are. Enqueue
-- adds one entry; a claim, a settle and a lease renewal move it.
--
-- The claim index stays: ordered claims, the sweep of exhausted rows and the stats read the
-- live rows in creation order through it.

-- +goose Up
-- +goose ENVSUB ON
CREATE INDEX IF NOT EXISTS "${OUTBOX_TABLE:-outbox_events}_due_idx" ON "${OUTBOX_TABLE:-outbox_events}"
    ((CASE status WHEN 'pending' THEN next_attempt_at WHEN 'processing' THEN locked_until END), id)
    WHERE (CASE status WHEN 'pending' THEN next_attempt_at WHEN 'processing' THEN locked_until END) IS NOT NULL;

-- +goose Down
-- +goose ENVSUB ON
DROP INDEX IF EXISTS "${OUTBOX_TABLE:-outbox_events}_due_idx";
