-- Due-order claim indexes. An unordered claim takes the pending rows that are due in the
-- order they fell due (next_attempt_at, then id) through the due index, whose entries are
-- exactly the pending rows in that order: the claim's range ends at the first row not yet
-- due, so rows delayed for later or waiting for a retry are never read, however many there
-- are. Expired leases are found through the lease index, which holds only the rows in
-- flight, by lease expiry. Enqueue adds one entry (the due index); a claim moves a row from
-- the due index to the lease index, a settle takes it out again.
--
-- The claim index stays: ordered claims, the sweep of exhausted rows and the stats read
-- the live rows in creation order through it.
--
-- On a large existing table, build both first by hand with CREATE INDEX CONCURRENTLY under
-- the same names: IF NOT EXISTS then skips them here.

-- +goose Up
-- +goose ENVSUB ON
CREATE INDEX IF NOT EXISTS "${OUTBOX_TABLE:-outbox_events}_due_idx" ON "${OUTBOX_TABLE:-outbox_events}"
    ((CASE status WHEN 'pending' THEN next_attempt_at WHEN 'processing' THEN locked_until END), id)
    WHERE (CASE status WHEN 'pending' THEN next_attempt_at WHEN 'processing' THEN locked_until END) IS NOT NULL;

-- +goose Down
-- +goose ENVSUB ON
DROP INDEX IF EXISTS "${OUTBOX_TABLE:-outbox_events}_due_idx";
