package outbox

// PreparedStatements reports how many statements s's dialect keeps prepared (stmtCache),
// for tests in package outbox_test.
func PreparedStatements(s *Store) int {
	d, ok := s.dialect.(sqliteDialect)
	if !ok || d.stmts == nil {
		return 0
	}
	d.stmts.set.mu.Lock()
	defer d.stmts.set.mu.Unlock()
	return len(d.stmts.set.m)
}

// MakeRelayGreedy breaks r's fairness on purpose (a store keeps its slot for its next claim
// while others wait), so that a test can show the fairness test catches it.
func MakeRelayGreedy(r *Relay) { r.sched.greedy = true }
