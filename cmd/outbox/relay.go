package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/logrepl/mysqlbinlog"
	"github.com/outboxgo/outbox/logrepl/pglog"
	"github.com/outboxgo/outbox/otel"
)

const relayUsage = `  outbox relay --broker URL --namespace NS --dsn DSN [--dsn DSN]... [flags]
  outbox relay --config relay.toml [flags]
                                    deliver the outbox rows of one or many databases
                                    to a broker until SIGTERM or SIGINT

Settings come from flags, then OUTBOX_* variables, then the --config TOML file, then
defaults (a flag wins over a variable, a variable over the file). docs/relay.md lists them.
The exit code is 2 for bad configuration (nothing is started), 1 when the relay failed.`

// relayShutdownGrace is how long past the drain deadline the process waits for its
// stores to stop before it exits anyway: rows still leased are reclaimed after their lease.
const relayShutdownGrace = 5 * time.Second

func runRelay(ctx context.Context, c *cli, args []string) error {
	fs := c.flagSet("relay")
	given := map[string][]string{}
	cfgPath := relayFlags(fs, given)
	pos, err := c.parse(fs, relayUsage, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("relay takes no arguments, got %q", pos[0])
	}
	rc, err := c.loadRelayConfig(*cfgPath, given)
	if err != nil {
		return err
	}
	c.secrets = append(c.secrets, rc.UIToken, rc.BrokerOptions["secret"])
	spec, err := parseBroker(rc.Broker, rc.BrokerOptions)
	if err != nil {
		return err
	}
	if u := spec.u.User; u != nil {
		if p, ok := u.Password(); ok {
			c.secrets = append(c.secrets, secretsOf(p)...)
		}
	}
	log := relayLogger(c, rc)
	plans, err := c.planRelay(rc, log)
	if err != nil {
		return err
	}
	// Everything above is checked without a connection or a port: from here on a failure
	// is an operation's (exit 1), not bad input.
	return serveRelay(ctx, c, rc, spec, plans, log)
}

// relayLogger returns the JSON or text logger on stderr.
func relayLogger(c *cli, rc *relayConfig) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(rc.LogLevel))
	ho := &slog.HandlerOptions{Level: lvl}
	w := scrubWriter{c}
	if rc.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, ho))
	}
	return slog.New(slog.NewJSONHandler(w, ho))
}

// scrubWriter writes to the cli's stderr with every secret removed.
type scrubWriter struct{ c *cli }

func (w scrubWriter) Write(p []byte) (int, error) {
	_, err := w.c.stderr.Write([]byte(w.c.scrub(string(p))))
	return len(p), err
}

// storePlan is one database, resolved and with its options built, not yet opened.
type storePlan struct {
	name string
	t    target
	db   relayDatabase
	opts outbox.PublisherOptions
	// log delivery on PostgreSQL (log) or MySQL/MariaDB (binlog); both nil for polling only
	log    *outboxpglog.Options
	binlog *outboxbinlog.Options
}

// planRelay resolves every database and builds its options; every check that needs no
// connection happens here.
func (c *cli) planRelay(rc *relayConfig, log *slog.Logger) ([]storePlan, error) {
	var plans []storePlan
	names := map[string]int{}
	for _, db := range rc.Databases {
		t, err := resolve(db.Dialect, db.DSN)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", db.where, err)
		}
		c.secrets = append(c.secrets, t.secrets()...)
		if t.sqlitePath != "" && !fileExists(t.sqlitePath) {
			return nil, usagef("%s: no SQLite database at %s (create it with: outbox migrate up)", db.where, t.sqlitePath)
		}
		name := db.Name
		if name == "" {
			name = dsnName(t.shown)
			if names[name]++; names[name] > 1 {
				name = fmt.Sprintf("%s-%d", name, names[name])
			}
		}
		sc := outbox.Scope{Namespace: db.Namespace, Topics: rc.Topics, TenantID: rc.Tenant}
		po := outbox.PublisherOptions{
			Scope: sc, BatchSize: rc.BatchSize, PollInterval: rc.PollInterval, Lease: rc.Lease,
			IdleBackoffMax: max(outbox.DefaultIdleBackoffMax, rc.PollInterval),
			Retry:          outbox.RetryPolicy{BaseDelay: rc.RetryBase, MaxDelay: rc.RetryMax, MaxAttempts: rc.MaxAttempts},
			Circuit:        outbox.CircuitOptions{ProbeMin: rc.CircuitProbeMin, ProbeMax: rc.CircuitProbeMax},
			Concurrency:    rc.Concurrency, ShutdownTimeout: rc.DrainTimeout, Ordered: rc.Ordered, Logger: log,
		}
		p := storePlan{name: name, t: t, db: db, opts: po}
		if db.Delivery == "log" {
			switch t.dialect {
			case "postgres":
				conn := db.ReplicationDSN
				if conn == "" {
					conn = t.dsn
				}
				p.log = &outboxpglog.Options{Scope: sc, ConnString: conn, Slot: db.Slot, Ordered: rc.Ordered, BatchSize: rc.BatchSize,
					RetryPolicy: po.Retry, ShutdownTimeout: rc.DrainTimeout, Logger: log.With("store", name)}
			case "mysql":
				conn := t.dsn
				if db.ReplicationDSN != "" {
					rt, err := resolve("mysql", db.ReplicationDSN)
					if err != nil {
						return nil, fmt.Errorf("%s: replication_dsn: %w", db.where, err)
					}
					c.secrets = append(c.secrets, rt.secrets()...)
					conn = rt.dsn
				}
				p.binlog = &outboxbinlog.Options{Scope: sc, ConnString: conn, Name: db.Slot, Ordered: rc.Ordered, BatchSize: rc.BatchSize,
					RetryPolicy: po.Retry, ShutdownTimeout: rc.DrainTimeout, Logger: log.With("store", name)}
			default:
				return nil, usagef("%s: delivery log reads PostgreSQL's write-ahead log or the MySQL/MariaDB binlog; SQLite databases are delivered by polling (delivery = \"poll\")", db.where)
			}
		}
		plans = append(plans, p)
	}
	// The options are checked by the library itself, on relays that never run.
	for _, p := range plans {
		if len(p.name) > outbox.MaxRelayStoreName {
			return nil, usagef("%s: name %q is longer than %d bytes", p.db.where, p.name, outbox.MaxRelayStoreName)
		}
		_, err := outbox.NewRelay(outbox.PerMessage(func(context.Context, outbox.Delivery) error { return nil }),
			outbox.RelayOptions{Publisher: p.opts, MaxInFlight: rc.MaxInFlight, IdleProbesPerSecond: rc.IdleProbesPerSecond})
		if err != nil {
			return nil, usagef("%s", relayOptionError(err))
		}
	}
	return plans, nil
}

// relayOptionError names the flag of a library option refused.
func relayOptionError(err error) string {
	var ve *outbox.ValidationError
	if !errors.As(err, &ve) {
		return err.Error()
	}
	flag := map[string]string{"BatchSize": "batch-size", "PollInterval": "poll-interval", "Lease": "lease",
		"MaxAttempts": "max-attempts", "BaseDelay": "retry-base", "MaxDelay": "retry-max", "Concurrency": "concurrency",
		"MaxInFlight": "max-in-flight", "IdleProbesPerSecond": "idle-probes-per-second", "Namespace": "namespace",
		"Topics": "topic", "ShutdownTimeout": "drain-timeout", "Circuit.ProbeMin": "circuit-probe-min", "Circuit.ProbeMax": "circuit-probe-max"}[ve.Field]
	if flag == "" {
		return err.Error()
	}
	return "--" + flag + " (" + relayKeyOfFlag(flag) + "): " + strings.TrimPrefix(err.Error(), "outbox: ")
}

// relayKeyOfFlag returns the file key and variable of a flag, for messages.
func relayKeyOfFlag(flag string) string {
	for _, k := range relayKeys {
		if k.flag == flag {
			return k.key + ", " + k.env
		}
	}
	return ""
}

// relayStore is a database being served.
type relayStore struct {
	storePlan
	db      *sql.DB
	store   *outbox.Store
	reader  *logSource // log delivery, else nil
	watcher *outboxotel.StoreWatcher
	obs     *outboxotel.PublisherObserver
}

func serveRelay(ctx context.Context, c *cli, rc *relayConfig, spec *brokerSpec, plans []storePlan, log *slog.Logger) error {
	met, err := newRelayMetrics()
	if err != nil {
		return err
	}
	var ln net.Listener
	if rc.Listen != "off" {
		if ln, err = net.Listen("tcp", rc.Listen); err != nil {
			return fmt.Errorf("cannot listen on %s: %v", rc.Listen, err)
		}
		defer ln.Close()
	}
	br, err := spec.connect(log)
	if err != nil {
		return err
	}
	defer br.close()

	relay, err := outbox.NewRelay(br.tr, outbox.RelayOptions{Publisher: plans[0].opts, MaxInFlight: rc.MaxInFlight, IdleProbesPerSecond: rc.IdleProbesPerSecond})
	if err != nil {
		return err
	}
	var stores []*relayStore
	defer func() {
		for _, s := range stores {
			if s.watcher != nil {
				s.watcher.Close()
			}
			if s.obs != nil {
				s.obs.Close()
			}
			_ = s.db.Close()
		}
	}()
	for _, p := range plans {
		db, err := sql.Open(p.t.driver, p.t.dsn)
		if err != nil {
			return fmt.Errorf("%s: cannot open %s: %v", p.db.where, p.t.shown, err)
		}
		s := &relayStore{storePlan: p, db: db}
		stores = append(stores, s)
		d := map[string]func() outbox.Dialect{"postgres": outbox.Postgres, "mysql": outbox.MySQL, "sqlite": outbox.SQLite}[p.t.dialect]
		if s.store, err = outbox.New(db, d(), outbox.Options{Table: p.db.Table, Schema: p.db.Schema}); err != nil {
			return err
		}
		s.obs = met.tel.PublisherObserver(br.tr, p.name)
		p.opts.Observer = s.obs
		p.opts.Logger = log
		if err := relay.Add(p.name, s.store, p.opts); err != nil {
			return err
		}
		if s.watcher, err = met.tel.WatchStore(s.store, outboxotel.WatchOptions{Interval: rc.WatchInterval, Name: p.name,
			Scope: p.opts.Scope, Logger: log.With("store", p.name)}); err != nil {
			return err
		}
		if s.reader, err = newLogSource(p, s.store, br.tr); err != nil {
			return usagef("%s: %v", p.db.where, err)
		}
	}
	defer met.watch(relay, stores)()

	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRun()
	var wg sync.WaitGroup
	errs := make(chan error, len(stores)+2)
	wg.Add(1)
	go func() { defer wg.Done(); errs <- relay.Run(runCtx) }()
	for _, s := range stores {
		if s.reader != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := s.reader.run(runCtx, log.With("store", s.name)); err != nil {
					errs <- fmt.Errorf("store %s: log delivery: %w", s.name, err)
				}
			}()
		}
	}
	var srv *http.Server
	if ln != nil {
		h := &relayHTTP{relay: relay, stores: stores, broker: br, spec: spec, met: met}
		mux, err := h.mux(rc)
		if err != nil {
			return err
		}
		srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("outbox relay: serving http", "err", err)
			}
		}()
	}
	listen := "off"
	if ln != nil {
		listen = ln.Addr().String()
	}
	log.Info("outbox relay: serving", "databases", len(stores), "broker", spec.shown, "listen", listen)

	<-ctx.Done()
	log.Info("outbox relay: draining", "deadline", rc.DrainTimeout.String())
	stopRun()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	var runErr error
	select {
	case <-done:
		close(errs)
		for err := range errs {
			runErr = errors.Join(runErr, err)
		}
	case <-time.After(rc.DrainTimeout + relayShutdownGrace):
		runErr = fmt.Errorf("stores still stopping %s after the drain deadline; their rows are reclaimed once their leases expire", relayShutdownGrace)
	}
	if srv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = srv.Shutdown(sctx)
		cancel()
	}
	st := relay.Stats().Total
	var fromLog logCounts
	for _, s := range stores {
		if s.reader != nil {
			fromLog = fromLog.plus(s.reader.state().logCounts)
		}
	}
	log.Info("outbox relay: stopped", "delivered", st.Delivered, "retried", st.Retried, "dead", st.Dead,
		"log_delivered", fromLog.delivered, "log_retried", fromLog.retried, "log_dead", fromLog.dead)
	return runErr
}
