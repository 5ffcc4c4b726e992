package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/outboxgo/outbox/logrepl/mysqlbinlog"
	"github.com/outboxgo/outbox/logrepl/pglog"
)

const logUsage = `  outbox log setup [--slot NAME]   create what delivery from the log reads on the server
  outbox log drop [--slot NAME]    drop it, for a table that goes back to polling only

For deployments whose relay's role may not create them, an administrator sets up the server's
objects of delivery from the log (outbox relay with delivery log) ahead of time:
PostgreSQL: the publication of the table's inserts and the logical replication slot
(pgoutput), both named --slot (default outbox_<table>); the role needs REPLICATION (or
superuser), CREATE on the database and ownership of the table. MySQL/MariaDB: the position
table <table>_binlog_position; the user needs CREATE (DROP to drop it) and REPLICATION CLIENT
(MariaDB 10.5+: BINLOG MONITOR). setup leaves what exists as it is; drop refuses while a
reader is running (an active slot, a held reader lock). Both check the server and the role
first and change nothing when something is missing, saying what. A slot holds WAL back from
the moment it exists, read or not: run setup right before the relay's first start, and drop
a slot nobody will read.`

// logSetupJSON is the log setup and log drop document. Its keys are part of the command's
// interface: PostgreSQL's slot and publication, or MySQL's position table, and whether each
// was created (setup) or dropped (drop).
type logSetupJSON struct {
	Slot               string `json:"slot,omitempty"`
	SlotChanged        *bool  `json:"slot_changed,omitempty"`
	Publication        string `json:"publication,omitempty"`
	PublicationChanged *bool  `json:"publication_changed,omitempty"`
	PositionTable      string `json:"position_table,omitempty"`
	PositionChanged    *bool  `json:"position_table_changed,omitempty"`
}

func runLog(ctx context.Context, c *cli, args []string) error {
	fs := c.flagSet("log")
	slot := fs.String("slot", "", "PostgreSQL: the replication slot and publication (env OUTBOX_SLOT; default outbox_<table>, as outbox relay's slot)")
	pos, err := c.parse(fs, logUsage, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || (pos[0] != "setup" && pos[0] != "drop") {
		return usagef("log needs one of setup, drop (run: outbox help log)")
	}
	verb := pos[0]
	slotSet := *slot != ""
	if !slotSet {
		*slot = c.env("OUTBOX_SLOT")
	}
	cn, err := c.connect(ctx, needTable)
	if err != nil {
		return err
	}
	defer cn.Close()
	var doc logSetupJSON
	var lines []string
	done := map[string]string{"setup": "created", "drop": "dropped"}[verb]
	switch cn.dialect {
	case "postgres":
		o := outboxpglog.Options{ConnString: cn.dsn, Slot: *slot, Logger: slog.New(slog.DiscardHandler)}
		op := outboxpglog.Setup
		if verb == "drop" {
			op = outboxpglog.Drop
		}
		ch, err := op(ctx, cn.store, o)
		if errors.Is(err, outboxpglog.ErrInvalid) {
			return usagef("%v", err)
		}
		if err != nil {
			return fmt.Errorf("log %s: %w", verb, err)
		}
		doc = logSetupJSON{Slot: ch.Slot, SlotChanged: &ch.SlotChanged, Publication: ch.Publication, PublicationChanged: &ch.PublicationChanged}
		lines = append(lines, said(ch.PublicationChanged, done, "publication "+ch.Publication+" of the inserts into "+cn.table.Name()),
			said(ch.SlotChanged, done, "replication slot "+ch.Slot+" (pgoutput)"))
		if verb == "setup" && ch.SlotChanged {
			lines = append(lines, "the slot holds WAL back from now on until a reader confirms past it: start the relay with delivery log, or run outbox log drop")
		}
	case "mysql":
		if slotSet {
			return usagef("--slot names a PostgreSQL slot; on MySQL/MariaDB the position table serves every reader of the table")
		}
		op := outboxbinlog.Setup
		if verb == "drop" {
			op = outboxbinlog.Drop
		}
		changed, err := op(ctx, cn.store)
		if err != nil {
			return fmt.Errorf("log %s: %w", verb, err)
		}
		table := cn.table.Name() + "_binlog_position"
		doc = logSetupJSON{PositionTable: table, PositionChanged: &changed}
		lines = append(lines, said(changed, done, "position table "+table))
	default:
		return usagef("delivery from the log reads PostgreSQL's write-ahead log or the MySQL/MariaDB binlog; SQLite has none to set up")
	}
	if c.global.json {
		c.printJSON(doc)
		return nil
	}
	for _, l := range lines {
		fmt.Fprintln(c.stdout, l)
	}
	return nil
}

// said is one line of log setup or drop: what it did to an object, or that there was
// nothing to do.
func said(changed bool, done, what string) string {
	switch {
	case changed:
		return done + " " + what
	case done == "created":
		return what + " exists already"
	}
	return "no " + what
}
