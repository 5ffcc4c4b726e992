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
// # The contract
//
// These are every interface of the package, each with a numbered checklist in its
// documentation (a test of the package keeps this list complete). A dialect implements:
//
//   - [Dialect]: required. Insert, claim, settle, extend, bury and read rows.
//   - [Checker]: optional. The setup checks: the table, the server's kind, the caller's
//     transaction at the first enqueue, and a driver's error in the outbox's terms.
//   - [Admin]: optional. Stats, dead letters (list, group, replay, discard), activity,
//     the lookup by dedupe key and purging old rows.
//   - [Notifier]: optional. Wake-ups across processes.
//   - [OrderedClaimer]: optional. Claims in order per partition key, and optionally a
//     key's waiting rows together ([ClaimParams.Runs]).
//   - [SettleClaimer]: optional. A batch's outcomes settled in the transaction that claims
//     the next batch.
//
// and the engine hands it or its callers:
//
//   - [DBTX]: what *sql.DB, *sql.Tx and *sql.Conn have in common, which a dialect runs its
//     statements on.
//   - [Runner]: a transaction database/sql does not manage (a pgx.Tx), for the engine's
//     Store.EnqueueOn.
//
// An optional ability is an interface of its own that a Dialect value may also implement;
// none of them embeds Dialect. The engine finds each by a type assertion on the dialect
// passed to outbox.New; a dialect that lacks one makes the matching Store calls return an
// error matching [errors.ErrUnsupported], so adding an ability never breaks an existing
// dialect, and a method of an ability may return such an error for a case it cannot
// handle, where its checklist allows. Assert the abilities you implement at compile time:
//
//	var (
//		_ dialect.Dialect       = (*MyDialect)(nil)
//		_ dialect.SettleClaimer = (*MyDialect)(nil)
//	)
//
// The built-in dialects have a few more methods that the engine uses only with them (a
// table in a named schema, statements prepared per pool, an enqueue's statements rendered
// for pgx, a listener that polls): they are not part of the contract, and may change in any
// release.
//
// # Proving a dialect
//
// The conformance package (github.com/outboxgo/outbox/conformance) checks every rule of
// the checklists through the engine's public API: the areas of [Dialect], then one section per
// optional ability, named after it (the conformance package's documentation lists them). Call
// conformance.Run from a test of your dialect's package; it skips the section of an ability
// the dialect lacks, saying so. The
// module examples/customdialect is a complete dialect written outside the library, with
// every ability, that passes the whole suite.
//
// # Helpers
//
// A few helpers spare a dialect code every dialect needs whatever its schema: [Args]
// builds placeholders and their arguments in one pass, [ScanTime] and [ScanHeaders] scan
// the columns drivers disagree on or that may be damaged, [QueryIDs] reads the ids an
// UPDATE ... RETURNING returns, [Lost] and [Leases] tell which leases a statement did not
// settle, [SortClaimed] puts claimed rows in claim order, and [ClaimParams.Unsupported]
// refuses a claim parameter the dialect does not know. The built-in dialects use them too.
package dialect
