package inbox

// PurgeSQL exposes the purge statement to the tests, which EXPLAIN it.
func PurgeSQL(in *Inbox) string { return in.d.purge }
