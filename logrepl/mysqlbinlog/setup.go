package outboxbinlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxgo/outbox"
)

// This file holds what an operator does with the reader's table without running a
// Publisher: read the stored positions, and create or drop the table ahead of time.

// ErrReaderActive is matched by the error of [Drop] when a reader of the table holds its
// lock: it would create the table again and start from the server's current position.
var ErrReaderActive = errors.New("outboxbinlog: a binlog reader is running")

// Position is a reader's stored position against the server's binlog now.
type Position struct {
	// Reader is the reader's Name.
	Reader string
	// Stored is false for a reader named to [Positions] that has no row (yet): a reader
	// starts at the server's current position then. The fields up to UpdatedAt are zero.
	Stored bool
	// GTID, File and Pos are the stored position: the GTID set (empty where the server
	// runs without GTIDs), and the binlog file and the offset in it.
	GTID, File string
	Pos        int64
	// UpdatedAt is when the position was last written (the server's UTC clock).
	UpdatedAt time.Time
	// Reading is whether a reader of that name holds its lock now.
	Reading bool
	// LagBytes is how many binlog bytes the server wrote past the stored position, summed
	// over its files; zero when Purged.
	LagBytes int64
	// Purged is whether File is no longer among the server's binlogs (expired or purged):
	// the next reader finds its position gone, starts again at the server's current one,
	// and polling delivers the rows committed in between once their leases run out.
	Purged bool
	// ServerFile and ServerPos are the end of the server's binlog now.
	ServerFile string
	ServerPos  int64
}

// admin returns a Publisher that only sets up, drops or reads.
func admin(store *outbox.Store) (*Publisher, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalid)
	}
	if store.Dialect().Name() != "mysql" {
		return nil, fmt.Errorf("%w: the store's dialect is %s; binlog delivery needs MySQL or MariaDB", ErrInvalid, store.Dialect().Name())
	}
	return &Publisher{store: store, o: Options{}.withDefaults(store)}, nil
}

// positionTableExists reports whether the reader's table exists in the current database.
func (p *Publisher) positionTableExists(ctx context.Context) (bool, error) {
	var n int
	err := p.store.DB().QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?`,
		p.store.Table().Name()+"_binlog_position").Scan(&n)
	if err != nil {
		return false, fmt.Errorf("outboxbinlog: look for the position table: %w", err)
	}
	return n > 0, nil
}

// Positions returns the stored positions of store's table's readers, against the server's
// binlog now: with names, those readers' (one without a row with Stored false); without,
// every reader's in the position table, none when there is no such table. The Store's
// user needs REPLICATION CLIENT (MariaDB 10.5+: BINLOG MONITOR) to list the binlogs.
func Positions(ctx context.Context, store *outbox.Store, names ...string) ([]Position, error) {
	p, err := admin(store)
	if err != nil {
		return nil, err
	}
	exists, err := p.positionTableExists(ctx)
	if err != nil {
		return nil, err
	}
	stored := map[string]Position{}
	var order []string
	if exists {
		// updated_at as text, since whether the driver parses DATETIMEs is the DSN's choice.
		rows, err := store.DB().QueryContext(ctx, `SELECT reader, gtid, file, pos, CAST(updated_at AS CHAR) FROM `+p.positionTable()+` ORDER BY reader`)
		if err != nil {
			return nil, fmt.Errorf("outboxbinlog: read positions: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			pos := Position{Stored: true}
			var at string
			if err := rows.Scan(&pos.Reader, &pos.GTID, &pos.File, &pos.Pos, &at); err != nil {
				return nil, fmt.Errorf("outboxbinlog: read positions: %w", err)
			}
			if pos.UpdatedAt, err = time.Parse("2006-01-02 15:04:05.999999", at); err != nil {
				return nil, fmt.Errorf("outboxbinlog: read positions: updated_at %q: %w", at, err)
			}
			stored[pos.Reader] = pos
			order = append(order, pos.Reader)
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("outboxbinlog: read positions: %w", err)
		}
	}
	if len(names) > 0 {
		order = names
	}
	if len(order) == 0 {
		return nil, nil
	}
	files, err := binlogFiles(ctx, store.DB())
	if isAccessDenied(err) {
		return nil, &SetupError{Problem: "the Store's user cannot list the binlogs", Fix: "grant it REPLICATION CLIENT (MariaDB 10.5+: BINLOG MONITOR)", Err: err}
	}
	if err != nil {
		return nil, fmt.Errorf("outboxbinlog: list binlogs: %w", err)
	}
	file, off, err := p.binlogEnd(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Position, 0, len(order))
	for _, name := range order {
		pos, ok := stored[name]
		if !ok {
			pos = Position{Reader: name}
		}
		pos.ServerFile, pos.ServerPos = file, int64(off)
		if pos.Stored {
			var found bool
			pos.LagBytes, found = lagAfter(files, pos.File, pos.Pos)
			pos.Purged = !found
		}
		if pos.Reading, err = p.held(ctx, name); err != nil {
			return nil, err
		}
		out = append(out, pos)
	}
	return out, nil
}

// held reports whether a reader called name holds its lock now, and on which connection.
func (p *Publisher) held(ctx context.Context, name string) (bool, error) {
	lock, err := lockNameOf(ctx, p.store.DB(), name)
	if err != nil {
		return false, err
	}
	var conn sql.NullInt64
	if err := p.store.DB().QueryRowContext(ctx, `SELECT IS_USED_LOCK(?)`, lock).Scan(&conn); err != nil {
		return false, fmt.Errorf("outboxbinlog: IS_USED_LOCK: %w", err)
	}
	return conn.Valid, nil
}

// Setup creates the position table of store's table ahead of a reader's first Run, for a
// deployment whose readers' user may not create tables, and says whether it did (false:
// it existed). It checks the server first and returns a [*SetupError], changing nothing,
// for what its administrator must fix: the binary log off, binlog_format other than ROW,
// the Store's user without REPLICATION CLIENT (MariaDB 10.5+: BINLOG MONITOR) or CREATE.
// It cannot see the binlog connection's REPLICATION SLAVE, which Run checks.
func Setup(ctx context.Context, store *outbox.Store) (bool, error) {
	p, err := admin(store)
	if err != nil {
		return false, err
	}
	if _, err := p.checkServer(ctx); err != nil {
		return false, err
	}
	if _, _, err := p.binlogEnd(ctx); err != nil {
		return false, err
	}
	exists, err := p.positionTableExists(ctx)
	if err != nil || exists {
		return false, err
	}
	if err := p.ensureTable(ctx); err != nil {
		return false, err
	}
	return true, nil
}

// Drop drops the position table of store's table, for a table that goes back to polling
// only, and says whether it did (false: there was none). It refuses, changing nothing,
// while a reader of any name stored in it holds its lock ([ErrReaderActive]: stop the
// readers first). A reader started later creates the table again and begins at the
// server's current position; rows still leased to the log's reader are polled once their
// leases run out.
func Drop(ctx context.Context, store *outbox.Store) (bool, error) {
	p, err := admin(store)
	if err != nil {
		return false, err
	}
	exists, err := p.positionTableExists(ctx)
	if err != nil || !exists {
		return false, err
	}
	rows, err := store.DB().QueryContext(ctx, `SELECT reader FROM `+p.positionTable())
	if err != nil {
		return false, fmt.Errorf("outboxbinlog: read readers: %w", err)
	}
	var readers []string
	for rows.Next() {
		var r string
		if err := rows.Scan(&r); err != nil {
			_ = rows.Close()
			return false, fmt.Errorf("outboxbinlog: read readers: %w", err)
		}
		readers = append(readers, r)
	}
	if err := rows.Close(); err != nil {
		return false, fmt.Errorf("outboxbinlog: read readers: %w", err)
	}
	for _, r := range append(readers, p.o.Name) {
		held, err := p.held(ctx, r)
		if err != nil {
			return false, err
		}
		if held {
			return false, fmt.Errorf("%w: reader %s holds its lock; stop it first (nothing was dropped)", ErrReaderActive, r)
		}
	}
	_, err = store.DB().ExecContext(ctx, `DROP TABLE IF EXISTS `+p.positionTable())
	var me *mysql.MySQLError
	if errors.As(err, &me) && (me.Number == 1142 || me.Number == 1044) {
		return false, &SetupError{Problem: "cannot drop the position table " + p.positionTable(), Fix: "grant DROP on the database to the user, or drop it as one who has it", Err: err}
	}
	if err != nil {
		return false, fmt.Errorf("outboxbinlog: drop position table: %w", err)
	}
	return true, nil
}
