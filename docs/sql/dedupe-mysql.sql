-- Reserves a dedupe key before its row, in the same transaction (MySQL and MariaDB keep keys
-- in a table of their own). One affected row: the key is yours, insert the row with the same
-- id; none: the event was enqueued already, insert nothing. Parameters, in order:
-- namespace, topic, dedupe_key, id, and stripe: the 32-bit FNV-1a hash of namespace, NUL,
-- topic, NUL, dedupe_key, NUL, modulo 4096.
-- params: namespace topic dedupe_key id stripe
INSERT INTO outbox_events_dedupe (namespace, topic, dedupe_key, id)
SELECT ?, ?, ?, UNHEX(REPLACE(?, '-', '')) FROM outbox_events_dedupe_lock WHERE stripe = ?
FOR UPDATE ON DUPLICATE KEY UPDATE id = outbox_events_dedupe.id
