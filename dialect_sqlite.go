package outbox

import "github.com/outboxgo/outbox/internal/dialects/sqlite"

// SQLite returns the dialect for SQLite 3.35 or newer, tested with modernc.org/sqlite.
//
// Open the database with WAL, a busy timeout and immediate transactions (with
// modernc.org/sqlite, in the DSN):
//
//	file:app.db?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate
//
// WAL lets readers run beside the writer; busy_timeout makes a writer wait for the lock
// instead of failing with SQLITE_BUSY; _txlock=immediate makes every BEGIN take the write
// lock up front, so a business transaction that reads and then enqueues cannot fail with
// SQLITE_BUSY half way (a deferred transaction that must upgrade its lock is not retried
// by busy_timeout). Without these, concurrent writers get "database is locked" errors;
// [Store.Check] reports a missing WAL mode or busy timeout.
//
// SQLite has one writer at a time: claims take the write lock in turn, and a claim never
// returns a row another claim holds. Leases and schedules use the host's clock, read by
// SQLite inside each statement at a millisecond's resolution. Use one pool per SQLite
// file per process, and one [Store] per pool: the Store keeps the hot statements prepared
// on each connection of its pool.
func SQLite() Dialect { return sqlite.New() }
