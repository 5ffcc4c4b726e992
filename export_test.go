package outbox

import "database/sql"

// MakeRelayGreedy breaks r's fairness on purpose (a store keeps its slot for its next claim
// while others wait), so that a test can show the fairness test catches it.
func MakeRelayGreedy(r *Relay) { r.sched.greedy = true }

// ListenerConns is the number of db's connections that the library's wake-up listeners
// hold.
func ListenerConns(db *sql.DB) int { return heldConns(db) }

// ContinueTurns is continueTurns, for tests that count a loop's claims.
const ContinueTurns = continueTurns
