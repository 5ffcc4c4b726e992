package outboxpglog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// This file holds what the Publisher sets up on the server, and takes down: the wal_level
// check, the publication, the slot, and the slot's lag.

// ErrSlotLost is matched by the error a session ends with when its slot was dropped or
// invalidated (wal_status lost: it fell more than max_slot_wal_keep_size behind). The rows
// committed meanwhile are not lost: their insert leases run out and polling delivers them.
// The Publisher reports it once and creates the slot again.
var ErrSlotLost = errors.New("outboxpglog: replication slot lost")

// SetupError is a server setup that only its administrator can fix; Run returns it.
type SetupError struct {
	Problem, Fix string
	Err          error
}

func (e *SetupError) Error() string {
	s := "outboxpglog: " + e.Problem + "; " + e.Fix
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *SetupError) Unwrap() error { return e.Err }

// quoteIdent quotes an identifier that validation allowed (lowercase letters, digits and
// underscores), so it needs no escaping.
func quoteIdent(s string) string { return `"` + s + `"` }

// checkWALLevel returns a *SetupError unless the server decodes its log (wal_level logical).
func checkWALLevel(ctx context.Context, db *sql.DB) error {
	var level string
	if err := db.QueryRowContext(ctx, `SHOW wal_level`).Scan(&level); err != nil {
		return fmt.Errorf("outboxpglog: read wal_level: %w", err)
	}
	if level != "logical" {
		return &SetupError{Problem: "wal_level is " + level, Fix: "set wal_level = logical in postgresql.conf and restart the server"}
	}
	return nil
}

// ensurePublication creates the publication of the table's inserts when it is missing, and
// says whether it did.
func (p *Publisher) ensurePublication(ctx context.Context) (bool, error) {
	db := p.store.DB()
	var one int
	err := db.QueryRowContext(ctx, `SELECT 1 FROM pg_publication WHERE pubname = $1`, p.o.Publication).Scan(&one)
	if err == nil {
		return false, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return false, fmt.Errorf("outboxpglog: read publication: %w", err)
	}
	tbl := p.qualifiedTable()
	_, err = db.ExecContext(ctx, `CREATE PUBLICATION `+quoteIdent(p.o.Publication)+` FOR TABLE `+tbl+` WITH (publish = 'insert')`)
	var pe *pgconn.PgError
	switch {
	case err == nil:
		p.log.Info("outboxpglog: created publication", "publication", p.o.Publication, "table", tbl)
		return true, nil
	case errors.As(err, &pe) && pe.Code == "42710": // another replica created it first
		return false, nil
	case errors.As(err, &pe) && pe.Code == "42501":
		return false, &SetupError{Problem: "cannot create publication " + p.o.Publication,
			Fix: "the role needs CREATE on the database and must own the table (or be a superuser); or create it as the table's owner: CREATE PUBLICATION " + p.o.Publication + " FOR TABLE " + tbl + " WITH (publish = 'insert')", Err: err}
	}
	return false, fmt.Errorf("outboxpglog: create publication: %w", err)
}

// qualifiedTable is the store's table, quoted, with its schema when it has one.
func (p *Publisher) qualifiedTable() string {
	t := p.store.Table()
	if t.Schema() != "" {
		return quoteIdent(t.Schema()) + "." + quoteIdent(t.Name())
	}
	return quoteIdent(t.Name())
}

// slotsQuery reads slots as [Slot] has them: the one named $1, and with a table in $2 the
// slots of this database named like a publication of that table. to_jsonb reads
// invalidation_reason where the server has it (PostgreSQL 17) and nothing before.
const slotsQuery = `SELECT s.slot_name, s.active, coalesce(s.active_pid, 0),
	coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint, 0),
	coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint, 0),
	coalesce(s.wal_status, ''), coalesce(to_jsonb(s)->>'invalidation_reason', '')
	FROM pg_replication_slots s
	WHERE s.slot_name = $1 OR ($2 <> '' AND s.database = current_database() AND EXISTS (
		SELECT 1 FROM pg_publication_tables pt WHERE pt.pubname = s.slot_name
		AND to_regclass(quote_ident(pt.schemaname) || '.' || quote_ident(pt.tablename)) = to_regclass($2)))
	ORDER BY s.slot_name`

// readSlots runs slotsQuery. One name, not an array of them: the Store's pool may be
// any PostgreSQL driver's, and not every one takes a Go slice as a parameter.
func readSlots(ctx context.Context, db *sql.DB, name, table string) ([]Slot, error) {
	rows, err := db.QueryContext(ctx, slotsQuery, name, table)
	if err != nil {
		return nil, fmt.Errorf("outboxpglog: read slots: %w", err)
	}
	defer rows.Close()
	var out []Slot
	for rows.Next() {
		s := Slot{Exists: true}
		if err := rows.Scan(&s.Name, &s.Active, &s.ActivePID, &s.LagBytes, &s.RetainedWALBytes, &s.WALStatus, &s.Invalidated); err != nil {
			return nil, fmt.Errorf("outboxpglog: read slots: %w", err)
		}
		if s.Invalidated == "" && s.WALStatus == "lost" {
			s.Invalidated = "wal_removed" // the only cause before PostgreSQL 17 names it
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outboxpglog: read slots: %w", err)
	}
	return out, nil
}

// readSlot reads the Publisher's slot; Exists is false when the server has none.
func (p *Publisher) readSlot(ctx context.Context) (Slot, error) {
	slots, err := readSlots(ctx, p.store.DB(), p.o.Slot, "")
	if err != nil || len(slots) == 0 {
		return Slot{Name: p.o.Slot}, err
	}
	return slots[0], nil
}

// ensureSlot creates the slot when it is missing, and drops and creates again one that
// the server invalidated: it can never be read again, and the rows it missed are polled.
// It says whether it created one.
func (p *Publisher) ensureSlot(ctx context.Context, conn *pgconn.PgConn) (bool, error) {
	st, err := p.readSlot(ctx)
	if err != nil {
		return false, err
	}
	if st.Exists && st.WALStatus == "lost" {
		p.slotLost("invalidated (wal_status lost)")
		if err := pglogrepl.DropReplicationSlot(ctx, conn, p.o.Slot, pglogrepl.DropReplicationSlotOptions{}); err != nil {
			return false, fmt.Errorf("outboxpglog: drop invalidated slot: %w", err)
		}
		st.Exists = false
	}
	if st.Exists {
		return false, nil
	}
	if p.hadSlot.Load() {
		p.slotLost("dropped")
	}
	_, err = pglogrepl.CreateReplicationSlot(ctx, conn, p.o.Slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOEXPORT_SNAPSHOT"})
	var pe *pgconn.PgError
	created := false
	switch {
	case err == nil:
		created = true
		p.log.Info("outboxpglog: created replication slot", "slot", p.o.Slot)
	case errors.As(err, &pe) && pe.Code == "42710": // another replica created it first
	case errors.As(err, &pe) && pe.Code == "53400": // configuration_limit_exceeded
		return false, &SetupError{Problem: "cannot create slot " + p.o.Slot + ": every replication slot is in use",
			Fix: "raise max_replication_slots (a restart), or drop a slot nobody reads", Err: err}
	default:
		return false, fmt.Errorf("outboxpglog: create slot: %w", err)
	}
	if p.lostReported.Swap(false) {
		// Counted once the slot exists again: a row committed after SlotResets went up is
		// read from the log, not left to polling.
		p.stats.slotResets.Add(1)
	}
	p.settled.Store(0) // a new slot's positions owe nothing to the old one's
	return created, nil
}

// readLag reads how far the slot is behind the server's WAL, into the stats.
func (p *Publisher) readLag(ctx context.Context) error {
	st, err := p.readSlot(ctx)
	switch {
	case err != nil:
		return err
	case !st.Exists:
		return fmt.Errorf("%w: slot %s was dropped", ErrSlotLost, p.o.Slot)
	}
	p.stats.lagBytes.Store(st.LagBytes)
	p.stats.retainedBytes.Store(st.RetainedWALBytes)
	p.stats.setWALStatus(st.WALStatus)
	if st.WALStatus == "unreserved" && !p.unreservedWarned.Swap(true) {
		p.log.Error("outboxpglog: the slot holds more WAL than max_slot_wal_keep_size allows and will be invalidated at the next checkpoint unless it catches up",
			"slot", p.o.Slot, "lag_bytes", st.LagBytes, "retained_bytes", st.RetainedWALBytes)
	} else if st.WALStatus != "unreserved" {
		p.unreservedWarned.Store(false)
	}
	if st.WALStatus == "lost" {
		return fmt.Errorf("%w: slot %s was invalidated (max_slot_wal_keep_size)", ErrSlotLost, p.o.Slot)
	}
	return nil
}

// DropSlot drops the Publisher's replication slot and publication, for a table that goes
// back to polling only: a slot that nobody reads holds the server's WAL back for ever.
// Stop Run first: a slot still in use is dropped once its reader lets it go, which a
// stopped reader's server process does a moment after Run returns. Missing ones are no
// error. Rows still leased to the log's reader are polled once their leases run out.
func (p *Publisher) DropSlot(ctx context.Context) error {
	_, err := p.drop(ctx, true)
	return err
}
