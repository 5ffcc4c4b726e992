package main

import (
	"context"
	"path/filepath"
	"time"

	"github.com/outboxgo/outbox"
	outboxpglog "github.com/outboxgo/outbox/logrepl/pglog"
	"github.com/outboxgo/outbox/outboxtest/pgserver"
)

// logDeliveryPostgres starts the log-delivery rig on PostgreSQL: a private server with
// wal_level=logical, fsync and synchronous_commit on, and outboxpglog on a slot of the
// bench database's own.
func logDeliveryPostgres(ctx context.Context, cfg config, _ backend) (*logRig, error) {
	srv, err := pgserver.Start("wal_level=logical", "shared_buffers=128MB", "max_wal_size=1GB")
	if err != nil {
		return nil, err
	}
	lb := &pgBackend{dsn: srv.DSN("postgres")}
	if err := lb.setup(ctx); err != nil {
		lb.teardown()
		srv.Stop()
		return nil, err
	}
	slot := "bench_" + lb.dbName
	pl := &pgLog{b: lb, pidFile: filepath.Join(srv.Dir(), "data", "postmaster.pid")}
	return &logRig{logServer: pl, b: lb,
		about: "private PostgreSQL, wal_level=logical, fsync and synchronous_commit on, shared_buffers 128MB",
		reader: func(store *outbox.Store, tr outbox.Transport) (logConsumer, error) {
			lp, err := outboxpglog.New(store, tr, outboxpglog.Options{Scope: outbox.Scope{Namespace: benchNamespace},
				ConnString: lb.benchDSN, Slot: slot, BatchSize: cfg.Batch, Logger: discard})
			if err != nil {
				return logConsumer{}, err
			}
			return besidePolling(cfg, store, tr, lp.Run, func() (int64, int64, int64, bool) {
				st := lp.Stats()
				return st.Delivered, st.Retried, st.Dead, st.Reading
			})
		},
		stop: func() {
			// The slot stays active until the last reader's walsender has exited, and an
			// active slot's database cannot be dropped.
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				var left int
				if lb.server.QueryRowContext(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&left) != nil || left == 0 {
					break
				}
				_, _ = lb.server.ExecContext(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, slot)
			}
			lb.teardown()
			srv.Stop()
		},
	}, nil
}

// pgLog reads the private PostgreSQL's counters.
type pgLog struct {
	b       *pgBackend
	pidFile string
}

// counters: the WAL insert position, the outbox table's n_tup_upd, the server's CPU.
func (l *pgLog) counters(ctx context.Context) (logCounters, error) {
	var c logCounters
	if err := l.b.db.QueryRowContext(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0'), n_tup_upd FROM pg_stat_user_tables WHERE relname = $1`,
		mainTable).Scan(&c.WAL, &c.Updates); err != nil {
		return c, err
	}
	var err error
	c.CPU, err = groupCPU(l.pidFile)
	return c, err
}

// quiesce waits until the bench database's only client backends are the admin pool's: a
// backend reports its table counters when it exits, at the latest.
func (l *pgLog) quiesce(ctx context.Context) error {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var backends int
		if err := l.b.server.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend'`,
			l.b.dbName).Scan(&backends); err != nil {
			return err
		}
		if backends <= l.b.db.Stats().OpenConnections {
			break
		}
	}
	return nil
}
