package main

import (
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

// relayConfig is the relay's configuration once defaults, the file, the environment and
// the flags are merged, in that order of increasing precedence.
type relayConfig struct {
	Listen        string
	Broker        string
	BrokerOptions map[string]string
	Databases     []relayDatabase

	Dialect, Table, Schema string
	Namespace              string
	Topics                 []string
	Tenant                 uuid.UUID
	Delivery               string
	ReplicationDSN, Slot   string

	Ordered             bool
	BatchSize           int
	Lease               time.Duration
	PollInterval        time.Duration
	MaxAttempts         int
	RetryBase           time.Duration
	RetryMax            time.Duration
	Concurrency         int
	CircuitProbeMin     time.Duration
	CircuitProbeMax     time.Duration
	MaxInFlight         int
	IdleProbesPerSecond float64
	DrainTimeout        time.Duration
	WatchInterval       time.Duration

	LogFormat, LogLevel string
	UI, UIReadOnly      bool
	UIToken             string
}

// relayDatabase is one database the relay serves: a [[database]] table of the file, or one
// --dsn (OUTBOX_DSN, a line of --dsn-file) with the top-level settings.
type relayDatabase struct {
	Name           string `toml:"name"`
	DSN            string `toml:"dsn"`
	Dialect        string `toml:"dialect"`
	Table          string `toml:"table"`
	Schema         string `toml:"schema"`
	Namespace      string `toml:"namespace"`
	Delivery       string `toml:"delivery"`
	ReplicationDSN string `toml:"replication_dsn"`
	Slot           string `toml:"slot"`
	// where says where it was given, for messages: "database 2 of relay.toml", "--dsn 1".
	where string
}

// relayKey is one setting: its file key, flag and environment variable, its default and
// how a value given as text is applied. The list is the reference docs/relay.md prints.
type relayKey struct {
	key, flag, env, def, help string
	// global: the flag is one of the command's global flags (--dsn, --namespace, ...),
	// read from cli.global rather than registered again.
	global bool
	set    func(c *relayConfig, v string) error
}

func durationKey(f func(c *relayConfig) *time.Duration) func(*relayConfig, string) error {
	return func(c *relayConfig, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("%q is not a duration (such as 30s, 5m)", v)
		}
		*f(c) = d
		return nil
	}
}

func intKey(f func(c *relayConfig) *int) func(*relayConfig, string) error {
	return func(c *relayConfig, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("%q is not a whole number", v)
		}
		*f(c) = n
		return nil
	}
}

func boolKey(f func(c *relayConfig) *bool) func(*relayConfig, string) error {
	return func(c *relayConfig, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("%q is not true or false", v)
		}
		*f(c) = b
		return nil
	}
}

func stringKey(f func(c *relayConfig) *string) func(*relayConfig, string) error {
	return func(c *relayConfig, v string) error { *f(c) = v; return nil }
}

func oneOf(f func(c *relayConfig) *string, allowed ...string) func(*relayConfig, string) error {
	return func(c *relayConfig, v string) error {
		if !slices.Contains(allowed, v) {
			return fmt.Errorf("%q is not one of %s", v, strings.Join(allowed, ", "))
		}
		*f(c) = v
		return nil
	}
}

// relayKeys are the settings of outbox relay, in the order the reference lists them.
var relayKeys = []relayKey{
	{key: "broker", flag: "broker", env: "OUTBOX_BROKER", help: "where to publish, a URL: nats://, kafka://, amqp://, amqps://, redis://, rediss://, https:// or http:// (a webhook). Required",
		set: stringKey(func(c *relayConfig) *string { return &c.Broker })},
	{key: "broker_options", flag: "broker-opt", env: "OUTBOX_BROKER_OPTIONS", help: "the transport's options (see Transports): a [broker_options] table of the file, --broker-opt name=value (repeatable), or name=value,name=value in the variable; they win over the broker URL's query",
		set: func(c *relayConfig, v string) error {
			for kv := range strings.SplitSeq(v, ",") {
				name, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
				if !ok || name == "" {
					return fmt.Errorf("%q is not name=value,name=value", v)
				}
				c.BrokerOptions[name] = val
			}
			return nil
		}},
	{key: "database", flag: "dsn", env: "OUTBOX_DSN", global: true, help: "a database to serve: [[database]] tables in the file (name, dsn, dialect, table, schema, namespace, delivery, replication_dsn, slot); --dsn (repeatable) or the variable replace them"},
	{key: "dsn_file", flag: "dsn-file", env: "OUTBOX_DSN_FILE", global: true, help: "a file of DSNs, one a line, each a database to serve (blank lines and # comments ignored); not a file key: the file lists [[database]] tables"},
	{key: "dialect", flag: "dialect", env: "OUTBOX_DIALECT", global: true, help: "postgres, mysql or sqlite, for DSNs whose form does not tell",
		set: oneOf(func(c *relayConfig) *string { return &c.Dialect }, "", "postgres", "mysql", "sqlite")},
	{key: "table", flag: "table", env: "OUTBOX_TABLE", def: outbox.DefaultTable, global: true, help: "the outbox table of every database",
		set: stringKey(func(c *relayConfig) *string { return &c.Table })},
	{key: "schema", flag: "schema", env: "OUTBOX_SCHEMA", global: true, help: "PostgreSQL: the table's schema",
		set: stringKey(func(c *relayConfig) *string { return &c.Schema })},
	{key: "namespace", flag: "namespace", env: "OUTBOX_NAMESPACE", global: true, help: "the namespace delivered. Required",
		set: stringKey(func(c *relayConfig) *string { return &c.Namespace })},
	{key: "topics", flag: "topic", env: "OUTBOX_TOPICS", global: true, help: "only these topics: a list in the file, --topic (repeatable), comma-separated in the variable. Default every topic",
		set: func(c *relayConfig, v string) error {
			c.Topics = nil
			for t := range strings.SplitSeq(v, ",") {
				if t = strings.TrimSpace(t); t != "" {
					c.Topics = append(c.Topics, t)
				}
			}
			return nil
		}},
	{key: "tenant", flag: "tenant", env: "OUTBOX_TENANT", global: true, help: "only rows of this tenant id (a UUID)",
		set: func(c *relayConfig, v string) error {
			if v == "" {
				c.Tenant = uuid.Nil
				return nil
			}
			id, err := parseID(v)
			if err != nil {
				return err
			}
			c.Tenant = id
			return nil
		}},
	{key: "delivery", flag: "delivery", env: "OUTBOX_DELIVERY", def: "poll", help: "poll (claim from the table) or log (PostgreSQL's write-ahead log or the MySQL/MariaDB binlog, with polling for retries); per database in the file",
		set: oneOf(func(c *relayConfig) *string { return &c.Delivery }, "poll", "log")},
	{key: "replication_dsn", flag: "replication-dsn", env: "OUTBOX_REPLICATION_DSN", help: "log delivery: the replication connection (PostgreSQL: a role with REPLICATION; MySQL: a user with REPLICATION SLAVE and REPLICATION CLIENT). Default the database's DSN",
		set: stringKey(func(c *relayConfig) *string { return &c.ReplicationDSN })},
	{key: "slot", flag: "slot", env: "OUTBOX_SLOT", help: "log delivery: the replication slot (PostgreSQL) or the binlog reader's name (MySQL). Default outbox_<table>",
		set: stringKey(func(c *relayConfig) *string { return &c.Slot })},
	{key: "ordered", flag: "ordered", env: "OUTBOX_ORDERED", def: "false", help: "deliver each partition key's events in order (the table needs the ordered migrations)",
		set: boolKey(func(c *relayConfig) *bool { return &c.Ordered })},
	{key: "batch_size", flag: "batch-size", env: "OUTBOX_BATCH_SIZE", def: strconv.Itoa(outbox.DefaultBatchSize), help: "rows per claim and per publish",
		set: intKey(func(c *relayConfig) *int { return &c.BatchSize })},
	{key: "lease", flag: "lease", env: "OUTBOX_LEASE", def: outbox.DefaultLease.String(), help: "how long a claim holds its rows before another relay may take them",
		set: durationKey(func(c *relayConfig) *time.Duration { return &c.Lease })},
	{key: "poll_interval", flag: "poll-interval", env: "OUTBOX_POLL_INTERVAL", def: outbox.DefaultPollInterval.String(), help: "pause after an empty claim (at most lease/3)",
		set: durationKey(func(c *relayConfig) *time.Duration { return &c.PollInterval })},
	{key: "max_attempts", flag: "max-attempts", env: "OUTBOX_MAX_ATTEMPTS", def: strconv.Itoa(outbox.DefaultRetryPolicy().MaxAttempts), help: "attempts before a row is dead",
		set: intKey(func(c *relayConfig) *int { return &c.MaxAttempts })},
	{key: "retry_base", flag: "retry-base", env: "OUTBOX_RETRY_BASE", def: outbox.DefaultRetryPolicy().BaseDelay.String(), help: "first retry delay, doubled per attempt",
		set: durationKey(func(c *relayConfig) *time.Duration { return &c.RetryBase })},
	{key: "retry_max", flag: "retry-max", env: "OUTBOX_RETRY_MAX", def: outbox.DefaultRetryPolicy().MaxDelay.String(), help: "longest retry delay",
		set: durationKey(func(c *relayConfig) *time.Duration { return &c.RetryMax })},
	{key: "concurrency", flag: "concurrency", env: "OUTBOX_CONCURRENCY", def: "1", help: "publish calls in flight per database",
		set: intKey(func(c *relayConfig) *int { return &c.Concurrency })},
	{key: "circuit_probe_min", flag: "circuit-probe-min", env: "OUTBOX_CIRCUIT_PROBE_MIN", def: outbox.DefaultProbeMin.String(), help: "after a batch failed as a whole because the broker was unreachable, the pause before the first probe",
		set: durationKey(func(c *relayConfig) *time.Duration { return &c.CircuitProbeMin })},
	{key: "circuit_probe_max", flag: "circuit-probe-max", env: "OUTBOX_CIRCUIT_PROBE_MAX", def: outbox.DefaultProbeMax.String(), help: "the longest pause between probes: how long delivery may wait once the broker is back",
		set: durationKey(func(c *relayConfig) *time.Duration { return &c.CircuitProbeMax })},
	{key: "max_in_flight", flag: "max-in-flight", env: "OUTBOX_MAX_IN_FLIGHT", def: strconv.Itoa(outbox.DefaultRelayMaxInFlight), help: "claims and batches under way over every database",
		set: intKey(func(c *relayConfig) *int { return &c.MaxInFlight })},
	{key: "idle_probes_per_second", flag: "idle-probes-per-second", env: "OUTBOX_IDLE_PROBES_PER_SECOND", def: strconv.Itoa(outbox.DefaultRelayIdleProbesPerSecond), help: "idle claims a second over every database",
		set: func(c *relayConfig, v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f <= 0 {
				return fmt.Errorf("%q is not a positive number", v)
			}
			c.IdleProbesPerSecond = f
			return nil
		}},
	{key: "drain_timeout", flag: "drain-timeout", env: "OUTBOX_DRAIN_TIMEOUT", def: "20s", help: "on SIGTERM or SIGINT, how long batches in flight may take to be published and settled; the process exits within this and 5s more",
		set: durationKey(func(c *relayConfig) *time.Duration { return &c.DrainTimeout })},
	{key: "listen", flag: "listen", env: "OUTBOX_LISTEN", def: ":9090", help: "address of /healthz, /readyz, /metrics and the web view; \"off\" serves none",
		set: stringKey(func(c *relayConfig) *string { return &c.Listen })},
	{key: "watch_interval", flag: "watch-interval", env: "OUTBOX_WATCH_INTERVAL", def: "15s", help: "how often the backlog gauges of /metrics read each database (one query)",
		set: durationKey(func(c *relayConfig) *time.Duration { return &c.WatchInterval })},
	{key: "log_format", flag: "log-format", env: "OUTBOX_LOG_FORMAT", def: "json", help: "json or text, on stderr",
		set: oneOf(func(c *relayConfig) *string { return &c.LogFormat }, "json", "text")},
	{key: "log_level", flag: "log-level", env: "OUTBOX_LOG_LEVEL", def: "info", help: "debug, info, warn or error",
		set: oneOf(func(c *relayConfig) *string { return &c.LogLevel }, "debug", "info", "warn", "error")},
	{key: "ui", flag: "ui", env: "OUTBOX_UI", def: "false", help: "serve the web view under /ui/ on the listen address",
		set: boolKey(func(c *relayConfig) *bool { return &c.UI })},
	{key: "ui_token", flag: "ui-token", env: "OUTBOX_UI_TOKEN", help: "token the web view requires (at least 16 characters); required when the listen address is not loopback",
		set: stringKey(func(c *relayConfig) *string { return &c.UIToken })},
	{key: "ui_read_only", flag: "ui-read-only", env: "OUTBOX_UI_READ_ONLY", def: "false", help: "the web view shows no replay or discard",
		set: boolKey(func(c *relayConfig) *bool { return &c.UIReadOnly })},
}

// relayFlags registers the relay's own flags (the global ones are registered already):
// each records its raw value in given, so that flags are applied last, after the file
// and the environment.
func relayFlags(fs interface {
	Func(name, usage string, fn func(string) error)
	BoolFunc(name, usage string, fn func(string) error)
}, given map[string][]string) *string {
	var cfg string
	fs.Func("config", "a TOML file of settings (env OUTBOX_CONFIG)", func(v string) error { cfg = v; return nil })
	for _, k := range relayKeys {
		if k.global {
			continue
		}
		usage := k.help + " (env " + k.env + ")"
		if k.def != "" {
			usage += " (default " + k.def + ")"
		}
		rec := func(v string) error { given[k.flag] = append(given[k.flag], v); return nil }
		if strings.HasSuffix(k.def, "false") && k.set != nil && k.def == "false" {
			fs.BoolFunc(k.flag, usage, rec)
		} else {
			fs.Func(k.flag, usage, rec)
		}
	}
	return &cfg
}

// loadRelayConfig merges defaults, the file, the environment and the flags. Every error
// is a usage error that names the key, variable or flag at fault.
func (c *cli) loadRelayConfig(cfgPath string, given map[string][]string) (*relayConfig, error) {
	rc := newRelayConfig()
	if cfgPath == "" {
		cfgPath = c.env("OUTBOX_CONFIG")
	}
	if cfgPath != "" {
		if err := loadRelayFile(rc, cfgPath); err != nil {
			return nil, err
		}
	}
	for _, k := range relayKeys {
		if k.set == nil {
			continue
		}
		if v, ok := lookupEnv(c.env, k.env); ok {
			if err := k.set(rc, v); err != nil {
				return nil, usagef("%s: %v", k.env, err)
			}
		}
	}
	// Flags last: the relay's own, then the global ones the command already parsed.
	for _, k := range relayKeys {
		if k.set == nil {
			continue
		}
		vals := given[k.flag]
		if k.global {
			vals = c.globalValues(k.flag)
		}
		for _, v := range vals {
			if k.key == "broker_options" {
				name, val, ok := strings.Cut(v, "=")
				if !ok || name == "" {
					return nil, usagef("--broker-opt %q: want name=value", v)
				}
				rc.BrokerOptions[name] = val
				continue
			}
			if err := k.set(rc, v); err != nil {
				return nil, usagef("--%s: %v", k.flag, err)
			}
		}
	}
	dbs, err := c.relayDatabases(rc)
	if err != nil {
		return nil, err
	}
	if dbs != nil {
		rc.Databases = dbs
	}
	return rc, rc.validate()
}

// newRelayConfig returns the defaults.
func newRelayConfig() *relayConfig {
	rc := &relayConfig{BrokerOptions: map[string]string{}}
	for _, k := range relayKeys {
		if k.set != nil && k.def != "" {
			if err := k.set(rc, k.def); err != nil {
				panic(k.key + ": bad default: " + err.Error())
			}
		}
	}
	return rc
}

// lookupEnv reads a variable through the cli's environment; an empty value counts as
// unset, as it does for the command's other variables.
func lookupEnv(env func(string) string, name string) (string, bool) {
	v := env(name)
	return v, v != ""
}

// globalValues returns what the global flag of that name was given on the command line.
func (c *cli) globalValues(flag string) []string {
	g := c.global
	one := func(s string) []string {
		if s == "" {
			return nil
		}
		return []string{s}
	}
	switch flag {
	case "dialect":
		return one(g.dialect)
	case "table":
		return one(g.table)
	case "schema":
		return one(g.schema)
	case "namespace":
		return one(g.namespace)
	case "tenant":
		return one(g.tenant)
	case "topic":
		if len(g.topics) == 0 {
			return nil
		}
		return []string{strings.Join(g.topics, ",")}
	}
	return nil
}

// relayDatabases returns the databases the flags or the environment give, in that order
// of precedence (nil when neither does: the file's stand).
func (c *cli) relayDatabases(rc *relayConfig) ([]relayDatabase, error) {
	var dbs []relayDatabase
	if len(c.global.dsns) > 0 || c.global.dsnFile != "" {
		srcs, err := c.sources()
		if err != nil {
			return nil, err
		}
		for _, s := range srcs {
			dbs = append(dbs, relayDatabase{DSN: s.dsn, where: s.where})
		}
		return dbs, nil
	}
	if f := c.env("OUTBOX_DSN_FILE"); f != "" {
		saved := c.global.dsnFile
		c.global.dsnFile = f
		srcs, err := c.sources()
		c.global.dsnFile = saved
		if err != nil {
			return nil, usagef("OUTBOX_DSN_FILE: %v", err)
		}
		for _, s := range srcs {
			dbs = append(dbs, relayDatabase{DSN: s.dsn, where: s.where})
		}
		return dbs, nil
	}
	if d := c.env("OUTBOX_DSN"); d != "" {
		return []relayDatabase{{DSN: d, where: "OUTBOX_DSN"}}, nil
	}
	return nil, nil
}

// loadRelayFile applies a TOML file: top-level keys of relayKeys, a [broker_options] table
// and [[database]] tables. An unknown key is an error, so that a misspelt one is not
// silently ignored.
func loadRelayFile(rc *relayConfig, path string) error {
	var raw map[string]any
	if _, err := toml.DecodeFile(path, &raw); err != nil {
		return usagef("config file %s: %v", path, err)
	}
	keys := map[string]relayKey{}
	for _, k := range relayKeys {
		keys[k.key] = k
	}
	for _, name := range slices.Sorted(maps.Keys(raw)) {
		v := raw[name]
		switch name {
		case "broker_options":
			tbl, ok := v.(map[string]any)
			if !ok {
				return usagef("config file %s: broker_options must be a table ([broker_options])", path)
			}
			for k, val := range tbl {
				rc.BrokerOptions[k] = fmt.Sprint(val)
			}
			continue
		case "database":
			list, ok := v.([]map[string]any)
			if !ok {
				return usagef("config file %s: database must be tables ([[database]])", path)
			}
			for i, t := range list {
				var db relayDatabase
				if err := decodeDatabase(t, &db); err != nil {
					return usagef("config file %s: database %d: %v", path, i+1, err)
				}
				db.where = fmt.Sprintf("database %d of %s", i+1, path)
				rc.Databases = append(rc.Databases, db)
			}
			continue
		case "dsn_file":
			return usagef("config file %s: dsn_file: list the databases as [[database]] tables in the file", path)
		}
		k, ok := keys[name]
		if !ok || k.set == nil {
			return usagef("config file %s: unknown key %q (see docs/relay.md for the keys)", path, name)
		}
		var s string
		switch x := v.(type) {
		case string:
			s = x
		case int64, bool, float64:
			s = fmt.Sprint(x)
		case []any:
			parts := make([]string, len(x))
			for i, e := range x {
				parts[i] = fmt.Sprint(e)
			}
			s = strings.Join(parts, ",")
		default:
			return usagef("config file %s: %s: unexpected %T", path, name, v)
		}
		if err := k.set(rc, s); err != nil {
			return usagef("config file %s: %s: %v", path, name, err)
		}
	}
	return nil
}

// decodeDatabase reads one [[database]] table, refusing unknown keys.
func decodeDatabase(t map[string]any, db *relayDatabase) error {
	fields := map[string]*string{"name": &db.Name, "dsn": &db.DSN, "dialect": &db.Dialect, "table": &db.Table,
		"schema": &db.Schema, "namespace": &db.Namespace, "delivery": &db.Delivery,
		"replication_dsn": &db.ReplicationDSN, "slot": &db.Slot}
	for _, k := range slices.Sorted(maps.Keys(t)) {
		p, ok := fields[k]
		if !ok {
			return fmt.Errorf("unknown key %q (name, dsn, dialect, table, schema, namespace, delivery, replication_dsn, slot)", k)
		}
		s, ok := t[k].(string)
		if !ok {
			return fmt.Errorf("%s must be a string", k)
		}
		*p = s
	}
	return nil
}

// validate checks what can be checked without a connection.
func (rc *relayConfig) validate() error {
	if rc.Broker == "" {
		return usagef("no broker given: pass --broker (or OUTBOX_BROKER, or broker in the config file), such as nats://127.0.0.1:4222")
	}
	if rc.Namespace == "" {
		return usagef("no namespace given: pass --namespace (or OUTBOX_NAMESPACE, or namespace in the config file)")
	}
	if len(rc.Databases) == 0 {
		return usagef("no database given: pass --dsn (or OUTBOX_DSN, or [[database]] tables in the config file)")
	}
	if rc.Listen != "off" {
		if _, _, err := net.SplitHostPort(rc.Listen); err != nil {
			return usagef("--listen %q: %v (want host:port, or off)", rc.Listen, err)
		}
	}
	if rc.UI {
		if rc.Listen == "off" {
			return usagef("--ui needs a --listen address")
		}
		loopback, _ := isLoopback(rc.Listen)
		if !loopback && rc.UIToken == "" {
			return usagef("--ui on --listen %s is reachable from other machines: give --ui-token (or OUTBOX_UI_TOKEN)", rc.Listen)
		}
		if rc.UIToken != "" && len(rc.UIToken) < 16 {
			return usagef("--ui-token must be at least 16 characters")
		}
	}
	if rc.DrainTimeout <= 0 {
		return usagef("--drain-timeout must be above zero")
	}
	if rc.WatchInterval < 100*time.Millisecond {
		return usagef("--watch-interval must be at least 100ms")
	}
	names := map[string]bool{}
	for i := range rc.Databases {
		db := &rc.Databases[i]
		if db.DSN == "" {
			return usagef("%s: no dsn", db.where)
		}
		if db.Delivery == "" {
			db.Delivery = rc.Delivery
		}
		if db.Delivery != "poll" && db.Delivery != "log" {
			return usagef("%s: delivery %q is not poll or log", db.where, db.Delivery)
		}
		db.Dialect = cmpOr(db.Dialect, rc.Dialect)
		db.Table = cmpOr(db.Table, rc.Table)
		db.Schema = cmpOr(db.Schema, rc.Schema)
		db.Namespace = cmpOr(db.Namespace, rc.Namespace)
		db.ReplicationDSN = cmpOr(db.ReplicationDSN, rc.ReplicationDSN)
		db.Slot = cmpOr(db.Slot, rc.Slot)
		if _, err := dialect.NewTableIn(db.Schema, db.Table); err != nil {
			return usagef("%s: table: %v", db.where, err)
		}
		if db.Name != "" && names[db.Name] {
			return usagef("%s: name %q is used twice", db.where, db.Name)
		}
		if db.Name != "" {
			names[db.Name] = true
		}
	}
	return nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// fileExists is for the SQLite check: the relay never creates a database.
func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// relayReference renders the settings as the Markdown table of docs/relay.md's reference,
// which a test holds to this list.
func relayReference() string {
	var b strings.Builder
	b.WriteString("| file key | flag | variable | default | meaning |\n|---|---|---|---|---|\n")
	b.WriteString("| | `--config` | `OUTBOX_CONFIG` | | the TOML file of settings |\n")
	for _, k := range relayKeys {
		def := ""
		if k.def != "" {
			def = "`" + k.def + "`"
		}
		key := "`" + k.key + "`"
		if k.key == "dsn_file" {
			key = ""
		}
		fmt.Fprintf(&b, "| %s | `--%s` | `%s` | %s | %s |\n", key, k.flag, k.env, def, strings.ReplaceAll(k.help, "|", "\\|"))
	}
	return b.String()
}
