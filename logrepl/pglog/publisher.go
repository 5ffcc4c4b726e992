package outboxpglog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outboxgo/outbox"
)

// Publisher delivers the rows a Store with outbox.Options.LogLease inserts, read from a
// logical replication slot. Run it beside polling publishers on the same table: they
// never both own a row (see the package documentation). One Publisher reads a slot at a
// time; others started on the same slot stand by until it is free.
type Publisher struct {
	store *outbox.Store
	tr    outbox.Transport
	// keyOrder is whether tr keeps the order of a key's messages in one batch, so that an
	// ordered Publisher hands it each key's rows together.
	keyOrder bool
	o        Options
	log      *slog.Logger
	stats    stats
	running  atomic.Bool
	// kill, set by tests, ends a session at once at the named point, as a crash there
	// would: nothing settled or confirmed after it.
	kill func(point string) bool
	// invisible, set by tests, makes settles miss the rows it names, as they miss rows
	// not visible yet to other sessions; patience is unseenPatience, shorter in tests.
	invisible func(id uuid.UUID) bool
	patience  time.Duration
	// statuses counts the standby status updates sent, and unseenRetries the settles
	// that left outcomes carried for rows not yet visible, for tests to wait on.
	statuses, unseenRetries atomic.Int64
	// hadSlot is set once the Publisher read its slot: a missing slot after that was
	// dropped. lostReported keeps a loss reported once until the slot is created again.
	hadSlot, lostReported atomic.Bool
	// unreservedWarned keeps the warning that the slot is about to be lost to one per episode.
	unreservedWarned atomic.Bool
	// settled is the end of the last transaction whose outcomes this Publisher committed,
	// across its sessions: a server that restarts may send them again (before PostgreSQL 17
	// it keeps a slot's position as of its last checkpoint), and they need no second publish.
	settled atomic.Uint64
	// history names the server's WAL history (system id and timeline) that settled is a
	// position in; after a failover positions start over, and so does settled.
	history atomic.Pointer[string]
}

// New returns a Publisher of store's rows to tr. It checks the options only; Run connects.
func New(store *outbox.Store, tr outbox.Transport, o Options) (*Publisher, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalid)
	}
	if tr == nil {
		return nil, fmt.Errorf("%w: transport is nil", ErrInvalid)
	}
	if store.Dialect().Name() != "postgres" {
		return nil, fmt.Errorf("%w: the store's dialect is %s; log delivery needs PostgreSQL", ErrInvalid, store.Dialect().Name())
	}
	o = o.withDefaults(store)
	if err := o.validate(); err != nil {
		return nil, err
	}
	if _, err := pgconn.ParseConfig(o.ConnString); err != nil {
		return nil, fmt.Errorf("%w: ConnString: %w", ErrInvalid, err)
	}
	ko, _ := tr.(outbox.TransportKeyOrder)
	return &Publisher{store: store, tr: tr, o: o, log: o.Logger, keyOrder: ko != nil && ko.KeepsKeyOrder(), patience: unseenPatience}, nil
}

// Slot returns the name of the Publisher's replication slot.
func (p *Publisher) Slot() string { return p.o.Slot }

// errKilled ends a session that a test killed.
var errKilled = errors.New("outboxpglog: killed by test")

// Run reads the slot and delivers until ctx ends, then returns nil. It sets up what is
// missing (publication, slot), reconnects after a lost connection, stands by while
// another reader holds the slot, and creates the slot again after it was dropped or
// invalidated (reported once each time, and counted in [Stats]). It returns a
// [*SetupError] for what only the server's administrator can fix (wal_level, the
// REPLICATION attribute).
func (p *Publisher) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return errors.New("outboxpglog: Run is already running")
	}
	defer p.running.Store(false)
	standing := false
	for {
		err := p.session(ctx)
		var se *SetupError
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.As(err, &se), errors.Is(err, errKilled):
			return err
		case isCode(err, "55006"): // object_in_use: another reader has the slot
			p.stats.standby.Store(true)
			if !standing {
				p.log.Info("outboxpglog: another reader holds the slot; standing by", "slot", p.o.Slot)
				standing = true
			}
		default:
			standing = false
			p.stats.standby.Store(false)
			p.log.Warn("outboxpglog: session ended; reconnecting", "slot", p.o.Slot, "err", err, "retry_in", p.o.RetryDelay)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(p.o.RetryDelay):
		}
	}
}

func isCode(err error, code string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == code
}

// connect opens a replication connection.
func (p *Publisher) connect(ctx context.Context) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(p.o.ConnString)
	if err != nil {
		return nil, fmt.Errorf("%w: ConnString: %w", ErrInvalid, err)
	}
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if isCode(err, "42501") || isCode(err, "28000") {
		return nil, &SetupError{Problem: "the role cannot open a replication connection",
			Fix: "give it the REPLICATION attribute (ALTER ROLE ... REPLICATION) and allow it in pg_hba.conf", Err: err}
	}
	if err != nil {
		return nil, fmt.Errorf("outboxpglog: connect: %w", err)
	}
	return conn, nil
}

// slotLost reports, once per loss, that the slot is gone and polling recovers its rows.
func (p *Publisher) slotLost(why string) {
	if p.lostReported.Swap(true) {
		return
	}
	p.log.Error("outboxpglog: replication slot lost; rows committed meanwhile are delivered by polling once their leases run out, and the slot is created again",
		"slot", p.o.Slot, "why", why)
}

// item is what the reader hands the deliverer: a committed transaction's rows that the
// log's reader owns (none for a position alone), and the position confirmed once they
// are settled.
type item struct {
	rows   []outbox.Record
	end    pglogrepl.LSN
	commit time.Time // zero for a position alone
}

// session is one replication connection's life: a reader that owns the connection, a
// deliverer that publishes and settles, and a heartbeat.
type session struct {
	p         *Publisher
	conn      *pgconn.PgConn
	dec       *decoder
	items     chan item
	confirmed atomic.Uint64 // the position every outcome before which is committed
}

func (p *Publisher) session(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := checkWALLevel(ctx, p.store.DB()); err != nil {
		return err
	}
	if _, err := p.ensurePublication(ctx); err != nil {
		return err
	}
	conn, err := p.connect(ctx)
	if err != nil {
		return err
	}
	s := &session{p: p, conn: conn, dec: newDecoder(p.store.Table(), p.o.Scope), items: make(chan item, 64)}
	killed, streaming := false, false
	defer func() {
		if streaming && !killed { // a crash sends nothing more; a shutdown confirms what it settled
			fctx, fcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			_ = s.sendStatus(fctx)
			fcancel()
		}
		_ = conn.Close(context.WithoutCancel(ctx))
	}()
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return fmt.Errorf("outboxpglog: identify system: %w", err)
	}
	if h := fmt.Sprintf("%s/%d", sys.SystemID, sys.Timeline); p.history.Load() == nil || *p.history.Load() != h {
		p.history.Store(&h)
		p.settled.Store(0)
	}
	if _, err := p.ensureSlot(ctx, conn); err != nil {
		return err
	}
	err = pglogrepl.StartReplication(ctx, conn, p.o.Slot, 0, pglogrepl.StartReplicationOptions{PluginArgs: []string{
		"proto_version '1'", "publication_names '" + p.o.Publication + "'", "messages 'true'",
	}})
	if isCode(err, "42704") { // undefined_object: dropped between the check and the start
		p.slotLost("dropped")
		return fmt.Errorf("%w: %w", ErrSlotLost, err)
	}
	if err != nil {
		return fmt.Errorf("outboxpglog: start replication: %w", err)
	}
	streaming = true
	p.hadSlot.Store(true)
	p.stats.standby.Store(false)
	p.stats.reading.Store(true)
	defer p.stats.reading.Store(false)
	p.log.Info("outboxpglog: reading slot", "slot", p.o.Slot, "publication", p.o.Publication)

	errc := make(chan error, 3)
	var wg sync.WaitGroup
	run := func(f func(context.Context) error) {
		wg.Add(1)
		go func() { defer wg.Done(); errc <- f(ctx) }()
	}
	run(s.read)
	run(s.deliver)
	if p.o.HeartbeatInterval > 0 {
		run(s.heartbeat)
	}
	err = <-errc
	cancel()
	wg.Wait()
	killed = errors.Is(err, errKilled)
	return err
}

// read receives the slot's messages, hands each committed transaction to the deliverer
// in commit order, and sends standby status updates with the confirmed position.
func (s *session) read(ctx context.Context) error {
	interval := s.p.o.StatusInterval
	next := time.Now().Add(interval)
	inTx := false
	var cur item
	push := func(it item) error {
		select {
		case s.items <- it:
			return nil
		default:
		}
		for { // the deliverer is behind: keep telling the server we are alive
			t := time.NewTimer(time.Until(next))
			select {
			case s.items <- it:
				t.Stop()
				return nil
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
				if err := s.sendStatus(ctx); err != nil {
					return err
				}
				next = time.Now().Add(interval)
			}
		}
	}
	for {
		if !time.Now().Before(next) {
			if err := s.sendStatus(ctx); err != nil {
				return err
			}
			next = time.Now().Add(interval)
		}
		rctx, rcancel := context.WithDeadline(ctx, next)
		raw, err := s.conn.ReceiveMessage(rctx)
		rcancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) {
				continue
			}
			return fmt.Errorf("outboxpglog: receive: %w", err)
		}
		var data []byte
		switch m := raw.(type) {
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(m)
		case *pgproto3.CopyData:
			data = m.Data
		default:
			continue
		}
		if len(data) == 0 {
			continue
		}
		switch data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
			if err != nil {
				return fmt.Errorf("outboxpglog: keepalive: %w", err)
			}
			if k.ReplyRequested {
				next = time.Time{}
			}
			// Between transactions, everything up to the server's position was sent: a
			// transaction that commits later is sent later, whenever it began.
			if !inTx {
				if err := push(item{end: k.ServerWALEnd}); err != nil {
					return err
				}
			}
		case pglogrepl.XLogDataByteID:
			x, err := pglogrepl.ParseXLogData(data[1:])
			if err != nil {
				return fmt.Errorf("outboxpglog: xlog data: %w", err)
			}
			msg, err := pglogrepl.Parse(x.WALData)
			if err != nil {
				return fmt.Errorf("outboxpglog: pgoutput message: %w", err)
			}
			switch m := msg.(type) {
			case *pglogrepl.RelationMessage:
				s.dec.relation(m)
			case *pglogrepl.BeginMessage:
				inTx, cur = true, item{}
			case *pglogrepl.InsertMessage:
				r, ours, err := s.dec.insert(m)
				if err != nil {
					return err
				}
				if ours {
					cur.rows = append(cur.rows, r)
				}
			case *pglogrepl.CommitMessage:
				inTx = false
				cur.end, cur.commit = m.TransactionEndLSN, m.CommitTime
				s.p.log.Debug("outboxpglog: commit", "end", cur.end, "rows", len(cur.rows))
				if err := push(cur); err != nil {
					return err
				}
				cur = item{}
			case *pglogrepl.LogicalDecodingMessage:
				if !m.Transactional && !inTx { // a heartbeat: a position alone
					if err := push(item{end: m.LSN}); err != nil {
						return err
					}
				}
			}
		}
	}
}

// sendStatus tells the server the confirmed position: it may recycle the WAL before it.
func (s *session) sendStatus(ctx context.Context) error {
	pos := pglogrepl.LSN(s.confirmed.Load())
	if err := pglogrepl.SendStandbyStatusUpdate(ctx, s.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos}); err != nil {
		return fmt.Errorf("outboxpglog: standby status: %w", err)
	}
	s.p.stats.confirmed.Store(uint64(pos))
	s.p.statuses.Add(1)
	return nil
}

// deliver publishes and settles the committed transactions in commit order, a batch at a
// time, and confirms a position only once the outcomes of everything before it are
// committed. Outcomes whose rows were not visible yet to their settle are carried: settled
// again with the next batch's, or on a short timer when none comes, without holding up the
// next batch's publish.
func (s *session) deliver(ctx context.Context) error {
	p := s.p
	c := &carry{}
	var reached pglogrepl.LSN // the end of everything published and settled, or carried
	defer func() {
		// A shutdown, wherever it finds the deliverer, makes one last try for the carried
		// outcomes, as complete does; what stays carried is not confirmed.
		if ctx.Err() != nil && len(c.held) > 0 && p.settle(ctx, c) == nil {
			s.confirm(c.bound(reached))
		}
	}()
	for {
		var it item
		select {
		case it = <-s.items:
		case <-c.due():
			if err := p.settle(ctx, c); err != nil {
				return err
			}
			c.again(2 * c.pause)
			s.confirm(c.bound(reached))
			continue
		case <-ctx.Done():
			return ctx.Err()
		}
		var rows []outbox.Record
		var first time.Time
		end := it.end
		take := func(it item) {
			if uint64(it.end) <= p.settled.Load() {
				return // settled by this Publisher before a reconnect
			}
			rows = append(rows, it.rows...)
			if first.IsZero() {
				first = it.commit
			}
		}
		take(it)
	drain:
		for len(rows) < p.o.BatchSize {
			select {
			case it := <-s.items:
				take(it)
				end = it.end
			default:
				break drain
			}
		}
		if len(rows) > 0 {
			p.log.Debug("outboxpglog: batch", "rows", len(rows), "end", end)
			if err := p.publishAndSettle(ctx, c, reached, rows, first); err != nil {
				return err
			}
			c.again(firstPause)
		}
		if p.kill != nil && p.kill("confirm") {
			return errKilled
		}
		reached = end
		s.confirm(c.bound(reached))
	}
}

// confirm records pos as the position every outcome before which is committed, for the
// next status update, unless it is not past the one recorded.
func (s *session) confirm(pos pglogrepl.LSN) {
	if uint64(pos) > s.confirmed.Load() {
		s.confirmed.Store(uint64(pos))
	}
	if uint64(pos) > s.p.settled.Load() {
		s.p.settled.Store(uint64(pos))
	}
}

// carry holds the outcomes that a settle found no row for yet, because the row was not
// visible to it: the deliverer settles them again with the next batch's outcomes, in the
// same statement, or after pause when no batch comes first.
type carry struct {
	held  []carried
	pause time.Duration
	timer *time.Timer
}

type carried struct {
	outbox.Outcome
	key string // the row's partition key, for ordered delivery
	// safe is the position confirmed before the outcome's batch: the slot must not pass it
	// while the outcome is carried, so that another session reads its transaction again.
	safe pglogrepl.LSN
	// since is when the outcome was first settled; after unseenPatience a row still
	// missing counts as lost.
	since time.Time
}

const (
	firstPause = time.Millisecond
	maxPause   = 100 * time.Millisecond
)

// add puts a batch's outcomes, of chunk's rows, before the settle that writes them.
func (c *carry) add(chunk []outbox.Record, outcomes []outbox.Outcome, safe pglogrepl.LSN) {
	now := time.Now()
	for i, o := range outcomes {
		c.held = append(c.held, carried{Outcome: o, key: chunk[i].PartitionKey, safe: safe, since: now})
	}
}

// bound returns the position that may be confirmed once everything up to reached is
// published: reached, or the position before the oldest carried outcome's batch.
func (c *carry) bound(reached pglogrepl.LSN) pglogrepl.LSN {
	for _, h := range c.held {
		reached = min(reached, h.safe)
	}
	return reached
}

// due returns a channel that fires when the carried outcomes are to be settled again, and
// nil, which never fires, when none are carried.
func (c *carry) due() <-chan time.Time {
	if len(c.held) == 0 {
		return nil
	}
	return c.timer.C
}

// again arms the timer to settle the carried outcomes again after pause, at most maxPause,
// if any are carried.
func (c *carry) again(pause time.Duration) {
	if len(c.held) == 0 {
		return
	}
	c.pause = min(pause, maxPause)
	if c.timer == nil {
		c.timer = time.NewTimer(c.pause)
	} else {
		c.timer.Reset(c.pause)
	}
}

// publishAndSettle hands rows to the transport in batches and settles each batch's
// outcomes, with those carried (c), in one statement under the rows' insert leases; safe
// is the position confirmed before rows. The transport's context ends ShutdownTimeout
// after ctx, so that a shutdown lets the batch in flight finish.
func (p *Publisher) publishAndSettle(ctx context.Context, c *carry, safe pglogrepl.LSN, rows []outbox.Record, committed time.Time) error {
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	context.AfterFunc(ctx, func() {
		t := time.NewTimer(p.o.ShutdownTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-pctx.Done():
		}
	})
	for chunk := range slices.Chunk(rows, p.o.BatchSize) {
		if err := ctx.Err(); err != nil {
			return err // shutting down: the rest stay leased, and are read again or polled
		}
		outcomes := make([]outbox.Outcome, len(chunk))
		deliveries := make([]outbox.Delivery, 0, len(chunk))
		index := make([]int, 0, len(chunk))
		for i, r := range chunk {
			if err := r.Integrity(); err != nil { // never published, as a polling Publisher does
				outcomes[i] = outbox.Outcome{Lease: r.Lease(), Status: outbox.StatusDead, Error: err.Error()}
				continue
			}
			deliveries = append(deliveries, outbox.Delivery{
				ID: r.ID, Namespace: r.Namespace, Topic: r.Topic, TenantID: r.TenantID,
				DedupeKey: r.DedupeKey, PartitionKey: r.PartitionKey, Headers: r.Headers,
				Payload: r.Payload, Attempt: r.Attempts, CreatedAt: r.CreatedAt,
			})
			index = append(index, i)
		}
		if !committed.IsZero() {
			p.stats.commitToPublish.Store(int64(time.Since(committed)))
		}
		if p.o.Ordered {
			if err := p.publishOrdered(pctx, c, chunk, deliveries, index, outcomes); err != nil {
				return err
			}
		} else {
			p.publishInto(pctx, p.publish, chunk, deliveries, index, outcomes)
		}
		if p.kill != nil && p.kill("published") {
			return errKilled
		}
		c.add(chunk, outcomes, safe)
		if err := p.settle(ctx, c); err != nil {
			return err
		}
	}
	return nil
}

// publishInto publishes deliveries, which are the rows of chunk at index, with publish
// (p.publish, or a caller of it), and writes their outcomes into outcomes. It returns
// whether each was delivered.
func (p *Publisher) publishInto(ctx context.Context, publish func(context.Context, []outbox.Delivery) []error,
	chunk []outbox.Record, deliveries []outbox.Delivery, index []int, outcomes []outbox.Outcome) []bool {
	errs := publish(ctx, deliveries)
	ok := make([]bool, len(index))
	for j, i := range index {
		r := chunk[i]
		if errs[j] == nil {
			outcomes[i], ok[j] = outbox.Outcome{Lease: r.Lease(), Status: outbox.StatusDelivered}, true
		} else {
			outcomes[i] = p.o.RetryPolicy.Outcome(outbox.Failure{Lease: r.Lease(), Attempts: r.Attempts, Err: errs[j]})
		}
	}
	return ok
}

// publish calls the transport and returns one outcome per delivery, as a polling
// Publisher reads them: none means all delivered, a wrong count or a panic fails all.
func (p *Publisher) publish(ctx context.Context, ds []outbox.Delivery) (errs []error) {
	if len(ds) == 0 {
		return nil
	}
	all := func(err error) []error {
		out := make([]error, len(ds))
		for i := range out {
			out[i] = err
		}
		return out
	}
	defer func() {
		if r := recover(); r != nil {
			errs = all(fmt.Errorf("outboxpglog: transport panicked: %v", r))
		}
	}()
	if !p.o.Ordered {
		ctx = outbox.WithoutKeyOrder(ctx) // nothing to hold back: a transport need not sequence a key
	}
	out := p.tr.Publish(ctx, ds)
	switch len(out) {
	case 0:
		return make([]error, len(ds))
	case len(ds):
		return out
	}
	return all(fmt.Errorf("outboxpglog: transport returned %d outcomes for %d messages", len(out), len(ds)))
}

// settle commits the outcomes c holds in one statement, retrying while the database is
// unreachable: a position is confirmed only after it. A lost lease is an outcome too:
// polling took the row over after its lease ran out, and owns it now. But the server sends
// a transaction's commit as soon as its WAL is flushed, a moment before other sessions can
// see its rows, so the outcome of a row that the settle does not find yet stays in c, to be
// settled again; after unseenPatience (p.patience) the row was removed, and counts as lost.
// Each outcome is counted once, when it is settled or lost.
func (p *Publisher) settle(ctx context.Context, c *carry) error {
	outcomes := c.outcomes()
	var hidden []uuid.UUID
	if p.invisible != nil {
		outcomes = slices.DeleteFunc(outcomes, func(o outbox.Outcome) bool {
			if p.invisible(o.ID) {
				hidden = append(hidden, o.ID)
				return true
			}
			return false
		})
	}
	missed, err := p.complete(ctx, outcomes)
	if err != nil {
		return err
	}
	missed = append(missed, hidden...)
	// Count and drop what this statement settled first, so that an error below leaves c
	// holding only what is still to write.
	isMissed := set(missed)
	var done []outbox.Outcome
	c.held = slices.DeleteFunc(c.held, func(h carried) bool {
		settled := !isMissed[h.ID]
		if settled {
			done = append(done, h.Outcome)
		}
		return settled
	})
	p.stats.count(done, nil)
	if len(c.held) == 0 || ctx.Err() != nil { // shutting down: the missed stay carried, unconfirmed
		return nil
	}
	unseen, err := p.unseen(ctx, c.outcomes(), missed)
	if err != nil {
		return err
	}
	isUnseen := set(unseen)
	done = nil
	var lost []uuid.UUID
	now := time.Now()
	c.held = slices.DeleteFunc(c.held, func(h carried) bool {
		if isUnseen[h.ID] && now.Sub(h.since) < p.patience {
			return false
		}
		done, lost = append(done, h.Outcome), append(lost, h.ID) // taken over by polling, or gone for good
		return true
	})
	p.stats.count(done, lost)
	if len(c.held) > 0 {
		p.unseenRetries.Add(1)
	}
	return nil
}

// set returns ids as a set, for lookups in a batch's outcomes.
func set(ids []uuid.UUID) map[uuid.UUID]bool {
	m := make(map[uuid.UUID]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}

// outcomes returns the outcomes c holds.
func (c *carry) outcomes() []outbox.Outcome {
	out := make([]outbox.Outcome, len(c.held))
	for i, h := range c.held {
		out[i] = h.Outcome
	}
	return out
}

// unseenPatience bounds how long a settle waits for a row it read in the log to become
// visible; a row still missing then was removed, and counts as lost.
const unseenPatience = 10 * time.Second

// complete runs Store.Complete until it commits, retrying while the database is
// unreachable, and returns the ids whose lease it found lost.
func (p *Publisher) complete(ctx context.Context, outcomes []outbox.Outcome) ([]uuid.UUID, error) {
	backoff := 50 * time.Millisecond
	for {
		// One try even after ctx ended, so that a shutdown settles what it published.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		err := p.store.Complete(sctx, outcomes...)
		cancel()
		var lost *outbox.LeaseLostError
		switch {
		case err == nil:
			return nil, nil
		case errors.As(err, &lost):
			return lost.IDs, nil
		case ctx.Err() != nil || errors.Is(err, outbox.ErrInvalid):
			return nil, err
		}
		p.log.Warn("outboxpglog: settle failed; retrying", "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// unseen returns those of the missed rows that a settle may not have seen yet: no row has
// the id, as this session sees it, or the row is still processing under the outcome's
// lease (its settle ran before the row was visible). The others were taken over.
func (p *Publisher) unseen(ctx context.Context, outcomes []outbox.Outcome, ids []uuid.UUID) ([]uuid.UUID, error) {
	t := p.store.Table()
	tbl := quoteIdent(t.Name())
	if t.Schema() != "" {
		tbl = quoteIdent(t.Schema()) + "." + tbl
	}
	want := make([]string, len(ids))
	for i, id := range ids {
		want[i] = id.String()
	}
	rows, err := p.store.DB().QueryContext(ctx, `SELECT id::text, status, coalesce(lease_token::text, '') FROM `+tbl+` WHERE id = ANY($1::uuid[])`, want)
	if err != nil {
		return nil, fmt.Errorf("outboxpglog: read settled rows: %w", err)
	}
	defer rows.Close()
	token := map[string]string{}
	for _, o := range outcomes {
		token[o.ID.String()] = o.Token.String()
	}
	taken := map[string]bool{}
	for rows.Next() {
		var id, status, tok string
		if err := rows.Scan(&id, &status, &tok); err != nil {
			return nil, err
		}
		taken[id] = status != string(outbox.StatusProcessing) || tok != token[id]
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var out []uuid.UUID
	for _, id := range ids {
		if !taken[id.String()] {
			out = append(out, id)
		}
	}
	return out, nil
}

// heartbeat writes a message to the log and reads the slot's lag, every
// HeartbeatInterval and once at the start.
func (s *session) heartbeat(ctx context.Context) error {
	p := s.p
	t := time.NewTicker(p.o.HeartbeatInterval)
	defer t.Stop()
	warned := false
	for {
		if err := p.readLag(ctx); errors.Is(err, ErrSlotLost) {
			p.slotLost(err.Error())
			return err
		} else if err != nil && ctx.Err() == nil {
			p.log.Warn("outboxpglog: read slot lag", "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		_, err := p.store.DB().ExecContext(ctx, `SELECT pg_logical_emit_message(false, 'outbox-heartbeat', '')`)
		if err != nil && ctx.Err() == nil && !warned {
			warned = true
			p.log.Warn("outboxpglog: heartbeat failed; an idle table may hold WAL back", "err", err)
		}
	}
}
