package outboxbinlog

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSetupPositionsDrop: Setup creates the position table, and finds it the second time;
// Positions shows a running reader's stored position, and a named reader without one;
// Drop refuses while a reader holds its lock, changing nothing, and drops the table after.
func TestSetupPositionsDrop(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	got, err := Positions(b.ctx, b.store)
	require.NoError(t, err)
	require.Empty(t, got, "no position table: no reader")
	created, err := Setup(b.ctx, b.store)
	require.NoError(t, err)
	require.True(t, created)
	created, err = Setup(b.ctx, b.store)
	require.NoError(t, err)
	require.False(t, created, "a second Setup finds the table")

	p := b.publisher(t, Options{})
	stop := b.start(t, p)
	got, err = Positions(b.ctx, b.store)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, "outbox_outbox_events", got[0].Reader)
	require.True(t, got[0].Stored && got[0].Reading)
	require.False(t, got[0].Purged)
	require.NotEmpty(t, got[0].File)
	require.NotEmpty(t, got[0].ServerFile)
	require.WithinDuration(t, time.Now(), got[0].UpdatedAt, time.Minute)
	got, err = Positions(b.ctx, b.store, "nosuch")
	require.NoError(t, err)
	require.Equal(t, "nosuch", got[0].Reader)
	require.False(t, got[0].Stored || got[0].Reading)

	_, err = Drop(b.ctx, b.store)
	require.ErrorIs(t, err, ErrReaderActive)
	got, err = Positions(b.ctx, b.store)
	require.NoError(t, err)
	require.Len(t, got, 1, "the refused Drop left the table")

	require.NoError(t, stop())
	dropped, err := Drop(b.ctx, b.store)
	require.NoError(t, err)
	require.True(t, dropped)
	got, err = Positions(b.ctx, b.store)
	require.NoError(t, err)
	require.Empty(t, got)
	dropped, err = Drop(b.ctx, b.store)
	require.NoError(t, err)
	require.False(t, dropped, "dropping again is no error")
}
