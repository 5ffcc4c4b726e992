package outbox

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox/dialect"
)

// TestPacketTooLarge: the errors of MySQL, MariaDB and go-sql-driver for a statement over
// the packet limit become a CheckError naming the setting; others pass through.
func TestPacketTooLarge(t *testing.T) {
	t.Parallel()
	for msg, want := range map[string]string{
		"Error 1153 (08S01): Got a packet bigger than 'max_allowed_packet' bytes":                                                                   "SET GLOBAL max_allowed_packet",
		"Error 1210 (HY000): Parameter of prepared statement which is set through mysql_send_long_data() is longer than 'max_allowed_packet' bytes": "SET GLOBAL max_allowed_packet",
		// go-sql-driver's ErrPktTooLarge, whose text is all the root package can match.
		"packet for query is too large. Try adjusting the `Config.MaxAllowedPacket`": "maxAllowedPacket in the DSN",
	} {
		ce := packetTooLarge(errors.New(msg))
		require.NotNil(t, ce, msg)
		require.ErrorIs(t, ce, ErrMisconfigured)
		require.ErrorContains(t, ce, want)
		require.ErrorContains(t, ce, "Options.MaxPayloadBytes")
		require.ErrorContains(t, ce, msg, "the driver's error is kept")
	}
	require.Nil(t, packetTooLarge(errors.New("Error 1062 (23000): Duplicate entry")))
}

// TestBrokenBigWrite: a connection that broke while MySQL was sent a mebibyte or more of
// payload is explained with the server's setting; a small write or another dialect is not.
func TestBrokenBigWrite(t *testing.T) {
	t.Parallel()
	big := []dialect.Row{{Payload: make([]byte, 1<<20)}}
	small := []dialect.Row{{Payload: make([]byte, 1<<10)}}
	err := brokenBigWrite(MySQL(), fmt.Errorf("wrapped: %w", driver.ErrBadConn), big)
	require.ErrorIs(t, err, driver.ErrBadConn)
	require.ErrorContains(t, err, "max_allowed_packet")
	require.ErrorContains(t, err, "Options.MaxPayloadBytes")
	require.NoError(t, brokenBigWrite(MySQL(), driver.ErrBadConn, small))
	require.NoError(t, brokenBigWrite(SQLite(), driver.ErrBadConn, big))
	require.NoError(t, brokenBigWrite(MySQL(), errors.New("Error 1062"), big))
}

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
