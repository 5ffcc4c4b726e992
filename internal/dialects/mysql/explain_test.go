package mysql

import (
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
		require.ErrorIs(t, ce, dialect.ErrMisconfigured)
		require.ErrorContains(t, ce, want)
		require.ErrorContains(t, ce, "Options.MaxPayloadBytes")
		require.ErrorContains(t, ce, msg, "the driver's error is kept")
	}
	require.Nil(t, packetTooLarge(errors.New("Error 1062 (23000): Duplicate entry")))
}

// TestBrokenBigWrite: a connection that broke while MySQL was sent a mebibyte or more of
// payload is explained with the server's setting; a small write or another error is not.
func TestBrokenBigWrite(t *testing.T) {
	t.Parallel()
	tbl, err := dialect.NewTable("outbox_events")
	require.NoError(t, err)
	explain := func(err error, size int) error {
		return New().ExplainError(err, dialect.ExplainParams{Table: tbl, PayloadBytes: size})
	}
	err = explain(fmt.Errorf("wrapped: %w", driver.ErrBadConn), 1<<20)
	require.ErrorIs(t, err, driver.ErrBadConn)
	require.ErrorContains(t, err, "max_allowed_packet")
	require.ErrorContains(t, err, "Options.MaxPayloadBytes")
	var ce *dialect.CheckError
	require.False(t, errors.As(err, &ce), "the connection may have broken for another reason")
	require.NoError(t, explain(driver.ErrBadConn, 1<<10))
	require.NoError(t, explain(errors.New("Error 1062"), 1<<20))
}
