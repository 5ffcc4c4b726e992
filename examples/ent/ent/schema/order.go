package schema

import (
	"entgo.io/ent"
	"entgo.io/ent/schema/field"
)

// Order is the business row.
type Order struct{ ent.Schema }

// Fields of Order: its id is the caller's.
func (Order) Fields() []ent.Field {
	return []ent.Field{
		field.Int64("id"),
		field.String("sku").MaxLen(64),
		field.Int("quantity"),
	}
}
