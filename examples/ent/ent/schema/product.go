// Package schema holds the example's ent schema: products and orders.
package schema

import (
	"entgo.io/ent"
	"entgo.io/ent/schema/field"
)

// Product is a stock-keeping unit and how many are in stock.
type Product struct{ ent.Schema }

// Fields of Product: its SKU is its id.
func (Product) Fields() []ent.Field {
	return []ent.Field{
		field.String("id").StorageKey("sku").MaxLen(64).NotEmpty(),
		field.Int("stock"),
	}
}
