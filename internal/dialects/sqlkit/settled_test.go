package sqlkit_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// TestContinueHeads: a key whose settled rows are all delivered is continued from its last
// row by (created_at, id), whatever order the settle returned them in; a key with one row
// not delivered, wherever it lies, is not continued, nor are rows without a key; the same
// key in another namespace is another key.
func TestContinueHeads(t *testing.T) {
	t.Parallel()
	id := func(i byte) uuid.UUID { return uuid.UUID{i} }
	row := func(ns, pk string, at int64, i byte, delivered bool) sqlkit.SettledRow {
		return sqlkit.SettledRow{Namespace: ns, PartitionKey: pk, At: at, ID: id(i), Delivered: delivered}
	}
	rows := []sqlkit.SettledRow{
		row("n", "a", 20, 3, true), row("n", "a", 10, 1, true), row("n", "a", 20, 2, true),
		row("n", "b", 10, 4, true), row("n", "b", 20, 5, false), row("n", "b", 30, 6, true),
		row("m", "a", 5, 7, true),
		row("n", "", 40, 8, true),
		row("n", "c", 10, 9, false),
	}
	require.Equal(t, []sqlkit.RunHead{
		{Namespace: "n", PartitionKey: "a", At: 20, ID: id(3)},
		{Namespace: "m", PartitionKey: "a", At: 5, ID: id(7)},
	}, sqlkit.ContinueHeads(rows))
	require.Empty(t, sqlkit.ContinueHeads(nil))
}
