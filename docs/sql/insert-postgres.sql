-- One outbox row, written in the service's own transaction (PostgreSQL 11 or later).
-- $1 id: a new UUIDv7 as text; $2 namespace; $3 topic; $4 tenant_id: a UUID or NULL;
-- $5 dedupe_key or NULL; $6 partition_key or NULL; $7 headers: a JSON object of strings,
-- or NULL; $8 payload: the event's JSON text. The hash is taken of the same bytes.
-- params: id namespace topic tenant_id dedupe_key partition_key headers payload
INSERT INTO outbox_events (id, namespace, topic, tenant_id, dedupe_key, partition_key, headers, payload, payload_hash)
VALUES ($1, $2, $3, $4, $5, $6, $7::text::json, $8::text::json, sha256(convert_to($8::text, 'UTF8')))
ON CONFLICT (namespace, topic, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
