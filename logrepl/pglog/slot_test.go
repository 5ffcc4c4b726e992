package outboxpglog

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
)

// poll runs a polling Publisher of the bundle's store until the test ends and returns it.
func (b *bundle) poll(t *testing.T) *outbox.Publisher {
	t.Helper()
	pp, err := outbox.NewPublisher(b.store, b.tr, outbox.PublisherOptions{Scope: outbox.Scope{Namespace: "orders"},
		PollInterval: 20 * time.Millisecond, Lease: time.Minute, Logger: quiet})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- pp.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return pp
}

// slot returns the slot's confirmed position and wal_status.
func (b *bundle) slot(t *testing.T, name string) (confirmed, walStatus string) {
	t.Helper()
	var c, w sql.NullString
	err := b.db.QueryRowContext(b.ctx, `SELECT confirmed_flush_lsn::text, wal_status FROM pg_replication_slots WHERE slot_name = $1`, name).Scan(&c, &w)
	if errors.Is(err, sql.ErrNoRows) {
		return "", ""
	}
	require.NoError(t, err)
	return c.String, w.String
}

// TestSlotDroppedRecoveredByPolling: a slot dropped while its publisher was stopped is
// reported once and created again; the rows committed while there was no slot are
// delivered by polling when their leases run out, the rows after it by the log, none by both.
func TestSlotDroppedRecoveredByPolling(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	pp := b.poll(t)
	lp := b.publisher(t, Options{Slot: "dropped_slot"})
	stop := b.start(t, lp)
	before := b.enqueue(t, msgs(0, 5)...)
	b.waitDelivered(t, "the log delivers the first rows", before)
	require.NoError(t, stop())

	b.wait(t, "the stopped reader's walsender lets the slot go", func() bool {
		var active bool
		return b.db.QueryRowContext(b.ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = 'dropped_slot'`).Scan(&active) == nil && !active
	})
	_, err := b.db.ExecContext(b.ctx, `SELECT pg_drop_replication_slot('dropped_slot')`)
	require.NoError(t, err)
	gap := b.enqueueOn(t, b.storeWith(t, outbox.MinLogLease), msgs(10, 5)...)
	b.start(t, lp)
	require.Equal(t, int64(1), lp.Stats().SlotResets, "the loss is reported once")
	after := b.enqueue(t, msgs(20, 5)...)

	all := append(append(append([]uuid.UUID(nil), before...), gap...), after...)
	b.waitDelivered(t, "every row is delivered", all)
	b.wait(t, "both publishers counted their settles", func() bool {
		return lp.Stats().Delivered+pp.Stats().Delivered == int64(len(all))
	})
	require.Equal(t, int64(10), lp.Stats().Delivered, "the log delivers what its slots saw")
	require.Equal(t, int64(5), pp.Stats().Delivered, "polling delivers the gap")
	require.Zero(t, lp.Stats().LeaseLost+pp.Stats().LeaseLost)
	require.Equal(t, int64(1), lp.Stats().SlotResets)
}

// TestSlotInvalidatedRecovered: a slot that fell max_slot_wal_keep_size behind while its
// publisher was stopped (wal_status lost) is reported, dropped and created again, and
// polling delivers the rows it missed.
func TestSlotInvalidatedRecovered(t *testing.T) {
	// A server of its own: a slot of another test would be invalidated as well.
	keep := serverWith(t, "wal_level=logical", "max_slot_wal_keep_size=1MB")
	leakCheck(t)
	b := setupOn(t, keep, time.Minute)
	pp := b.poll(t)
	lp := b.publisher(t, Options{Slot: "lost_slot"})
	stop := b.start(t, lp)
	require.NoError(t, stop())

	exec := func(q string) {
		t.Helper()
		_, err := b.db.ExecContext(b.ctx, q)
		require.NoError(t, err, q)
	}
	gap := b.enqueueOn(t, b.storeWith(t, outbox.MinLogLease), msgs(0, 5)...)
	exec(`CREATE TABLE filler (x text)`)
	b.wait(t, "the slot is invalidated", func() bool {
		exec(`INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 100)`)
		exec(`SELECT pg_switch_wal()`)
		exec(`CHECKPOINT`)
		_, status := b.slot(t, "lost_slot")
		return status == "lost"
	})

	b.start(t, lp)
	require.Equal(t, int64(1), lp.Stats().SlotResets)
	_, status := b.slot(t, "lost_slot")
	require.NotEqual(t, "lost", status, "created again")
	after := b.enqueue(t, msgs(10, 5)...)
	b.wait(t, "every row is delivered", func() bool { return b.allDelivered(t, append(gap, after...)) })
	b.wait(t, "both publishers counted their settles", func() bool {
		return lp.Stats().Delivered+pp.Stats().Delivered == 10
	})
	require.Equal(t, int64(5), pp.Stats().Delivered, "polling delivers what the lost slot missed")
	require.Equal(t, int64(5), lp.Stats().Delivered)
}

// TestStandbyTakesOver: a second publisher of the same slot stands by while the first
// reads it, delivers nothing meanwhile, and takes over when the first stops.
func TestStandbyTakesOver(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	first := b.publisher(t, Options{Slot: "standby_slot"})
	stopFirst := b.start(t, first)
	second := b.publisher(t, Options{Slot: "standby_slot"})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- second.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	b.wait(t, "the second stands by", func() bool { return second.Stats().Standby })

	one := b.enqueue(t, msgs(0, 5)...)
	b.waitDelivered(t, "the first delivers", one)
	require.False(t, second.Stats().Reading)
	require.NoError(t, stopFirst())

	b.wait(t, "the second takes over", func() bool { return second.Stats().Reading })
	two := b.enqueue(t, msgs(10, 5)...)
	b.wait(t, "the second delivers", func() bool { return b.allDelivered(t, two) && second.Stats().Delivered == 5 })
	require.Equal(t, int64(5), first.Stats().Delivered)
	require.Equal(t, int64(5), second.Stats().Delivered)
	require.False(t, second.Stats().Standby)
}

// TestIdleTableDoesNotHoldWAL: with no outbox rows while the database is busy elsewhere,
// the slot's confirmed position still advances (heartbeats and keepalives), and the
// publisher reports the slot's lag.
func TestIdleTableDoesNotHoldWAL(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	lp := b.publisher(t, Options{Slot: "idle_slot", StatusInterval: 20 * time.Millisecond, HeartbeatInterval: 20 * time.Millisecond})
	b.start(t, lp)
	_, err := b.db.ExecContext(b.ctx, `CREATE TABLE busy (x text)`)
	require.NoError(t, err)
	_, err = b.db.ExecContext(b.ctx, `INSERT INTO busy SELECT repeat('x', 100) FROM generate_series(1, 5000)`)
	require.NoError(t, err)
	var after string
	require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&after))
	b.wait(t, "the slot confirms past the busy table's WAL", func() bool {
		var past bool
		err := b.db.QueryRowContext(b.ctx, `SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = 'idle_slot'`, after).Scan(&past)
		return err == nil && past
	})
	b.wait(t, "the lag is reported", func() bool { return lp.Stats().WALStatus == "reserved" })
	st := lp.Stats()
	require.GreaterOrEqual(t, st.SlotLagBytes, int64(0))
	require.Positive(t, st.RetainedWALBytes)
	require.Positive(t, st.ConfirmedLSN)
	require.Zero(t, st.Delivered)
}

// TestSetupErrors: a server without wal_level=logical is a *SetupError that Run returns
// at once, naming the fix; bad options are refused by New.
func TestSetupErrors(t *testing.T) {
	replica := serverWith(t, "wal_level=replica") // before leakCheck: it lives as long as the package's tests
	leakCheck(t)
	dsn := replica.database(t)
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer db.Close()
	store, err := outbox.New(db, outbox.Postgres(), outbox.Options{LogLease: time.Minute})
	require.NoError(t, err)
	p, err := New(store, newRecorder(), Options{ConnString: dsn, Scope: outbox.Scope{Namespace: "orders"}, Logger: quiet})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var se *SetupError
	require.ErrorAs(t, p.Run(ctx), &se)
	require.Contains(t, se.Error(), "wal_level = logical")

	ok := Options{ConnString: dsn, Scope: outbox.Scope{Namespace: "orders"}}
	for name, o := range map[string]func(*Options){
		"no ConnString":   func(o *Options) { o.ConnString = "" },
		"bad ConnString":  func(o *Options) { o.ConnString = "port=notaport" },
		"no Namespace":    func(o *Options) { o.Namespace = "" },
		"bad Slot":        func(o *Options) { o.Slot = "Bad-Slot" },
		"big BatchSize":   func(o *Options) { o.BatchSize = outbox.MaxBatch + 1 },
		"SkipDead alone":  func(o *Options) { o.OrderedSkipDead = true },
		"tiny Status":     func(o *Options) { o.StatusInterval = time.Microsecond },
		"negative Delays": func(o *Options) { o.RetryPolicy.BaseDelay = -time.Second },
	} {
		bad := ok
		o(&bad)
		_, err := New(store, newRecorder(), bad)
		require.ErrorIs(t, err, ErrInvalid, name)
	}
	_, err = New(nil, newRecorder(), ok)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = New(store, nil, ok)
	require.ErrorIs(t, err, ErrInvalid)
	sqlite, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	require.NoError(t, err)
	_, err = New(sqlite, newRecorder(), ok)
	require.ErrorIs(t, err, ErrInvalid, "log delivery needs PostgreSQL")
}

// TestServerRestart: after a clean restart and after a crash of the server, the publisher
// reconnects and delivers the rows committed while it was away, from its slot; nothing
// is lost and nothing settled twice.
func TestServerRestart(t *testing.T) {
	// A server of its own, which this test stops and starts.
	srv := serverWith(t, "wal_level=logical", "cluster_name=restarts")
	leakCheck(t)
	b := setupOn(t, srv, time.Minute)
	lp := b.publisher(t, Options{Slot: "restart_slot", StatusInterval: 20 * time.Millisecond})
	b.start(t, lp)
	var all []uuid.UUID
	for round, crash := range []bool{false, true} {
		ids := b.enqueue(t, msgs(100*round, 5)...)
		all = append(all, ids...)
		b.waitDelivered(t, "the rows before the restart are delivered", ids)
		srv.restart(t, crash)
		// Committed while the publisher reconnects, or before it does.
		b.wait(t, "the pool reaches the server again", func() bool { return b.db.PingContext(b.ctx) == nil })
		all = append(all, b.enqueue(t, msgs(100*round+50, 5)...)...)
		b.waitDelivered(t, "the rows after the restart are delivered", all)
	}
	b.wait(t, "the publisher counts its settles", func() bool { return lp.Stats().Delivered >= int64(len(all)) })
	st := lp.Stats()
	require.Equal(t, int64(len(all)), st.Delivered, "each row settled once")
	require.Zero(t, st.SlotResets)
	// Before PostgreSQL 17 a restart keeps the slot's position as of its last checkpoint,
	// so the server sends the rows after it again: the publisher knows it settled them.
	require.Zero(t, st.LeaseLost, "nothing settled twice")
	require.ElementsMatch(t, all, deliveredIDs(b.tr.deliveries()), "each row published once")
}

// TestDropSlot: DropSlot removes the slot and the publication, and is no error when they
// are gone already.
func TestDropSlot(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	lp := b.publisher(t, Options{Slot: "drop_me"})
	stop := b.start(t, lp)
	require.NoError(t, stop())
	b.wait(t, "the stopped reader's walsender lets the slot go", func() bool {
		var active bool
		return b.db.QueryRowContext(b.ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = 'drop_me'`).Scan(&active) == nil && !active
	})
	require.NoError(t, lp.DropSlot(b.ctx))
	c, _ := b.slot(t, "drop_me")
	require.Empty(t, c, "the slot is gone")
	var pubs int
	require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT count(*) FROM pg_publication WHERE pubname = 'drop_me'`).Scan(&pubs))
	require.Zero(t, pubs, "the publication is gone")
	require.NoError(t, lp.DropSlot(b.ctx), "dropping again is no error")
}
