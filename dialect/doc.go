// Package dialect is the contract between the outbox engine (package
// github.com/outboxgo/outbox) and a database adapter: everything a dialect implements,
// receives and returns, in one place. It imports nothing of the engine, as
// database/sql/driver imports nothing of database/sql and io/fs nothing of os; package
// outbox aliases the few names its users meet (Record, Status, Scope, Outcome, ...), so
// that they never need to import this package.
//
// # What a dialect is
//
// The engine owns validation, ids, hashing, the retry policy and the state machine; a
// [Dialect] owns the SQL and runs it on the [DBTX] or *sql.DB the engine passes it. The
// built-in dialects are outbox.Postgres, outbox.MySQL and outbox.SQLite. A dialect for
// another database implements the seven methods of [Dialect], following the numbered
// checklist in its documentation.
//
// # Optional abilities
//
// Whatever only some databases can do comes as a separate interface that a Dialect value
// may also implement: [Checker], [Notifier], [SettleClaimer], [OrderedClaimer], [Purger],
// [Administrator], [Inspector], [PoolBinder] and [Renderer]. None of them embeds Dialect. The engine
// finds each by a type assertion on the dialect passed to outbox.New; a dialect that lacks
// one makes the matching Store call return an error matching [errors.ErrUnsupported],
// so adding an ability never breaks an existing dialect. Assert the abilities you
// implement at compile time:
//
//	var (
//		_ dialect.Dialect       = (*MyDialect)(nil)
//		_ dialect.SettleClaimer = (*MyDialect)(nil)
//	)
//
// # Proving a dialect
//
// The conformance package (github.com/outboxgo/outbox/conformance) checks every rule of
// the checklists through the engine's public API. Call conformance.Run from a test of your
// dialect's package; it skips the sections of abilities the dialect lacks, saying so. The
// module examples/customdialect is a complete dialect written outside the library, with
// every ability, that passes the whole suite.
//
// # Helpers
//
// A few helpers spare a dialect code every dialect needs whatever its schema: [Args]
// builds placeholders and their arguments in one pass, [ScanTime] and [ScanHeaders] scan
// the columns drivers disagree on or that may be damaged, [QueryIDs] reads the ids an
// UPDATE ... RETURNING returns, [Lost] and [Leases] tell which leases a statement did not
// settle, [SortClaimed] puts claimed rows in claim order, and [RunInsert] with
// [DBTXRunner] runs a [Renderer]'s insert. The built-in dialects use them too.
package dialect
