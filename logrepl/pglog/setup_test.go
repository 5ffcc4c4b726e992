package outboxpglog

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// names returns the slots' names.
func names(slots []Slot) []string {
	out := []string{}
	for _, s := range slots {
		out = append(out, s.Name)
	}
	return out
}

// TestSetupSlotsDrop: Setup creates the publication and the slot a Publisher reads, and
// finds them the second time; Slots lists the table's slots, the default one and another
// scope's (named like a publication of the table), and not another table's; Drop refuses
// an active slot, changing nothing, and drops an idle one with its publication.
func TestSetupSlotsDrop(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	o := Options{ConnString: b.dsn, Logger: quiet}
	slots, err := Slots(b.ctx, b.store)
	require.NoError(t, err)
	require.Empty(t, slots)

	ch, err := Setup(b.ctx, b.store, o)
	require.NoError(t, err)
	require.Equal(t, Changes{Slot: "outbox_outbox_events", Publication: "outbox_outbox_events", SlotChanged: true, PublicationChanged: true}, ch)
	ch, err = Setup(b.ctx, b.store, o)
	require.NoError(t, err)
	require.False(t, ch.SlotChanged || ch.PublicationChanged, "a second Setup finds both")
	scoped := o
	scoped.Slot = "billing_scope"
	_, err = Setup(b.ctx, b.store, scoped)
	require.NoError(t, err)
	_, err = b.db.ExecContext(b.ctx, `CREATE TABLE other (x int); CREATE PUBLICATION other_pub FOR TABLE other`)
	require.NoError(t, err)
	_, err = b.db.ExecContext(b.ctx, `SELECT pg_create_logical_replication_slot('other_pub', 'pgoutput')`)
	require.NoError(t, err)

	slots, err = Slots(b.ctx, b.store)
	require.NoError(t, err)
	require.Equal(t, []string{"billing_scope", "outbox_outbox_events"}, names(slots), "the table's slots, not another table's")
	for _, s := range slots {
		require.True(t, s.Exists)
		require.False(t, s.Active)
		require.Equal(t, "reserved", s.WALStatus)
		require.Empty(t, s.Invalidated)
	}
	slots, err = Slots(b.ctx, b.store, "other_pub", "nosuch")
	require.NoError(t, err)
	require.Equal(t, []Slot{slots[0], {Name: "nosuch"}}, slots, "named slots, one the server lacks")
	require.True(t, slots[0].Exists)

	lp := b.publisher(t, Options{})
	stop := b.start(t, lp)
	_, err = Drop(b.ctx, b.store, o)
	require.ErrorIs(t, err, ErrSlotActive)
	slots, err = Slots(b.ctx, b.store, "outbox_outbox_events")
	require.NoError(t, err)
	require.True(t, slots[0].Exists && slots[0].Active, "the refused Drop left the slot")
	var pubs int
	require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT count(*) FROM pg_publication WHERE pubname = 'outbox_outbox_events'`).Scan(&pubs))
	require.Equal(t, 1, pubs, "and the publication")

	require.NoError(t, stop())
	b.wait(t, "Drop once the stopped reader's walsender let the slot go", func() bool {
		ch, err = Drop(b.ctx, b.store, o)
		return err == nil
	})
	require.Equal(t, Changes{Slot: "outbox_outbox_events", Publication: "outbox_outbox_events", SlotChanged: true, PublicationChanged: true}, ch)
	slots, err = Slots(b.ctx, b.store)
	require.NoError(t, err)
	require.Equal(t, []string{"billing_scope"}, names(slots))
	ch, err = Drop(b.ctx, b.store, o)
	require.NoError(t, err)
	require.False(t, ch.SlotChanged || ch.PublicationChanged, "dropping again is no error")
}

// TestSetupChangesNothingOnFailure: when the slot cannot be made (every slot in use),
// Setup names the setting and drops the publication it had created.
func TestSetupChangesNothingOnFailure(t *testing.T) {
	one := serverWith(t, "wal_level=logical", "max_replication_slots=1")
	leakCheck(t)
	b := setupOn(t, one, time.Minute)
	o := Options{ConnString: b.dsn, Logger: quiet}
	_, err := Setup(b.ctx, b.store, o)
	require.NoError(t, err)
	o.Slot = "second"
	ch, err := Setup(b.ctx, b.store, o)
	var se *SetupError
	require.ErrorAs(t, err, &se)
	require.Contains(t, se.Error(), "raise max_replication_slots")
	require.False(t, ch.PublicationChanged || ch.SlotChanged)
	var pubs int
	require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT count(*) FROM pg_publication WHERE pubname = 'second'`).Scan(&pubs))
	require.Zero(t, pubs, "the publication made for it was dropped again")
}
