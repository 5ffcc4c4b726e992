package main

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxgo/outbox"
	outboxbinlog "github.com/outboxgo/outbox/logrepl/mysqlbinlog"
	"github.com/outboxgo/outbox/outboxtest/mariadbserver"
)

// logDeliveryMariaDB starts the log-delivery rig on MariaDB: a private server with the
// binlog on in ROW format, the durability settings of a default install
// (innodb_flush_log_at_trx_commit=1, sync_binlog=0) and a buffer pool of PostgreSQL's
// shared_buffers, and outboxbinlog on the bench database. The bench's pools connect as
// they do to the shared server (-mysql-dsn), so with its interpolateParams.
func logDeliveryMariaDB(ctx context.Context, cfg config, shared backend) (*logRig, error) {
	srv, err := mariadbserver.Start(append(slices.Clone(mariadbserver.Binlog), "--innodb-buffer-pool-size=128M")...)
	if err != nil {
		return nil, err
	}
	dsn := srv.DSN("")
	if sb, ok := shared.(*myBackend); ok {
		if sc, err := mysql.ParseDSN(sb.dsn); err == nil {
			pc, _ := mysql.ParseDSN(dsn)
			pc.InterpolateParams = sc.InterpolateParams
			dsn = pc.FormatDSN()
		}
	}
	lb := &myBackend{dsn: dsn}
	if err := lb.setup(ctx); err != nil {
		lb.teardown()
		srv.Stop()
		return nil, err
	}
	ml := &myLog{b: lb, pidFile: filepath.Join(srv.Dir(), "mysqld.pid")}
	about := "private MariaDB, binlog_format=ROW, innodb_flush_log_at_trx_commit=1 and sync_binlog=0 (the defaults), buffer pool 128MB"
	if info := lb.describe(ctx); info.Version != "" {
		about = strings.Replace(about, "MariaDB", info.Version, 1)
	}
	return &logRig{logServer: ml, b: lb, about: about,
		reader: func(store *outbox.Store, tr outbox.Transport) (logConsumer, error) {
			lp, err := outboxbinlog.New(store, tr, outboxbinlog.Options{Scope: outbox.Scope{Namespace: benchNamespace},
				ConnString: srv.DSN(""), BatchSize: cfg.Batch, Logger: discard})
			if err != nil {
				return logConsumer{}, err
			}
			return besidePolling(cfg, store, tr, lp.Run, func() (int64, int64, int64, bool) {
				st := lp.Stats()
				return st.Delivered, st.Retried, st.Dead, st.Reading
			})
		},
		stop: func() {
			lb.teardown()
			srv.Stop()
		},
	}, nil
}

// myLog reads the private MariaDB's counters.
type myLog struct {
	b       *myBackend
	pidFile string
}

// counters: the InnoDB redo log's LSN, the binlog's size, Handler_update and the
// server's CPU. Handler_update counts the rows an UPDATE changed (MariaDB skips the
// handler call for a row it leaves as it was), on every table; this MariaDB (10.11) has no
// Innodb_rows_updated, which would count InnoDB's tables alone, the same rows here.
func (l *myLog) counters(ctx context.Context) (logCounters, error) {
	var c logCounters
	rows, err := l.b.server.QueryContext(ctx, `SELECT VARIABLE_NAME, VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS`+
		` WHERE VARIABLE_NAME IN ('INNODB_LSN_CURRENT', 'HANDLER_UPDATE')`)
	if err != nil {
		return c, err
	}
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return c, err
		}
		v, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			return c, err
		}
		switch strings.ToUpper(name) {
		case "INNODB_LSN_CURRENT":
			c.WAL = float64(v)
		case "HANDLER_UPDATE":
			c.Updates = v
		}
		seen++
	}
	if err := rows.Err(); err != nil {
		return c, err
	}
	if seen != 2 {
		return c, fmt.Errorf("server status has %d of Innodb_lsn_current and Handler_update", seen)
	}
	if c.Binlog, err = binlogBytes(ctx, l.b.server); err != nil {
		return c, err
	}
	c.CPU, err = groupCPU(l.pidFile)
	return c, err
}

// quiesce has nothing to wait for: the global status adds the live sessions' counters to
// those of the closed ones.
func (*myLog) quiesce(context.Context) error { return nil }

// binlogBytes is the size of the server's binlog files, the current one up to its end
// (SHOW BINARY LOGS), so that a rotation inside a window still counts.
func binlogBytes(ctx context.Context, db *sql.DB) (float64, error) {
	rows, err := db.QueryContext(ctx, `SHOW BINARY LOGS`)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return 0, err
	}
	var total float64
	for rows.Next() {
		vals := make([]any, len(cols))
		var name string
		var size int64
		vals[0], vals[1] = &name, &size
		for i := 2; i < len(vals); i++ {
			vals[i] = new(sql.RawBytes)
		}
		if err := rows.Scan(vals...); err != nil {
			return 0, err
		}
		total += float64(size)
	}
	return total, rows.Err()
}
