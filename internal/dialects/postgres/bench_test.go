package postgres

import (
	"testing"

	"github.com/outboxgo/outbox/dialect"
)

// BenchmarkRenderStatements renders the statements kept once per table name.
func BenchmarkRenderStatements(b *testing.B) {
	t, _ := dialect.NewTable("outbox_events")
	for b.Loop() {
		_ = renderPgStatements(t)
	}
}
