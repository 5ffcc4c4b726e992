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
