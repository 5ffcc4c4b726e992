package main

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxgo/outbox"
)

const statsUsage = `  outbox stats [--namespace NS] [--topic T]... [--tenant ID] [--slot S]... [--json]
  outbox stats --dsn DSN --dsn DSN... | --dsn-file F [--timeout D] [--json]

Counts rows by state: pending (due now), scheduled (pending, not yet due), processing,
delivered and dead, the age of the oldest due pending row and of the oldest undelivered
one since it was first due (alert on that one: it grows whenever an event waits, a broker
outage included; the oldest pending age stays low through an outage), overall
and per namespace and topic. Up to 2,000 delivered rows every count is exact; beyond,
per-topic delivered counts are exact since the time printed, and the total delivered is an
estimate, marked ~. Given several databases (--dsn more than once, or --dsn-file with one DSN a
line), prints a row per database and their total; a database that cannot be read is
reported in its row, and the command then exits with 1.

When the table is delivered from the database's log, a second table shows each log reader:
PostgreSQL's replication slots of the table (the default outbox_<table> and those named like
a publication of the table, or the --slot ones), active or not, how far each is behind the
server's WAL and how much WAL it retains, and its wal_status; MySQL/MariaDB's stored binlog
positions, how far each is behind the end of the binlog, and whether its binlog file was
purged. A state that cannot be read (a user without REPLICATION CLIENT, say) is reported
under the counts, and does not fail the command.`

// statsJSON is the stats document. Its keys are part of the command's interface.
type statsJSON struct {
	countsJSON
	// DeliveredSince, when set, is the time after which every per-topic delivered count
	// (and a scoped total) is exact; null when they count every delivered row.
	DeliveredSince *time.Time       `json:"delivered_since"`
	Topics         []topicStatsJSON `json:"topics"`
	// Log is the state of the table's log readers, absent when it has none; LogError,
	// when set, is why it could not be read.
	Log      []logReaderJSON `json:"log,omitempty"`
	LogError string          `json:"log_error,omitempty"`
}

type topicStatsJSON struct {
	Namespace string `json:"namespace"`
	Topic     string `json:"topic"`
	countsJSON
}

type countsJSON struct {
	Pending                 int64   `json:"pending"`
	Scheduled               int64   `json:"scheduled"`
	Processing              int64   `json:"processing"`
	Delivered               int64   `json:"delivered"`
	Dead                    int64   `json:"dead"`
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
	// OldestUndeliveredAgeSeconds counts from when the oldest undelivered row was first
	// due, whatever retries and outage probes did since: the figure to alert on.
	OldestUndeliveredAgeSeconds float64 `json:"oldest_undelivered_age_seconds"`
	// DeliveredEstimated says that delivered is an estimate: on a large table, counting
	// every delivered row would make stats slow. Per-topic counts are never estimates.
	DeliveredEstimated bool `json:"delivered_estimated"`
}

func runStats(ctx context.Context, c *cli, args []string) error {
	fs := c.flagSet("stats")
	timeout := fs.Duration("timeout", defaultStatsTimeout, "several databases: how long each may take to connect and count before its row reports an error")
	var slots []string
	fs.Func("slot", "the log reader to show: a PostgreSQL slot, a MySQL/MariaDB reader's name (repeatable; default the table's)", func(s string) error {
		slots = append(slots, s)
		return nil
	})
	pos, err := c.parse(fs, statsUsage, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("stats takes no arguments, got %q", pos[0])
	}
	if *timeout <= 0 {
		return usagef("--timeout must be positive, got %s", *timeout)
	}
	sc, err := c.scope()
	if err != nil {
		return err
	}
	if len(c.global.dsns) > 1 || c.global.dsnFile != "" {
		return c.statsMany(ctx, sc, slots, *timeout)
	}
	cn, err := c.connect(ctx, needTable)
	if err != nil {
		return err
	}
	defer cn.Close()
	st, err := cn.store.Stats(ctx, sc)
	if err != nil {
		return fmt.Errorf("stats of %s: %w", cn.table.Name(), err)
	}
	logs, logErr := readLogState(ctx, cn, slots)
	if c.global.json {
		doc := statsDocument(st)
		doc.Log = logs
		if logErr != nil {
			doc.LogError = c.rowError(logErr)
		}
		c.printJSON(doc)
		return nil
	}
	printStats(c, st)
	var rows []logRow
	for _, r := range logs {
		rows = append(rows, logRow{r: r})
	}
	printLog(c, rows, false)
	if logErr != nil {
		fmt.Fprintf(c.stdout, "log readers: cannot read their state: %s\n", c.rowError(logErr))
	}
	return nil
}

// statsDocument is st as the stats document.
func statsDocument(st outbox.Stats) statsJSON {
	out := statsJSON{
		countsJSON: countsJSON{st.Pending, st.Scheduled, st.Processing, st.Delivered, st.Dead, st.OldestPendingAge.Seconds(),
			st.OldestUndeliveredAge.Seconds(), st.DeliveredEstimated},
		DeliveredSince: timePtr(st.DeliveredSince),
		Topics:         make([]topicStatsJSON, 0, len(st.Topics)),
	}
	for _, t := range st.Topics {
		out.Topics = append(out.Topics, topicStatsJSON{Namespace: t.Namespace, Topic: t.Topic,
			countsJSON: countsJSON{t.Pending, t.Scheduled, t.Processing, t.Delivered, t.Dead, t.OldestPendingAge.Seconds(),
				t.OldestUndeliveredAge.Seconds(), false}})
	}
	return out
}

func printStats(c *cli, st outbox.Stats) {
	tw := c.table()
	fmt.Fprintln(tw, "NAMESPACE\tTOPIC\tPENDING\tSCHEDULED\tPROCESSING\tDELIVERED\tDEAD\tOLDEST PENDING\tOLDEST UNDELIVERED")
	for _, t := range st.Topics {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%d\t%s\t%s\n", t.Namespace, t.Topic,
			t.Pending, t.Scheduled, t.Processing, since(t.Delivered, st.DeliveredSince), t.Dead, age(t.OldestPendingAge), age(t.OldestUndeliveredAge))
	}
	total := deliveredCell(st)
	fmt.Fprintf(tw, "total\t\t%d\t%d\t%d\t%s\t%d\t%s\t%s\n",
		st.Pending, st.Scheduled, st.Processing, total, st.Dead, age(st.OldestPendingAge), age(st.OldestUndeliveredAge))
	_ = tw.Flush()
	deliveredNotes(c, st.DeliveredEstimated, st.DeliveredSince)
}

// since formats an exact delivered count, marking one over a window with "*".
func since(n int64, t time.Time) string {
	if t.IsZero() {
		return fmt.Sprint(n)
	}
	return fmt.Sprintf("%d*", n)
}

// deliveredNotes explains the marks of the delivered column.
func deliveredNotes(c *cli, estimated bool, t time.Time) {
	if !t.IsZero() {
		fmt.Fprintf(c.stdout, "* delivered since %s (exact; too many delivered rows to count them all quickly)\n", t.UTC().Format(time.RFC3339))
	}
	if estimated {
		fmt.Fprintln(c.stdout, "~ total delivered is an estimate from the database's statistics")
	}
}

// delivered formats a delivered count, marking an estimate with "~".
func delivered(n int64, estimated bool) string {
	if estimated {
		return fmt.Sprintf("~%d", n)
	}
	return fmt.Sprint(n)
}

// age formats a duration for a table: "-" for zero, else rounded to what a person reads.
func age(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}
