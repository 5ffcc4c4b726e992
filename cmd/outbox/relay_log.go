package main

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/logrepl/mysqlbinlog"
	"github.com/outboxgo/outbox/logrepl/pglog"
	"github.com/outboxgo/outbox/otel"
)

// logReader is what the relay runs of either log reader: PostgreSQL's (logrepl/pglog) or
// the MySQL/MariaDB binlog's (logrepl/mysqlbinlog).
type logReader interface {
	Run(context.Context) error
}

// logCounts are the outcomes a log reader settled.
type logCounts struct{ delivered, retried, dead int64 }

func (a logCounts) plus(b logCounts) logCounts {
	return logCounts{a.delivered + b.delivered, a.retried + b.retried, a.dead + b.dead}
}

// logState is what /readyz and the stopped line tell of a log reader.
type logState struct {
	reading, standby bool
	logCounts
}

// logSource is a database's log reader with what /readyz and /metrics read of it, in the
// words of its database.
type logSource struct {
	reader logReader
	// id is the slot (PostgreSQL) or the reader's name (MySQL): the outbox_log_slot label.
	id string
	// what is what the reader reads, and held what a standby waits for, for /readyz.
	what, held string
	state      func() logState
	metrics    func() outboxotel.LogReaderStats
	// failed is the error Run stopped with, for /readyz.
	failed atomic.Pointer[string]
}

// newLogSource makes the log reader of p, if its delivery is log; nil otherwise.
func newLogSource(p storePlan, store *outbox.Store, tr outbox.Transport) (*logSource, error) {
	switch {
	case p.log != nil:
		lp, err := outboxpglog.New(store, tr, *p.log)
		if err != nil {
			return nil, err
		}
		return &logSource{reader: lp, id: lp.Slot(), what: "slot " + lp.Slot(), held: "slot " + lp.Slot(),
			state: func() logState {
				st := lp.Stats()
				return logState{st.Reading, st.Standby, logCounts{st.Delivered, st.Retried, st.Dead}}
			},
			metrics: func() outboxotel.LogReaderStats {
				st := lp.Stats()
				return outboxotel.LogReaderStats{Reading: st.Reading, SlotLagBytes: st.SlotLagBytes,
					RetainedWALBytes: st.RetainedWALBytes, SlotResets: st.SlotResets}
			}}, nil
	case p.binlog != nil:
		bp, err := outboxbinlog.New(store, tr, *p.binlog)
		if err != nil {
			return nil, err
		}
		return &logSource{reader: bp, id: bp.Name(), what: "the binlog as " + bp.Name(), held: "reader lock " + bp.Name(),
			state: func() logState {
				st := bp.Stats()
				return logState{st.Reading, st.Standby, logCounts{st.Delivered, st.Retried, st.Dead}}
			},
			// The server keeps its binlog by its own expiry, not for a reader: nothing is
			// retained on the reader's account, so that gauge stays 0.
			metrics: func() outboxotel.LogReaderStats {
				st := bp.Stats()
				return outboxotel.LogReaderStats{Reading: st.Reading, SlotLagBytes: st.LagBytes, SlotResets: st.Resets}
			}}, nil
	}
	return nil, nil
}

// run runs the reader until ctx ends; an error it stops with (a setup only an
// administrator can fix) is logged at once and kept for /readyz, since the relay's
// polling goes on without it.
func (s *logSource) run(ctx context.Context, log *slog.Logger) error {
	err := s.reader.Run(ctx)
	if err == nil || errors.Is(err, context.Canceled) {
		return nil
	}
	log.Error("outbox relay: log delivery stopped; polling delivers the rows", "err", err)
	msg := err.Error()
	s.failed.Store(&msg) // after the log line: what /readyz reports has been logged
	return err
}
