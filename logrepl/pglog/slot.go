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

// ensurePublication creates the publication of the table's inserts when it is missing.
func (p *Publisher) ensurePublication(ctx context.Context) error {
	db := p.store.DB()
	var one int
	err := db.QueryRowContext(ctx, `SELECT 1 FROM pg_publication WHERE pubname = $1`, p.o.Publication).Scan(&one)
	if err == nil {
		return nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("outboxpglog: read publication: %w", err)
	}
	t := p.store.Table()
	tbl := quoteIdent(t.Name())
	if t.Schema() != "" {
		tbl = quoteIdent(t.Schema()) + "." + tbl
	}
	_, err = db.ExecContext(ctx, `CREATE PUBLICATION `+quoteIdent(p.o.Publication)+` FOR TABLE `+tbl+` WITH (publish = 'insert')`)
	var pe *pgconn.PgError
	switch {
	case err == nil:
		p.log.Info("outboxpglog: created publication", "publication", p.o.Publication, "table", tbl)
		return nil
	case errors.As(err, &pe) && pe.Code == "42710": // another replica created it first
		return nil
	case errors.As(err, &pe) && pe.Code == "42501":
		return &SetupError{Problem: "cannot create publication " + p.o.Publication,
			Fix: "create it as the table's owner: CREATE PUBLICATION " + p.o.Publication + " FOR TABLE " + tbl + " WITH (publish = 'insert')", Err: err}
	}
	return fmt.Errorf("outboxpglog: create publication: %w", err)
}

// slotState is the slot as pg_replication_slots shows it.
type slotState struct {
	exists    bool
	walStatus string // PostgreSQL 13+: reserved, extended, unreserved or lost
}

func (p *Publisher) readSlot(ctx context.Context) (slotState, error) {
	var st slotState
	var status sql.NullString
	err := p.store.DB().QueryRowContext(ctx,
		`SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1`, p.o.Slot).Scan(&status)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return st, nil
	case err != nil:
		return st, fmt.Errorf("outboxpglog: read slot: %w", err)
	}
	st.exists, st.walStatus = true, status.String
	return st, nil
}

// ensureSlot creates the slot when it is missing, and drops and creates again one that
// the server invalidated: it can never be read again, and the rows it missed are polled.
func (p *Publisher) ensureSlot(ctx context.Context, conn *pgconn.PgConn) error {
	st, err := p.readSlot(ctx)
	if err != nil {
		return err
	}
	if st.exists && st.walStatus == "lost" {
		p.slotLost("invalidated (wal_status lost)")
		if err := pglogrepl.DropReplicationSlot(ctx, conn, p.o.Slot, pglogrepl.DropReplicationSlotOptions{}); err != nil {
			return fmt.Errorf("outboxpglog: drop invalidated slot: %w", err)
		}
		st.exists = false
	}
	if st.exists {
		return nil
	}
	if p.hadSlot.Load() {
		p.slotLost("dropped")
	}
	_, err = pglogrepl.CreateReplicationSlot(ctx, conn, p.o.Slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOEXPORT_SNAPSHOT"})
	var pe *pgconn.PgError
	switch {
	case err == nil:
		p.log.Info("outboxpglog: created replication slot", "slot", p.o.Slot)
	case errors.As(err, &pe) && pe.Code == "42710": // another replica created it first
	default:
		return fmt.Errorf("outboxpglog: create slot: %w", err)
	}
	p.lostReported.Store(false)
	p.settled.Store(0) // a new slot's positions owe nothing to the old one's
	return nil
}

// readLag reads how far the slot is behind the server's WAL, into the stats.
func (p *Publisher) readLag(ctx context.Context) error {
	var lag, retained sql.NullInt64
	var status sql.NullString
	err := p.store.DB().QueryRowContext(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint,`+
		` pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, wal_status FROM pg_replication_slots WHERE slot_name = $1`,
		p.o.Slot).Scan(&lag, &retained, &status)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("%w: slot %s was dropped", ErrSlotLost, p.o.Slot)
	case err != nil:
		return err
	}
	p.stats.lagBytes.Store(lag.Int64)
	p.stats.retainedBytes.Store(retained.Int64)
	p.stats.setWALStatus(status.String)
	if status.String == "unreserved" && !p.unreservedWarned.Swap(true) {
		p.log.Error("outboxpglog: the slot holds more WAL than max_slot_wal_keep_size allows and will be invalidated at the next checkpoint unless it catches up",
			"slot", p.o.Slot, "lag_bytes", lag.Int64, "retained_bytes", retained.Int64)
	} else if status.String != "unreserved" {
		p.unreservedWarned.Store(false)
	}
	if status.String == "lost" {
		return fmt.Errorf("%w: slot %s was invalidated (max_slot_wal_keep_size)", ErrSlotLost, p.o.Slot)
	}
	return nil
}

// DropSlot drops the Publisher's replication slot and publication, for a table that goes
// back to polling only: a slot that nobody reads holds the server's WAL back for ever.
// Stop Run first: the server refuses to drop a slot in use. Missing ones are no error.
// Rows still leased to the log's reader are polled once their leases run out.
func (p *Publisher) DropSlot(ctx context.Context) error {
	conn, err := p.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	err = pglogrepl.DropReplicationSlot(ctx, conn, p.o.Slot, pglogrepl.DropReplicationSlotOptions{Wait: true})
	var pe *pgconn.PgError
	if err != nil && !(errors.As(err, &pe) && pe.Code == "42704") {
		return fmt.Errorf("outboxpglog: drop slot: %w", err)
	}
	if _, err := p.store.DB().ExecContext(ctx, `DROP PUBLICATION IF EXISTS `+quoteIdent(p.o.Publication)); err != nil {
		return fmt.Errorf("outboxpglog: drop publication: %w", err)
	}
	return nil
}
