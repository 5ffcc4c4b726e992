package outboxbinlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
)

// Publisher delivers the rows a Store with outbox.Options.LogLease inserts, read from the
// server's binlog. Run it beside polling publishers on the same table: they never both own
// a row (see the package documentation). One Publisher of a Name reads at a time, among
// all processes: it holds a lock (GET_LOCK) on a connection of its own, and others started
// with the same Name stand by until it is free.
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
	// would: nothing settled or written after it.
	kill func(point string) bool
	// mistake, set by tests only, plants one realistic error that a test must catch.
	mistake mistake
	// handed, set by tests, sees the rows of each transaction the reader hands over.
	handed func([]outbox.Record)
	// readFile and readPos are where the reader is in the binlog, for the lag.
	readFile atomic.Pointer[string]
	readPos  atomic.Uint32
	// unseenRetries counts the settles retried for rows not yet visible, and sessions the
	// sessions that started reading, for tests.
	unseenRetries, sessions atomic.Int64
}

// New returns a Publisher of store's rows to tr. It checks the options only; Run connects.
func New(store *outbox.Store, tr outbox.Transport, o Options) (*Publisher, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalid)
	}
	if tr == nil {
		return nil, fmt.Errorf("%w: transport is nil", ErrInvalid)
	}
	if store.Dialect().Name() != "mysql" {
		return nil, fmt.Errorf("%w: the store's dialect is %s; binlog delivery needs MySQL or MariaDB", ErrInvalid, store.Dialect().Name())
	}
	o = o.withDefaults(store)
	if err := o.validate(); err != nil {
		return nil, err
	}
	ko, _ := tr.(outbox.TransportKeyOrder)
	return &Publisher{store: store, tr: tr, o: o, log: o.Logger, keyOrder: ko != nil && ko.KeepsKeyOrder()}, nil
}

// Name returns the reader's name: its row in the position table and its lock.
func (p *Publisher) Name() string { return p.o.Name }

// mistake is an error a test plants in a Publisher, to show that the test catches it.
type mistake int

const (
	noMistake mistake = iota
	// positionEverySettle writes the position with every settle: a write per batch.
	positionEverySettle
	// positionAhead writes a batch's end position before publishing the batch.
	positionAhead
	// noFinalPosition leaves the position settled past unwritten when a session ends.
	noFinalPosition
	// noSkip publishes again the rows read again that an earlier session settled.
	noSkip
)

var (
	errKilled  = errors.New("outboxbinlog: killed by test")
	errStandby = errors.New("outboxbinlog: another reader holds the lock")
)

// Run follows the binlog and delivers until ctx ends, then returns nil. It creates the
// position table when it is missing, reconnects after a lost connection, stands by while
// another reader holds the lock, and starts again from the server's current position when
// the binlog at its stored one was purged (reported once each time, and counted in
// [Stats]). It returns a [*SetupError] for what only the server's administrator can fix
// (the binlog off or not in ROW format, missing privileges).
func (p *Publisher) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return errors.New("outboxbinlog: Run is already running")
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
		case errors.Is(err, errStandby):
			p.stats.standby.Store(true)
			if !standing {
				p.log.Info("outboxbinlog: another reader holds the lock; standing by", "reader", p.o.Name)
				standing = true
			}
		case errors.Is(err, ErrBinlogPurged):
			continue // reported and reset already: start again at once
		default:
			standing = false
			p.stats.standby.Store(false)
			p.log.Warn("outboxbinlog: session ended; reconnecting", "reader", p.o.Name, "err", err, "retry_in", p.o.RetryDelay)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(p.o.RetryDelay):
		}
	}
}

// item is what the reader hands the deliverer: a committed transaction's rows that the
// log's reader owns (none for a position alone), and the position after it.
type item struct {
	rows   []outbox.Record
	end    position
	commit time.Time // zero for a position alone
}

// session is one binlog connection's life: a reader that follows the stream, a deliverer
// that publishes and settles, and a watch that checks the lock and reads the lag.
type session struct {
	p     *Publisher
	owner uuid.UUID
	items chan item
	// rereading is set until the deliverer meets a batch of rows still under their insert
	// lease: until then it may be reading binlog that an earlier session settled, or rows
	// that polling took over (see skipSettled).
	rereading bool
	pw        positionWriter
}

func (p *Publisher) session(ctx context.Context) (err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := p.ensureTable(ctx); err != nil {
		return err
	}
	srv, err := p.checkServer(ctx)
	if err != nil {
		return err
	}
	lock, ok, err := p.lock(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return errStandby
	}
	defer lock.release()
	s := &session{p: p, owner: uuid.New(), items: make(chan item, 64), rereading: true,
		pw: positionWriter{interval: p.o.PositionInterval, written: time.Now(), every: p.mistake == positionEverySettle}}
	pos, err := p.claimPosition(ctx, srv, s.owner)
	if err != nil {
		return err
	}
	p.setPosition(pos)
	dec, err := p.newDecoder(ctx)
	if err != nil {
		return err
	}
	syncer, err := p.syncer(srv, serverID(p.o.ServerID, lock.name), dec)
	if err != nil {
		return err
	}
	defer syncer.Close()
	var streamer *replication.BinlogStreamer
	if srv.gtids {
		set, perr := gomysql.ParseGTIDSet(srv.flavor, pos.gtid)
		if perr != nil {
			return fmt.Errorf("outboxbinlog: stored GTID set %q: %w", pos.gtid, perr)
		}
		streamer, err = syncer.StartSyncGTID(set)
	} else {
		streamer, err = syncer.StartSync(gomysql.Position{Name: pos.file, Pos: pos.pos})
	}
	if err != nil {
		return p.streamError(ctx, srv, s.owner, err)
	}
	p.stats.standby.Store(false)
	p.stats.reading.Store(true)
	p.sessions.Add(1)
	defer p.stats.reading.Store(false)
	p.log.Info("outboxbinlog: reading the binlog", "reader", p.o.Name, "position", pos.String())

	errc := make(chan error, 3)
	var wg sync.WaitGroup
	run := func(f func(context.Context) error) {
		wg.Add(1)
		go func() { defer wg.Done(); errc <- f(ctx) }()
	}
	run(func(ctx context.Context) error { return s.read(ctx, streamer, dec, pos) })
	run(s.deliver)
	run(func(ctx context.Context) error { return s.watch(ctx, lock) })
	err = <-errc
	cancel()
	wg.Wait()
	return p.streamError(ctx, srv, s.owner, err)
}

// streamError turns a purged binlog into a reset: reported once, the server's current
// position stored under this session's ownership, and ErrBinlogPurged returned. Other
// errors are returned as they are.
func (p *Publisher) streamError(ctx context.Context, srv server, owner uuid.UUID, err error) error {
	if !isPurged(err) {
		return err
	}
	p.log.Error("outboxbinlog: the binlog at the stored position was purged; rows committed meanwhile are delivered by polling once their leases run out, and reading starts again at the server's current position",
		"reader", p.o.Name, "position", p.Stats().Position, "err", err)
	rctx := context.WithoutCancel(ctx)
	pos, cerr := p.current(rctx, srv)
	if cerr == nil {
		cerr = p.writeOwner(rctx, owner, pos)
	}
	if cerr != nil {
		return fmt.Errorf("%w; reset failed: %w", err, cerr)
	}
	p.setPosition(pos)
	// Counted once the new position is stored: a row committed after Resets went up is
	// read from the binlog, not left to polling.
	p.stats.resets.Add(1)
	return fmt.Errorf("%w: %w", ErrBinlogPurged, err)
}

func (p *Publisher) setPosition(pos position) {
	s := pos.String()
	p.stats.position.Store(&s)
	p.readFile.Store(&pos.file)
	p.readPos.Store(pos.pos)
}

// serverID returns id, or when it is 0 one derived from the lock's name (the database and
// the reader's name), above 2^24 where replicas' ids seldom are.
func serverID(id uint32, lockName string) uint32 {
	if id != 0 {
		return id
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(lockName))
	return 1<<24 + h.Sum32()%(1<<30)
}

// syncer makes the binlog connection's syncer from ConnString. It decodes the rows of
// dec's inserts only: the reader's own settles (an update per event, with two images) and
// other tables' rows would cost most of the reader's time to decode and be skipped.
func (p *Publisher) syncer(srv server, id uint32, dec *decoder) (*replication.BinlogSyncer, error) {
	cfg, err := mysql.ParseDSN(p.o.ConnString)
	if err != nil {
		return nil, fmt.Errorf("%w: ConnString: %w", ErrInvalid, err)
	}
	host, port, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		host, port = cfg.Addr, "3306"
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("%w: ConnString: port %q", ErrInvalid, port)
	}
	return replication.NewBinlogSyncer(replication.BinlogSyncerConfig{
		ServerID: id, Flavor: srv.flavor, Host: host, Port: uint16(n),
		User: cfg.User, Password: cfg.Passwd, TLSConfig: cfg.TLS,
		HeartbeatPeriod: p.o.HeartbeatInterval, ReadTimeout: 3 * p.o.HeartbeatInterval,
		// Run reconnects from the stored position; the syncer's own retries would resume
		// from what it read, past rows not settled yet.
		DisableRetrySync: true,
		// MariaDB 11.4+ leaves the events' end offsets zero when the dump goes by GTID;
		// the file offsets in the position table need them.
		FillZeroLogPos: srv.flavor == gomysql.MariaDBFlavor,
		Logger:         slog.New(slog.DiscardHandler),
		// Datetimes as times: formatting each as text and parsing it back cost more than
		// the rest of a row's decoding.
		ParseTime: true,
		RowsEventDecodeFunc: func(e *replication.RowsEvent, data []byte) error {
			at, err := e.DecodeHeader(data)
			if err != nil || e.Type() != replication.EnumRowsEventTypeInsert || !dec.ours(e.Table) {
				return err
			}
			return e.DecodeData(at, data)
		},
	}), nil
}

// read follows the stream and hands each committed transaction with rows of the outbox
// table to the deliverer, in commit order, and the position after other transactions
// every so often.
func (s *session) read(ctx context.Context, streamer *replication.BinlogStreamer, dec *decoder, start position) error {
	p := s.p
	file := start.file
	var cur item
	var idle *position
	lastIdle := time.Now()
	// inTx is set between a transaction's start (BEGIN, or a MariaDB GTID event that is not
	// standalone) and its end (XID, or COMMIT): a statement inside it (SAVEPOINT) ends nothing.
	inTx := false
	// positionsOnly is set while the transaction's rows events are all of the position
	// table: a reader's own position write, which moves no position, or each write would
	// make the next one due and an idle server would see one every PositionInterval.
	positionsOnly, others := false, false
	push := func(it item) error {
		select {
		case s.items <- it:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	end := func(ev *replication.BinlogEvent, set gomysql.GTIDSet) error {
		pos := position{file: file, pos: ev.Header.LogPos}
		if set != nil {
			pos.gtid = set.String()
		}
		p.readFile.Store(&file)
		p.readPos.Store(pos.pos)
		inTx = false
		own := positionsOnly && !others
		positionsOnly, others = false, false
		if own {
			cur = item{}
			return nil
		}
		if len(cur.rows) > 0 {
			if p.handed != nil {
				p.handed(cur.rows)
			}
			cur.end = pos
			it := cur
			cur, idle = item{}, nil
			return push(it)
		}
		cur, idle = item{}, &pos
		return nil
	}
	for {
		gctx, gcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		ev, err := streamer.GetEvent(gctx)
		gcancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if idle != nil && (err != nil || time.Since(lastIdle) >= 200*time.Millisecond) {
			if err := push(item{end: *idle}); err != nil {
				return err
			}
			idle, lastIdle = nil, time.Now()
		}
		if errors.Is(err, context.DeadlineExceeded) {
			continue
		}
		if err != nil {
			return fmt.Errorf("outboxbinlog: binlog stream: %w", err)
		}
		switch e := ev.Event.(type) {
		case *replication.RotateEvent:
			file = string(e.NextLogName)
			p.readFile.Store(&file)
		case *replication.RowsEvent:
			if dec.positions(e.Table) {
				positionsOnly = true
				continue
			}
			others = true
			if !isWrite(ev.Header.EventType) || !dec.ours(e.Table) {
				continue
			}
			rows, err := dec.rows(e)
			if err != nil {
				return err
			}
			if len(rows) > 0 && cur.commit.IsZero() {
				cur.commit = time.Unix(int64(ev.Header.Timestamp), 0)
			}
			cur.rows = append(cur.rows, rows...)
		case *replication.XIDEvent:
			if err := end(ev, e.GSet); err != nil {
				return err
			}
		case *replication.MariadbGTIDEvent:
			inTx = !e.IsStandalone()
		case *replication.QueryEvent:
			switch q := strings.TrimSpace(string(e.Query)); {
			case strings.EqualFold(q, "BEGIN"):
				inTx = true
			case !inTx || strings.EqualFold(q, "COMMIT"): // DDL, or a non-transactional table's commit
				if err := end(ev, e.GSet); err != nil {
					return err
				}
			}
		}
	}
}

func isWrite(t replication.EventType) bool {
	switch t {
	case replication.WRITE_ROWS_EVENTv0, replication.WRITE_ROWS_EVENTv1, replication.WRITE_ROWS_EVENTv2,
		replication.MARIADB_WRITE_ROWS_COMPRESSED_EVENT_V1:
		return true
	}
	return false
}

// watch checks the lock and reads the lag every HeartbeatInterval.
func (s *session) watch(ctx context.Context, lock *readerLock) error {
	t := time.NewTicker(s.p.o.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		if err := lock.check(ctx); err != nil {
			return err
		}
		if err := s.p.readLag(ctx); err != nil && ctx.Err() == nil {
			s.p.log.Debug("outboxbinlog: read lag", "err", err)
		}
	}
}

// readLag reads how many binlog bytes the server wrote past the reader's position.
func (p *Publisher) readLag(ctx context.Context) error {
	file := p.readFile.Load()
	if file == nil {
		return nil
	}
	files, err := binlogFiles(ctx, p.store.DB())
	if err != nil {
		return err
	}
	lag, _ := lagAfter(files, *file, int64(p.readPos.Load()))
	p.stats.lagBytes.Store(lag)
	return nil
}

// positionWriter is the deliverer's account of its position: the one after the last
// outcomes it settled, if not written yet, and when it last wrote one. The position is
// written at most once per interval (a write per batch would double a trickle's writes),
// and only once the outcomes it covers are committed, so that the stored position may lag
// them, never lead them.
type positionWriter struct {
	interval time.Duration
	written  time.Time
	unsaved  *position
	every    bool // the positionEverySettle mistake
}

// due reports whether the next settle writes the position.
func (w *positionWriter) due() bool { return w.every || time.Since(w.written) >= w.interval }

// settled records that everything before end is settled, and whether end was written.
func (w *positionWriter) settled(end position, written bool) {
	if written {
		w.unsaved, w.written = nil, time.Now()
		return
	}
	w.unsaved = &end
}

// timer returns a channel that fires when the unsaved position is due to be written
// alone, nil when there is none, and the timer's stop.
func (w *positionWriter) timer() (<-chan time.Time, func() bool) {
	if w.unsaved == nil {
		return nil, func() bool { return false }
	}
	t := time.NewTimer(time.Until(w.written.Add(w.interval)))
	return t.C, t.Stop
}

// deliver publishes and settles the committed transactions in commit order, what the reader
// has waiting at a time (publishAndSettle), and writes the position after them: with a
// settle when the position is due, alone when only other tables' transactions went by, and
// once more as the session ends (a shutdown, a lost connection or lock), so that the next
// session reads nothing again after a clean stop.
func (s *session) deliver(ctx context.Context) error {
	err := s.deliverLoop(ctx)
	if errors.Is(err, errKilled) || errors.Is(err, errFenced) || s.p.mistake == noFinalPosition {
		return err
	}
	if ferr := s.flush(ctx); ferr != nil {
		s.p.log.Warn("outboxbinlog: write the position at the session's end; the next session reads again from the one stored before",
			"reader", s.p.o.Name, "err", ferr)
	}
	return err
}

// flush writes the position not written yet, in one try even after ctx ended.
func (s *session) flush(ctx context.Context) error {
	at := s.pw.unsaved
	if at == nil {
		return nil
	}
	if _, _, err := s.p.settleOnce(ctx, s.owner, nil, at, true); err != nil {
		return err
	}
	s.p.setPosition(*at)
	s.pw.settled(*at, true)
	return nil
}

// settleBatches is how many batches of waiting rows one settle covers at most. A settle
// costs MariaDB a transaction (its owner check, its commit) beside its rows: under load,
// settling batch by batch took the deliverer's whole time at 11,800 events a second on two
// cores, where a settle per eight batches left it room.
const settleBatches = 8

func (s *session) deliverLoop(ctx context.Context) error {
	p := s.p
	for {
		var it item
		due, stop := s.pw.timer()
		select {
		case it = <-s.items:
			stop()
		case <-due:
			if err := p.settle(ctx, s.owner, nil, s.pw.unsaved); err != nil {
				return err
			}
			s.pw.settled(*s.pw.unsaved, true)
			continue
		case <-ctx.Done():
			stop()
			return ctx.Err()
		}
		rows, end, first := it.rows, it.end, it.commit
	drain:
		for len(rows) < settleBatches*p.o.BatchSize {
			select {
			case it := <-s.items:
				rows, end = append(rows, it.rows...), it.end
				if first.IsZero() {
					first = it.commit
				}
			default:
				break drain
			}
		}
		if len(rows) == 0 {
			s.pw.settled(end, false) // written when due, by the timer
			continue
		}
		written, err := s.publishAndSettle(ctx, rows, first, end)
		if err != nil {
			return err
		}
		s.pw.settled(end, written)
	}
}

// publishAndSettle hands rows to the transport in batches of BatchSize and settles their
// outcomes in one transaction under the rows' insert leases, with end, the position after
// them, when it is due; written reports whether it was written. Rows an earlier session
// settled are skipped (skipSettled). The transport's context ends ShutdownTimeout after
// ctx, so that a shutdown lets the batch in flight finish; the batches after it are not
// sent, and their rows stay leased, to be read again or polled.
func (s *session) publishAndSettle(ctx context.Context, rows []outbox.Record, committed time.Time, end position) (written bool, err error) {
	p := s.p
	if p.mistake == positionAhead {
		if err := p.settle(ctx, s.owner, nil, &end); err != nil {
			return false, err
		}
	}
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
	if err := ctx.Err(); err != nil {
		return false, err
	}
	rows, err = s.skipSettled(ctx, rows)
	if err != nil {
		return false, err
	}
	var at *position
	if s.pw.due() {
		at = &end
	}
	outcomes := make([]outbox.Outcome, len(rows))
	deliveries := make([]outbox.Delivery, 0, len(rows))
	index := make([]int, 0, len(rows))
	for i, r := range rows {
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
	if !committed.IsZero() && len(deliveries) > 0 {
		p.stats.commitToPublish.Store(int64(time.Since(committed)))
	}
	// With Ordered, the keys held back by the table are read once for all the batches,
	// and a key stopped by a failure in one batch stays stopped in the next.
	var stopped map[string]bool
	if p.o.Ordered {
		if stopped, err = p.blockedKeys(ctx, rows, index); err != nil {
			return false, err
		}
	}
	var stop error
	for from := 0; from < len(deliveries); from += p.o.BatchSize {
		if stop = ctx.Err(); stop != nil {
			at = nil // shutting down: the rest stay leased, and the position before them stands
			break
		}
		to := min(from+p.o.BatchSize, len(deliveries))
		if p.o.Ordered {
			p.publishOrdered(pctx, rows, deliveries[from:to], index[from:to], outcomes, stopped)
		} else {
			p.publishInto(pctx, p.publish, rows, deliveries[from:to], index[from:to], outcomes)
		}
	}
	if p.kill != nil && p.kill("published") {
		return false, errKilled
	}
	settled := slices.DeleteFunc(outcomes, func(o outbox.Outcome) bool { return o.ID == uuid.Nil })
	if len(settled) > 0 || at != nil {
		if err := p.settle(ctx, s.owner, settled, at); err != nil {
			return false, err
		}
	}
	return at != nil, stop
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
			errs = all(fmt.Errorf("outboxbinlog: transport panicked: %v", r))
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
	return all(fmt.Errorf("outboxbinlog: transport returned %d outcomes for %d messages", len(out), len(ds)))
}

// unseenPatience bounds how long settle waits for a row it read in the binlog to become
// visible; a row still missing then was removed, and counts as lost.
const unseenPatience = 10 * time.Second

// settle commits outcomes and, when at is set, the position after them, in one
// transaction fenced by the session's ownership of the position row, retrying while the
// database is unreachable. A lost lease is an outcome too: polling took the row over after
// its lease ran out, and owns it now. But the server writes a transaction to the binlog a
// moment before other sessions can see its rows, so a row that the settle does not find
// yet is settled again once it is visible.
func (p *Publisher) settle(ctx context.Context, owner uuid.UUID, outcomes []outbox.Outcome, at *position) error {
	giveUp := time.Now().Add(unseenPatience)
	// A row not visible yet is a moment away (its transaction is committing); an
	// unreachable database is worth a longer backoff.
	unseenPause, backoff := time.Millisecond, 50*time.Millisecond
	for {
		lost, retry, err := p.settleOnce(ctx, owner, outcomes, at, time.Now().After(giveUp))
		var pause time.Duration
		switch {
		case err == nil && !retry:
			p.stats.count(outcomes, lost)
			if at != nil {
				p.setPosition(*at)
			}
			return nil
		case err == nil: // rows not visible yet
			p.unseenRetries.Add(1)
			pause, unseenPause = unseenPause, min(2*unseenPause, 100*time.Millisecond)
		case errors.Is(err, errFenced), errors.Is(err, errKilled), errors.Is(err, outbox.ErrInvalid), ctx.Err() != nil:
			return err
		default:
			p.log.Warn("outboxbinlog: settle failed; retrying", "err", err, "retry_in", backoff)
			pause, backoff = backoff, min(2*backoff, 5*time.Second)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
	}
}

// settleOnce runs one settle transaction. retry is set, and nothing committed, when some
// row the outcomes name is not visible yet and patience allows waiting for it.
func (p *Publisher) settleOnce(ctx context.Context, owner uuid.UUID, outcomes []outbox.Outcome, at *position, impatient bool) (lost []uuid.UUID, retry bool, err error) {
	// One try even after ctx ended, so that a shutdown settles what it published.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	tx, err := p.store.DB().BeginTx(sctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, false, err
	}
	defer func() { _ = tx.Rollback() }()
	if at == nil {
		if err := p.checkOwner(sctx, tx, owner); err != nil {
			return nil, false, err
		}
	}
	if len(outcomes) > 0 {
		err = p.store.CompleteTx(sctx, tx, outcomes...)
		var le *outbox.LeaseLostError
		switch {
		case errors.As(err, &le):
			lost = le.IDs
			unseen, err := p.unseen(sctx, tx, outcomes, lost)
			if err != nil {
				return nil, false, err
			}
			if len(unseen) > 0 && !impatient {
				return nil, true, nil
			}
		case err != nil:
			return nil, false, err
		}
	}
	if at != nil {
		if err := p.savePosition(sctx, tx, owner, *at); err != nil {
			return nil, false, err
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, false, err
	}
	if p.kill != nil && p.kill("settled") {
		return nil, false, errKilled
	}
	return lost, false, nil
}

// unseen returns those of the lost rows that the settle may not have seen yet: no row has
// the id, or the row is still processing under the outcome's lease. The others were taken
// over.
func (p *Publisher) unseen(ctx context.Context, tx *sql.Tx, outcomes []outbox.Outcome, ids []uuid.UUID) ([]uuid.UUID, error) {
	tokens := map[uuid.UUID]uuid.UUID{}
	for _, o := range outcomes {
		tokens[o.ID] = o.Token
	}
	present, held, err := p.leases(ctx, tx, ids, tokens)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(slices.Clone(ids), func(id uuid.UUID) bool { return present[id] && !held[id] }), nil
}
