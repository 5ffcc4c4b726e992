-- One outbox row, written in the service's own transaction (MySQL 8.0+, MariaDB 10.6+),
-- on a utf8mb4 connection. Parameters, in order: id (a new UUIDv7 as text), namespace,
-- topic, tenant_id (a UUID or NULL), dedupe_key (or NULL), partition_key (or NULL), headers
-- (a JSON object of strings, or NULL), payload (the event's JSON text), and the payload
-- again for its hash. With a dedupe key, run dedupe-mysql.sql first.
-- params: id namespace topic tenant_id dedupe_key partition_key headers payload payload
INSERT INTO outbox_events (id, namespace, topic, tenant_id, dedupe_key, partition_key, headers, payload, payload_hash,
    status, attempts, next_attempt_at, created_at, updated_at)
VALUES (UNHEX(REPLACE(?, '-', '')), ?, ?, UNHEX(REPLACE(?, '-', '')), ?, ?, ?, ?, UNHEX(SHA2(?, 256)),
    'pending', 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
