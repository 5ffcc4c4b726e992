package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// packetTooLarge returns a [*dialect.CheckError] wrapping err when MySQL or MariaDB refused a
// statement for exceeding max_allowed_packet (the server's error 1153, or its refusal of a
// long parameter, both of which name the setting), or when go-sql-driver refused to send
// it for exceeding its own maxAllowedPacket (ErrPktTooLarge, matched by its text: the root
// package imports no driver); nil otherwise. Either way the payload is bigger than the
// database accepts while outbox.Options.MaxPayloadBytes let it pass.
func packetTooLarge(err error) *dialect.CheckError {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "max_allowed_packet") || strings.Contains(msg, "Error 1153"):
		return &dialect.CheckError{
			Problem: "the statement is bigger than the server's max_allowed_packet (the server closes the connection, " +
				"and the transaction with it)",
			Fix: "raise max_allowed_packet on the server (SET GLOBAL max_allowed_packet = 67108864, and the same in its " +
				"configuration file), or lower Options.MaxPayloadBytes below it",
			Err: err,
		}
	case strings.Contains(msg, "packet for query is too large"):
		return &dialect.CheckError{
			Problem: "the statement is bigger than go-sql-driver's maxAllowedPacket",
			Fix: "raise maxAllowedPacket in the DSN (maxAllowedPacket=0 uses the server's max_allowed_packet), " +
				"or lower Options.MaxPayloadBytes below it",
			Err: err,
		}
	}
	return nil
}

// brokenBigWrite explains a connection that broke while MySQL or MariaDB was sent a
// payload of a mebibyte or more: the server closes the connection when a packet exceeds
// max_allowed_packet, and go-sql-driver, which sends a big bound payload in chunks,
// sometimes finds the connection closed before it reads the server's error. It returns nil
// for a smaller write or another error. The connection may have broken for
// another reason, so the error is not a [*dialect.CheckError]; it wraps err.
func brokenBigWrite(err error, size int) error {
	if !errors.Is(err, driver.ErrBadConn) || size < 1<<20 {
		return nil
	}
	return fmt.Errorf("the connection broke while sending %d bytes of payload; if that is more than "+
		"the server's max_allowed_packet, raise it (SET GLOBAL max_allowed_packet = 67108864, and the same in its "+
		"configuration file) or lower Options.MaxPayloadBytes below it: %w", size, err)
}

// CheckFirstUse implements [dialect.Checker]: the pool must be MySQL or MariaDB.
func (d Dialect) CheckFirstUse(ctx context.Context, drv driver.Driver, tx dialect.DBTX) error {
	_, err := sqlkit.CheckKind(ctx, d.Name(), drv, tx)
	return err
}

// ExplainError implements [dialect.Checker]: error 1146 is the missing outbox table
// (or its dedupe tables); a statement over max_allowed_packet, and a connection that broke
// while a big payload was sent, say what to raise.
func (d Dialect) ExplainError(err error, p dialect.ExplainParams) error {
	if n, ok := mysqlErrorNumber(err); (ok && n == 1146) || strings.Contains(err.Error(), "Error 1146") {
		return sqlkit.MissingTable(d.Name(), p.Table, err)
	}
	if ce := packetTooLarge(err); ce != nil {
		return ce
	}
	return brokenBigWrite(err, p.PayloadBytes)
}

// CheckServer implements [dialect.Checker]: TiDB is refused.
func (d Dialect) CheckServer(ctx context.Context, db *sql.DB, t dialect.Table, p dialect.ServerParams) error {
	info, err := d.serverInfo(ctx, db, t)
	return sqlkit.CheckServer(info, err, p)
}
