-- Optional, in the same transaction: wakes the relay at commit instead of at its next poll.
-- $1 namespace.
-- params: namespace
SELECT pg_notify('outbox_events', current_schema() || ':' || $1)
