package outbox

import "github.com/outboxgo/outbox/dialect"

// Dialect adapts the outbox to one database: [New] takes one. The engine ([Store],
// [Publisher]) owns validation, ids, hashing, the retry policy and the state machine; a
// Dialect owns the SQL. Built in: [Postgres], [MySQL], [SQLite].
//
// To write one for another database, see package [dialect], which holds the whole
// contract (this type is [dialect.Dialect]): the checklist, the optional abilities, and
// how to prove a dialect with the conformance suite.
type Dialect = dialect.Dialect
