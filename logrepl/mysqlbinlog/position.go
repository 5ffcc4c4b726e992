package outboxbinlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
)

// This file holds what the Publisher keeps on the server: its position table, its lock,
// and what it checks of the server's settings.

// ErrBinlogPurged is matched by the error a session ends with when the binlog at the
// stored position is gone (purged by binlog_expire_logs_seconds or PURGE BINARY LOGS).
// The rows committed meanwhile are not lost: their insert leases run out and polling
// delivers them. The Publisher reports it once and starts again from the server's
// current position.
var ErrBinlogPurged = errors.New("outboxbinlog: binlog purged past the stored position")

// errLockLost ends a session whose lock connection died: another reader may hold it now.
var errLockLost = errors.New("outboxbinlog: lost the reader lock")

// SetupError is a server setup that only its administrator can fix; Run returns it.
type SetupError struct {
	Problem, Fix string
	Err          error
}

func (e *SetupError) Error() string {
	s := "outboxbinlog: " + e.Problem + "; " + e.Fix
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *SetupError) Unwrap() error { return e.Err }

// position is where the reader is in the binlog: after the transaction that ended there.
// gtid is the set of executed GTIDs in the server's flavor's text form, empty when the
// server runs without GTIDs (MySQL with gtid_mode OFF); file and pos are the binlog file
// and the offset after that transaction's last event.
type position struct {
	gtid string
	file string
	pos  uint32
}

func (p position) String() string {
	if p.gtid != "" {
		return p.gtid
	}
	return fmt.Sprintf("%s:%d", p.file, p.pos)
}

// quote quotes an identifier that validation allowed (letters, digits, underscores).
func quote(s string) string { return "`" + s + "`" }

// positionTable is the reader's table: <table>_binlog_position.
func (p *Publisher) positionTable() string {
	return quote(p.store.Table().Name() + "_binlog_position")
}

// ensureTable creates the position table when it is missing.
func (p *Publisher) ensureTable(ctx context.Context) error {
	_, err := p.store.DB().ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+p.positionTable()+` (
		reader VARCHAR(64) NOT NULL PRIMARY KEY,
		owner CHAR(36) NOT NULL,
		gtid TEXT NOT NULL,
		file VARCHAR(255) NOT NULL,
		pos BIGINT NOT NULL,
		updated_at DATETIME(6) NOT NULL
	) ENGINE = InnoDB`)
	var me *mysql.MySQLError
	if errors.As(err, &me) && (me.Number == 1142 || me.Number == 1044) {
		return &SetupError{Problem: "cannot create the position table " + p.positionTable(),
			Fix: "grant CREATE on the database to the Store's user, or create the table as docs/log-delivery.md shows", Err: err}
	}
	if err != nil {
		return fmt.Errorf("outboxbinlog: create position table: %w", err)
	}
	return nil
}

// lockName is the name of the reader's GET_LOCK: per database, table and reader name.
func (p *Publisher) lockName(ctx context.Context) (string, error) {
	return lockNameOf(ctx, p.store.DB(), p.o.Name)
}

// lockNameOf is the lock name of the reader called reader in db's current database.
func lockNameOf(ctx context.Context, db *sql.DB, reader string) (string, error) {
	var name sql.NullString
	if err := db.QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&name); err != nil {
		return "", fmt.Errorf("outboxbinlog: read database: %w", err)
	}
	lock := "outbox_binlog." + name.String + "." + reader
	if len(lock) > 64 {
		lock = lock[:64]
	}
	return lock, nil
}

// lock takes the reader lock, without waiting, on a connection of its own made from
// ConnString (never one of the Store's pool, which may have none to spare): false when
// another reader holds it. The lock lives as long as the connection.
func (p *Publisher) lock(ctx context.Context) (*readerLock, bool, error) {
	name, err := p.lockName(ctx)
	if err != nil {
		return nil, false, err
	}
	cfg, err := mysql.ParseDSN(p.o.ConnString)
	if err != nil {
		return nil, false, fmt.Errorf("%w: ConnString: %w", ErrInvalid, err)
	}
	cfg.DBName = ""
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, false, fmt.Errorf("%w: ConnString: %w", ErrInvalid, err)
	}
	l := &readerLock{db: sql.OpenDB(connector), name: name}
	if l.conn, err = l.db.Conn(ctx); err != nil {
		_ = l.db.Close()
		return nil, false, fmt.Errorf("outboxbinlog: lock connection: %w", err)
	}
	var got sql.NullInt64
	if err := l.conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, 0)`, name).Scan(&got); err != nil {
		l.close()
		return nil, false, fmt.Errorf("outboxbinlog: GET_LOCK: %w", err)
	}
	if got.Int64 != 1 {
		l.close()
		return nil, false, nil
	}
	return l, true, nil
}

// readerLock is a held reader lock and its connection.
type readerLock struct {
	db   *sql.DB
	conn *sql.Conn
	name string
}

// release releases the lock and closes its connection.
func (l *readerLock) release() {
	_, _ = l.conn.ExecContext(context.Background(), `DO RELEASE_LOCK(?)`, l.name)
	l.close()
}

func (l *readerLock) close() {
	_ = l.conn.Close()
	_ = l.db.Close()
}

// check returns errLockLost unless the lock is still held.
func (l *readerLock) check(ctx context.Context) error {
	var mine sql.NullInt64
	if err := l.conn.QueryRowContext(ctx, `SELECT IS_USED_LOCK(?) = CONNECTION_ID()`, l.name).Scan(&mine); err != nil {
		return fmt.Errorf("%w: %w", errLockLost, err)
	}
	if mine.Int64 != 1 {
		return errLockLost
	}
	return nil
}

// server is what the Publisher learned of the server at the start of a session.
type server struct {
	flavor string // gomysql.MariaDBFlavor or gomysql.MySQLFlavor
	gtids  bool   // resume by GTID set (always on MariaDB; gtid_mode ON on MySQL)
}

// checkServer reads the server's flavor and checks its binlog settings.
func (p *Publisher) checkServer(ctx context.Context) (server, error) {
	db := p.store.DB()
	var version string
	var logBin int
	var format string
	if err := db.QueryRowContext(ctx, `SELECT VERSION(), @@GLOBAL.log_bin, @@GLOBAL.binlog_format`).Scan(&version, &logBin, &format); err != nil {
		return server{}, fmt.Errorf("outboxbinlog: read server settings: %w", err)
	}
	if logBin != 1 {
		return server{}, &SetupError{Problem: "the binary log is off", Fix: "start the server with log_bin (MySQL 8 has it on by default) and a server_id"}
	}
	if !strings.EqualFold(format, "ROW") {
		return server{}, &SetupError{Problem: "binlog_format is " + format, Fix: "set binlog_format = ROW"}
	}
	s := server{flavor: gomysql.MySQLFlavor}
	if strings.Contains(strings.ToLower(version), "mariadb") {
		return server{flavor: gomysql.MariaDBFlavor, gtids: true}, nil
	}
	// MySQL 8 can write a transaction's events compressed into one payload event, which the
	// reader does not open: its rows would wait out their lease and be polled.
	var compressed int
	if err := db.QueryRowContext(ctx, `SELECT @@GLOBAL.binlog_transaction_compression`).Scan(&compressed); err == nil && compressed == 1 {
		return server{}, &SetupError{Problem: "binlog_transaction_compression is ON", Fix: "set binlog_transaction_compression = OFF"}
	}
	var mode string
	if err := db.QueryRowContext(ctx, `SELECT @@gtid_mode`).Scan(&mode); err == nil && strings.EqualFold(mode, "ON") {
		s.gtids = true
	}
	return s, nil
}

// current reads the server's position now: where a reader without a stored position, or
// one whose binlog was purged, starts.
func (p *Publisher) current(ctx context.Context, srv server) (position, error) {
	db := p.store.DB()
	var pos position
	switch {
	case srv.flavor == gomysql.MariaDBFlavor:
		if err := db.QueryRowContext(ctx, `SELECT @@gtid_binlog_pos`).Scan(&pos.gtid); err != nil {
			return pos, fmt.Errorf("outboxbinlog: read gtid_binlog_pos: %w", err)
		}
	case srv.gtids:
		if err := db.QueryRowContext(ctx, `SELECT @@gtid_executed`).Scan(&pos.gtid); err != nil {
			return pos, fmt.Errorf("outboxbinlog: read gtid_executed: %w", err)
		}
	}
	file, off, err := p.binlogEnd(ctx)
	if err != nil {
		return pos, err
	}
	pos.file, pos.pos = file, off
	return pos, nil
}

// binlogEnd reads the server's current binlog file and offset.
func (p *Publisher) binlogEnd(ctx context.Context) (string, uint32, error) {
	rows, err := p.store.DB().QueryContext(ctx, `SHOW MASTER STATUS`)
	if err != nil && !isAccessDenied(err) {
		rows, err = p.store.DB().QueryContext(ctx, `SHOW BINARY LOG STATUS`) // MySQL 8.4
	}
	if isAccessDenied(err) {
		return "", 0, &SetupError{Problem: "the Store's user cannot read the binlog status", Fix: "grant it REPLICATION CLIENT (MariaDB 10.5+: BINLOG MONITOR)", Err: err}
	}
	if err != nil {
		return "", 0, fmt.Errorf("outboxbinlog: read binlog status: %w", err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	if !rows.Next() {
		return "", 0, &SetupError{Problem: "the server shows no binlog status", Fix: "turn the binary log on, and grant REPLICATION CLIENT (MariaDB: BINLOG MONITOR)", Err: rows.Err()}
	}
	vals := make([]any, len(cols))
	var file string
	var off uint64
	vals[0], vals[1] = &file, &off
	for i := 2; i < len(vals); i++ {
		vals[i] = new(sql.RawBytes)
	}
	if err := rows.Scan(vals...); err != nil {
		return "", 0, err
	}
	return file, uint32(off), rows.Err()
}

// isAccessDenied reports whether err is the server's refusal for want of a privilege
// (1227: "you need (at least one of) the ... privilege(s)").
func isAccessDenied(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1227
}

// binlogFile is one of the server's binlog files, as SHOW BINARY LOGS lists them.
type binlogFile struct {
	name string
	size int64
}

// binlogFiles lists the server's binlog files, oldest first.
func binlogFiles(ctx context.Context, db *sql.DB) ([]binlogFile, error) {
	rows, err := db.QueryContext(ctx, `SHOW BINARY LOGS`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var out []binlogFile
	for rows.Next() {
		var f binlogFile
		vals := []any{&f.name, &f.size}
		for len(vals) < len(cols) {
			vals = append(vals, new(sql.RawBytes))
		}
		if err := rows.Scan(vals...); err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, rows.Err()
}

// lagAfter is how many binlog bytes the server wrote past offset pos of file, summed over
// the files after it; found is false when file is no longer among them (purged).
func lagAfter(files []binlogFile, file string, pos int64) (lag int64, found bool) {
	for _, f := range files {
		switch {
		case f.name == file:
			lag, found = f.size-pos, true
		case found:
			lag += f.size
		}
	}
	return max(lag, 0), found
}

// claimPosition makes this session the owner of the reader's row (a fence: a reader that
// lost its lock and still settles finds its owner gone and writes nothing) and returns the
// stored position, or the server's current one for a reader that has none.
func (p *Publisher) claimPosition(ctx context.Context, srv server, owner uuid.UUID) (position, error) {
	db := p.store.DB()
	var pos position
	var off int64
	err := db.QueryRowContext(ctx, `SELECT gtid, file, pos FROM `+p.positionTable()+` WHERE reader = ?`, p.o.Name).Scan(&pos.gtid, &pos.file, &off)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if pos, err = p.current(ctx, srv); err != nil {
			return pos, err
		}
		p.log.Info("outboxbinlog: no stored position; starting at the server's current one (older rows are polled when their leases run out)",
			"reader", p.o.Name, "position", pos.String())
	case err != nil:
		return pos, fmt.Errorf("outboxbinlog: read position: %w", err)
	default:
		pos.pos = uint32(off)
	}
	return pos, p.writeOwner(ctx, owner, pos)
}

// writeOwner writes pos under a new owner.
func (p *Publisher) writeOwner(ctx context.Context, owner uuid.UUID, pos position) error {
	_, err := p.store.DB().ExecContext(ctx, `INSERT INTO `+p.positionTable()+` (reader, owner, gtid, file, pos, updated_at)`+
		` VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE owner = VALUES(owner), gtid = VALUES(gtid),`+
		` file = VALUES(file), pos = VALUES(pos), updated_at = VALUES(updated_at)`,
		p.o.Name, owner.String(), pos.gtid, pos.file, pos.pos)
	if err != nil {
		return fmt.Errorf("outboxbinlog: write position: %w", err)
	}
	return nil
}

// errFenced ends a session whose row in the position table has another owner: a reader
// that took the lock over after this one lost it.
var errFenced = errors.New("outboxbinlog: another reader owns the position")

// savePosition writes pos on tx (a settle's, or its own) if this session still owns it.
func (p *Publisher) savePosition(ctx context.Context, tx *sql.Tx, owner uuid.UUID, pos position) error {
	res, err := tx.ExecContext(ctx, `UPDATE `+p.positionTable()+` SET gtid = ?, file = ?, pos = ?, updated_at = UTC_TIMESTAMP(6)`+
		` WHERE reader = ? AND owner = ?`, pos.gtid, pos.file, pos.pos, p.o.Name, owner.String())
	if err != nil {
		return fmt.Errorf("outboxbinlog: write position: %w", err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		// Unchanged values count 0 rows affected too; tell that from a lost fence.
		var got string
		if err := tx.QueryRowContext(ctx, `SELECT owner FROM `+p.positionTable()+` WHERE reader = ?`, p.o.Name).Scan(&got); err != nil || got != owner.String() {
			return errFenced
		}
	}
	return nil
}

// checkOwner returns errFenced unless this session owns the reader's row, holding a shared
// lock on it until tx ends: a settle that writes no position is fenced as one that writes
// it, since a successor's claim (writeOwner) waits for the lock.
func (p *Publisher) checkOwner(ctx context.Context, tx *sql.Tx, owner uuid.UUID) error {
	var got string
	err := tx.QueryRowContext(ctx, `SELECT owner FROM `+p.positionTable()+` WHERE reader = ? LOCK IN SHARE MODE`, p.o.Name).Scan(&got)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return errFenced
	case err != nil:
		return fmt.Errorf("outboxbinlog: read position owner: %w", err)
	case got != owner.String():
		return errFenced
	}
	return nil
}

// isPurged reports whether err is the server's refusal to send a binlog it no longer has.
func isPurged(err error) bool {
	var me *gomysql.MyError
	if errors.As(err, &me) && me.Code == 1236 {
		return true
	}
	return err != nil && strings.Contains(err.Error(), "ERROR 1236")
}
