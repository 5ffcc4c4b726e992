package outboxpglog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxgo/outbox"
)

// This file holds what an operator does with the server's objects without running a
// Publisher: read the table's slots, and set them up or drop them ahead of time.

// ErrSlotActive is matched by the error of [Drop] when a reader streams the slot: the
// server would end that reader's session, and the slot would be created again by its Run.
var ErrSlotActive = errors.New("outboxpglog: replication slot is active")

// Slot is a replication slot as pg_replication_slots shows it.
type Slot struct {
	Name string
	// Exists is false for a slot named to [Slots] that the server does not have; the
	// other fields are then zero.
	Exists bool
	// Active is whether a reader streams the slot now, from server process ActivePID.
	Active    bool
	ActivePID int
	// LagBytes is how far the slot's confirmed position (confirmed_flush_lsn) is behind
	// the server's WAL (pg_current_wal_lsn()), and RetainedWALBytes how much WAL it keeps
	// from being recycled (from its restart_lsn).
	LagBytes, RetainedWALBytes int64
	// WALStatus is reserved, extended, unreserved (to be invalidated at the next
	// checkpoint unless it catches up) or lost.
	WALStatus string
	// Invalidated is why the server invalidated the slot, which can then never be read
	// again (PostgreSQL 17's invalidation_reason; "wal_removed" for a lost slot before
	// it); empty for a usable slot.
	Invalidated string
}

// Changes names the slot and the publication that [Setup] or [Drop] worked on, and says
// which of them it created or dropped: false for one that was there already, or gone.
type Changes struct {
	Slot, Publication               string
	SlotChanged, PublicationChanged bool
}

// admin returns a Publisher that only sets up, drops or reads: o with its defaults, with
// the names checked, and ConnString too when the replication connection is needed.
func admin(store *outbox.Store, o Options, conn bool) (*Publisher, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalid)
	}
	if store.Dialect().Name() != "postgres" {
		return nil, fmt.Errorf("%w: the store's dialect is %s; log delivery needs PostgreSQL", ErrInvalid, store.Dialect().Name())
	}
	o = o.withDefaults(store)
	switch {
	case !slotName.MatchString(o.Slot):
		return nil, fmt.Errorf("%w: Slot %q: use lowercase letters, digits and underscores, at most 63 bytes", ErrInvalid, o.Slot)
	case !slotName.MatchString(o.Publication):
		return nil, fmt.Errorf("%w: Publication %q: use lowercase letters, digits and underscores, at most 63 bytes", ErrInvalid, o.Publication)
	}
	if conn {
		if o.ConnString == "" {
			return nil, fmt.Errorf("%w: ConnString is empty", ErrInvalid)
		}
		if _, err := pgconn.ParseConfig(o.ConnString); err != nil {
			return nil, fmt.Errorf("%w: ConnString: %w", ErrInvalid, err)
		}
	}
	return &Publisher{store: store, o: o, log: o.Logger}, nil
}

// Slots returns the replication slots of store's table: with names, those slots (one the
// server does not have with Exists false); without, the slot a Publisher of the table
// reads by default, if the server has it, and every slot of the store's database named
// like a publication of the table (a Publisher's Publication defaults to its Slot), such as
// the slots of Publishers of other scopes. It needs no privilege beyond connecting.
func Slots(ctx context.Context, store *outbox.Store, names ...string) ([]Slot, error) {
	p, err := admin(store, Options{}, false)
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return readSlots(ctx, store.DB(), p.o.Slot, p.qualifiedTable())
	}
	out := make([]Slot, 0, len(names))
	for _, name := range names {
		got, err := readSlots(ctx, store.DB(), name, "")
		if err != nil {
			return nil, err
		}
		if len(got) == 0 {
			got = []Slot{{Name: name}}
		}
		out = append(out, got[0])
	}
	return out, nil
}

// Setup creates the publication and the slot that a Publisher made with store and o
// reads (o.Slot, o.Publication and o.ConnString; the rest is ignored), ahead of its first
// Run, for a deployment whose readers' role may not create them. What exists is left as it
// is, so Setup may run again; an invalidated slot is created again, as Run would.
//
// It checks what the server and the role lack before it changes anything, and returns a
// [*SetupError] naming it: wal_level = logical, the REPLICATION attribute for o.ConnString's
// role, CREATE on the database and ownership of the table for the publication (on the
// Store's pool), a free replication slot. A publication it created is dropped again when
// the slot cannot be made. The slot holds WAL back from the moment it exists, whether or
// not a reader ever runs: start the reader soon after, or [Drop] it.
func Setup(ctx context.Context, store *outbox.Store, o Options) (Changes, error) {
	p, err := admin(store, o, true)
	if err != nil {
		return Changes{}, err
	}
	ch := Changes{Slot: p.o.Slot, Publication: p.o.Publication}
	if err := checkWALLevel(ctx, store.DB()); err != nil {
		return ch, err
	}
	conn, err := p.connect(ctx)
	if err != nil {
		return ch, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if ch.PublicationChanged, err = p.ensurePublication(ctx); err != nil {
		return ch, err
	}
	if ch.SlotChanged, err = p.ensureSlot(ctx, conn); err != nil {
		if ch.PublicationChanged {
			if _, derr := store.DB().ExecContext(context.WithoutCancel(ctx), `DROP PUBLICATION IF EXISTS `+quoteIdent(p.o.Publication)); derr == nil {
				ch.PublicationChanged = false
			}
		}
		return ch, err
	}
	return ch, nil
}

// Drop drops the slot and the publication that a Publisher made with store and o reads
// (o.Slot, o.Publication and o.ConnString), for a table that goes back to polling only: a
// slot that nobody reads holds the server's WAL back for ever. It refuses, changing
// nothing, a slot that a reader streams ([ErrSlotActive]: stop the reader first), and
// returns a [*SetupError] when o.ConnString's role lacks the REPLICATION attribute or the
// Store's role does not own the publication. Missing ones are no error. Rows still leased
// to the log's reader are polled once their leases run out.
func Drop(ctx context.Context, store *outbox.Store, o Options) (Changes, error) {
	p, err := admin(store, o, true)
	if err != nil {
		return Changes{}, err
	}
	return p.drop(ctx, false)
}

// drop drops the slot and the publication. With wait, a slot in use is dropped once its
// reader lets it go; without, it is refused. The publication is dropped in a transaction
// that commits only once the slot is gone, so a refusal changes nothing.
func (p *Publisher) drop(ctx context.Context, wait bool) (Changes, error) {
	ch := Changes{Slot: p.o.Slot, Publication: p.o.Publication}
	st, err := p.readSlot(ctx)
	if err != nil {
		return ch, err
	}
	if st.Active && !wait {
		return ch, p.activeError(st.ActivePID)
	}
	conn, err := p.connect(ctx)
	if err != nil {
		return ch, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tx, err := p.store.DB().BeginTx(ctx, nil)
	if err != nil {
		return ch, fmt.Errorf("outboxpglog: drop publication: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var one int
	switch err := tx.QueryRowContext(ctx, `SELECT 1 FROM pg_publication WHERE pubname = $1`, p.o.Publication).Scan(&one); {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return ch, fmt.Errorf("outboxpglog: read publication: %w", err)
	default:
		_, err := tx.ExecContext(ctx, `DROP PUBLICATION `+quoteIdent(p.o.Publication))
		if isCode(err, "42501") {
			return ch, &SetupError{Problem: "cannot drop publication " + p.o.Publication,
				Fix: "drop it as its owner (the table's owner who created it) or a superuser", Err: err}
		}
		if err != nil {
			return ch, fmt.Errorf("outboxpglog: drop publication: %w", err)
		}
		ch.PublicationChanged = true
	}
	err = pglogrepl.DropReplicationSlot(ctx, conn, p.o.Slot, pglogrepl.DropReplicationSlotOptions{Wait: wait})
	switch {
	case err == nil:
		ch.SlotChanged = true
	case isCode(err, "42704"): // undefined_object: there was none
	case isCode(err, "55006"): // object_in_use: a reader started since the check
		ch.PublicationChanged = false
		return ch, p.activeError(0)
	default:
		ch.PublicationChanged = false
		return ch, fmt.Errorf("outboxpglog: drop slot: %w", err)
	}
	if err := tx.Commit(); err != nil {
		ch.PublicationChanged = false
		return ch, fmt.Errorf("outboxpglog: drop publication: %w", err)
	}
	return ch, nil
}

func (p *Publisher) activeError(pid int) error {
	by := "a reader"
	if pid != 0 {
		by = fmt.Sprintf("server process %d", pid)
	}
	return fmt.Errorf("%w: %s streams slot %s; stop its reader first (nothing was dropped)", ErrSlotActive, by, p.o.Slot)
}
