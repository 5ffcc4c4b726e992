package dialect

import (
	"fmt"
	"strings"
)

// Table is a validated outbox table name. Dialects receive only Tables, so no unchecked
// string can reach their SQL; they quote [Table.Name] once when rendering statements.
type Table struct{ name string }

// MaxTableBytes bounds a table name so that derived index names fit the 63-byte
// identifier limit of PostgreSQL.
const MaxTableBytes = 48

// NewTable validates name: lowercase ASCII letters, digits and underscores, beginning with
// a letter or underscore, 1..[MaxTableBytes] bytes, and not beginning with "sqlite_", a
// prefix SQLite reserves for its own tables. Lowercase only, because MySQL's table name case
// sensitivity depends on the server's file system. A bad name returns an error that says
// why; outbox.New reports it as an outbox.ValidationError of Options.Table.
func NewTable(name string) (Table, error) {
	if name == "" || len(name) > MaxTableBytes {
		return Table{}, fmt.Errorf("name must be 1..%d bytes, got %d", MaxTableBytes, len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c == '_' || (c >= 'a' && c <= 'z') || (i > 0 && c >= '0' && c <= '9')
		if !ok {
			return Table{}, fmt.Errorf("name %q must match [a-z_][a-z0-9_]*", name)
		}
	}
	if strings.HasPrefix(name, "sqlite_") {
		return Table{}, fmt.Errorf("name %q begins with sqlite_, which SQLite reserves for its own tables", name)
	}
	return Table{name: name}, nil
}

// Name returns the unquoted table name.
func (t Table) Name() string { return t.name }

// Index returns the name of an index on the table, such as Index("claim") for
// "outbox_events_claim_idx". The migrations use the same names.
func (t Table) Index(purpose string) string { return t.name + "_" + purpose + "_idx" }
