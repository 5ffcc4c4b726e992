package sqlkit

import (
	"database/sql"
	"database/sql/driver"
	"slices"
	"time"

	"github.com/google/uuid"
)

// The cross-process wake-ups of the databases that cannot push a signal (SQLite, MySQL).
// Their listener asks the database, on a connection of its own, which due pending rows
// were committed lately, and wakes the namespaces of the rows it has not reported yet. What
// it reads is committed, so an open or rolled-back transaction wakes nobody; it reads its
// own table in its own database, so no other table's rows wake it. Signal has nothing to
// do. Each dialect decides how often it asks: SQLite only when its file changed (PRAGMA
// data_version), MySQL at a short interval.

// NotifyLookback is how far back, by the time rows fell due, the listener's probe looks
// for claimable rows. A row committed by a transaction that stayed open longer than this
// after its enqueue wakes nobody: the publisher's poll finds it, within a second while it
// listens (DefaultIdleBackoffMax). The probe walks only the rows that fell due within it,
// newest first, at most NotifyProbeLimit of them.
const NotifyLookback = 10 * time.Second

// NotifyProbeLimit bounds the rows one probe reads. Under a backlog the newest rows are
// enough: their namespaces' publishers are busy anyway.
const NotifyProbeLimit = 32

// Fresh tells a listener which of the rows its probe returned are new since the previous
// probe: those it has not reported.
type Fresh struct {
	seen map[uuid.UUID]struct{}
}

// scan reads the (id, namespace) rows of a probe and returns the namespaces of the rows
// not seen by the previous probe, each once. Ids missing from this probe are forgotten: a
// row that turns pending and due again (a retry) is new again.
func (f *Fresh) scan(rows *sql.Rows) ([]string, error) {
	defer rows.Close()
	seen := make(map[uuid.UUID]struct{}, len(f.seen))
	var nss []string
	for rows.Next() {
		var id []byte
		var ns string
		if err := rows.Scan(&id, &ns); err != nil {
			return nil, err
		}
		u, err := uuid.FromBytes(id)
		if err != nil {
			return nil, err
		}
		seen[u] = struct{}{}
		if _, old := f.seen[u]; !old && !slices.Contains(nss, ns) {
			nss = append(nss, ns)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	f.seen = seen
	return nss, nil
}

// WakeNew reads the rows of a probe (or its error) and wakes the namespaces of its new
// rows. It reports whether there were any.
func (f *Fresh) WakeNew(rows *sql.Rows, err error, wake func(string)) (found bool, _ error) {
	if err != nil {
		return false, err
	}
	nss, err := f.scan(rows)
	if err != nil {
		return false, err
	}
	for _, ns := range nss {
		wake(ns)
	}
	return len(nss) > 0, nil
}

// CloseConn closes a listener's connection for good instead of giving it back to the pool
// (rule 3 of dialect.Notifier): a connection that served a listener, whatever state it was
// left in, never serves anyone else. Returning driver.ErrBadConn from Raw makes database/sql
// close the driver connection.
func CloseConn(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}
