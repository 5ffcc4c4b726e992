package outbox

// PreparedStatements reports how many statements s's dialect keeps prepared (stmtCache),
// for tests in package outbox_test.
func PreparedStatements(s *Store) int {
	d, ok := s.dialect.(sqliteDialect)
	if !ok || d.stmts == nil {
		return 0
	}
	d.stmts.mu.Lock()
	defer d.stmts.mu.Unlock()
	return len(d.stmts.m)
}
