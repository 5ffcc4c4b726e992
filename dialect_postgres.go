package outbox

import "github.com/outboxgo/outbox/internal/dialects/postgres"

// Postgres returns the dialect for PostgreSQL 12 or newer, tested with the pgx driver
// (github.com/jackc/pgx/v5/stdlib) in every query execution mode, and with lib/pq
// (github.com/lib/pq) v1.11.0 or newer (which converts Go slices to arrays, and itself
// needs PostgreSQL 14 or newer), against which the conformance suite runs too. Wake-ups
// across processes (LISTEN/NOTIFY) need pgx. Create the table with the migrations package.
//
// Claims are one statement with FOR UPDATE SKIP LOCKED, so concurrent publishers pass over
// each other's rows; acks and nacks of a batch are one statement. Every time is the
// server's now(): enqueue inside a long business transaction stamps created_at with that
// transaction's start. Keep autovacuum on for the outbox table (see the README).
func Postgres() Dialect { return postgres.New() }
