-- One outbox row, written in the service's own transaction (SQLite 3.41 or later, for
-- unhex). Parameters, in order: id (a new UUIDv7 as text), namespace, topic, tenant_id (a
-- UUID or NULL), dedupe_key (or NULL), partition_key (or NULL), headers (a JSON object of
-- strings, or NULL), payload (the event's JSON text) and payload_hash (the 32 bytes of
-- SHA-256 of the payload's UTF-8 bytes: SQLite has no hash function). Times are the
-- database clock in whole milliseconds, as Unix microseconds.
-- params: id namespace topic tenant_id dedupe_key partition_key headers payload payload_hash
INSERT INTO outbox_events (id, namespace, topic, tenant_id, dedupe_key, partition_key, headers, payload, payload_hash,
    status, attempts, next_attempt_at, created_at, updated_at)
VALUES (unhex(replace(?, '-', '')), ?, ?, unhex(replace(?, '-', '')), ?, ?, ?, ?, ?, 'pending', 0,
    CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000,
    CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000,
    CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)
ON CONFLICT (namespace, topic, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
