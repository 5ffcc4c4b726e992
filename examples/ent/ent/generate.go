// Package ent is the ent client of the example, generated from ./schema.
package ent

//go:generate go run entgo.io/ent/cmd/ent generate ./schema
