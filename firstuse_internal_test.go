package outbox

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFirstUseVerdictKept: a server that answers neither version query (here a driver that
// returns no rows) is a verdict, kept, not an error to check again on every enqueue; a
// cancelled context is none.
func TestFirstUseVerdictKept(t *testing.T) {
	t.Parallel()
	s, err := New(benchNullDB(), Postgres(), Options{})
	require.NoError(t, err)
	m := benchMessage(1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tx, err := s.db.Begin()
	require.NoError(t, err)
	_, _ = s.Enqueue(ctx, tx, m)
	_ = tx.Rollback()
	require.Nil(t, s.first.verdict.Load(), "no verdict from a cancelled context")
	_, err = s.EnqueueStandalone(context.Background(), m)
	require.NoError(t, err)
	v := s.first.verdict.Load()
	require.NotNil(t, v)
	require.NoError(t, v.err)
}
