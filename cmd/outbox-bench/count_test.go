package main

import "testing"

// The MariaDB write count leaves out only statements that begin with SELECT: the library's
// claims are UPDATE ... RETURNING and WITH ... UPDATE, which write.
func TestIsRead(t *testing.T) {
	for q, want := range map[string]bool{
		"SELECT id FROM t":                   true,
		" \n\tselect 1":                      true,
		"UPDATE t SET x = 1 RETURNING id":    false,
		"WITH c AS (SELECT id) UPDATE t SET": false,
		"INSERT INTO t SELECT 1":             false,
		"SEL":                                false,
		"":                                   false,
	} {
		if got := isRead(q); got != want {
			t.Errorf("isRead(%q) = %v, want %v", q, got, want)
		}
	}
}
