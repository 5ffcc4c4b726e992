package dialect

import (
	"fmt"
	"strings"
)

// Table is a validated outbox table name, with an optional schema. Dialects receive only
// Tables, so no unchecked string can reach their SQL; they quote [Table.Name] once when
// rendering statements, qualified by [Table.Schema] when it is not empty.
type Table struct{ schema, name string }

// MaxSchemaBytes bounds a schema name: PostgreSQL's identifier limit.
const MaxSchemaBytes = 63

// MaxTableBytes bounds a table name so that derived index names fit the 63-byte
// identifier limit of PostgreSQL.
const MaxTableBytes = 48

// NewTable validates name: lowercase ASCII letters, digits and underscores, beginning with
// a letter or underscore, 1..[MaxTableBytes] bytes, and not beginning with "sqlite_", a
// prefix SQLite reserves for its own tables. Lowercase only, because MySQL's table name case
// sensitivity depends on the server's file system. A bad name returns an error that says
// why; outbox.New reports it as an outbox.ValidationError of Options.Table.
func NewTable(name string) (Table, error) {
	if err := checkIdent("name", name, MaxTableBytes); err != nil {
		return Table{}, err
	}
	if strings.HasPrefix(name, "sqlite_") {
		return Table{}, fmt.Errorf("name %q begins with sqlite_, which SQLite reserves for its own tables", name)
	}
	return Table{name: name}, nil
}

// NewTableIn validates name as [NewTable] does and schema by the same rules, 1..[MaxSchemaBytes]
// bytes; an empty schema gives the table of [NewTable], found where the connection finds
// unqualified names. A table with a schema is named by both everywhere a dialect renders it,
// never through the connection's search path. The engine gives a table with a schema only to
// the built-in PostgreSQL dialect; it refuses a schema for any other.
func NewTableIn(schema, name string) (Table, error) {
	t, err := NewTable(name)
	if err != nil || schema == "" {
		return t, err
	}
	if err := checkIdent("schema", schema, MaxSchemaBytes); err != nil {
		return Table{}, err
	}
	t.schema = schema
	return t, nil
}

func checkIdent(what, s string, limit int) error {
	if s == "" || len(s) > limit {
		return fmt.Errorf("%s must be 1..%d bytes, got %d", what, limit, len(s))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c == '_' || (c >= 'a' && c <= 'z') || (i > 0 && c >= '0' && c <= '9')
		if !ok {
			return fmt.Errorf("%s %q must match [a-z_][a-z0-9_]*", what, s)
		}
	}
	return nil
}

// Schema returns the unquoted schema name, or "" for a table without one.
func (t Table) Schema() string { return t.schema }

// Name returns the unquoted table name.
func (t Table) Name() string { return t.name }

// Index returns the name of an index on the table, such as Index("claim") for
// "outbox_events_claim_idx". The migrations use the same names.
func (t Table) Index(purpose string) string { return t.name + "_" + purpose + "_idx" }
