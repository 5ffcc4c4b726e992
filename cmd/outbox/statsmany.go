package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

const (
	// defaultStatsTimeout bounds each database of a stats over several: connecting,
	// checking the table and counting.
	defaultStatsTimeout = 30 * time.Second
	// statsParallel is how many databases stats reads at once. Each takes one connection,
	// so this is also the most connections the command holds.
	statsParallel = 8
)

// manyStatsJSON is the stats document over several databases. Its keys are part of the
// command's interface.
type manyStatsJSON struct {
	Databases []databaseStatsJSON `json:"databases"`
	Total     statsJSON           `json:"total"`
}

// databaseStatsJSON is one database's row: its DSN, redacted, and either its counts (the
// keys of the one-database document) or the error that kept them from being read.
type databaseStatsJSON struct {
	DSN string `json:"dsn"`
	*statsJSON
	Error string `json:"error,omitempty"`
}

// source is one DSN of a stats over several databases, and where it was given.
type source struct {
	dsn   string
	where string // "--dsn 2", "file.txt:7"
}

// sources returns the DSNs stats reads: every --dsn, in order, then each line of
// --dsn-file that is neither blank nor a # comment. OUTBOX_DSN is not one of them.
func (c *cli) sources() ([]source, error) {
	var out []source
	for i, d := range c.global.dsns {
		out = append(out, source{dsn: d, where: fmt.Sprintf("--dsn %d", i+1)})
	}
	if f := c.global.dsnFile; f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, usagef("cannot read --dsn-file: %v", err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			out = append(out, source{dsn: line, where: fmt.Sprintf("%s:%d", f, i+1)})
		}
		if len(out) == 0 {
			return nil, usagef("--dsn-file %s holds no DSN (one a line; blank lines and # comments are ignored)", f)
		}
	}
	return out, nil
}

// dbStats is what one database gave: its counts, or why not.
type dbStats struct {
	shown string
	st    outbox.Stats
	err   error
	// logs is the state of the table's log readers, or logErr why it was not read.
	logs   []logReaderJSON
	logErr error
}

// statsMany reads the stats of several databases, statsParallel at a time and each within
// timeout, and prints a row per database and their total. Every DSN is resolved before any
// is opened, so a malformed one is bad input and nothing is read. A database that cannot
// be read is reported in its row; the command then fails (exit 1) after printing them all.
func (c *cli) statsMany(ctx context.Context, sc outbox.Scope, slots []string, timeout time.Duration) error {
	table, err := c.tableName()
	if err != nil {
		return err
	}
	srcs, err := c.sources()
	if err != nil {
		return err
	}
	targets := make([]target, len(srcs))
	for i, s := range srcs {
		// --dialect (or OUTBOX_DIALECT) is for DSNs whose form does not tell, so that one
		// list may hold databases of every kind.
		dialect := ""
		if inferDialect(s.dsn) == "" {
			dialect = c.dialect()
		}
		t, err := resolve(dialect, s.dsn)
		if err != nil {
			return fmt.Errorf("%s: %w", s.where, err)
		}
		targets[i] = t
		c.secrets = append(c.secrets, t.secrets()...)
	}

	results := make([]dbStats, len(targets))
	sem := make(chan struct{}, statsParallel)
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			results[i] = statsOf(ctx, t, table, sc, slots, timeout)
		})
	}
	wg.Wait()

	total, failed := sumStats(results)
	if c.global.json {
		out := manyStatsJSON{Databases: make([]databaseStatsJSON, 0, len(results)), Total: statsDocument(total)}
		for _, r := range results {
			row := databaseStatsJSON{DSN: r.shown}
			if r.err != nil {
				row.Error = c.rowError(r.err)
			} else {
				doc := statsDocument(r.st)
				doc.Log = r.logs
				if r.logErr != nil {
					doc.LogError = c.rowError(r.logErr)
				}
				row.statsJSON = &doc
			}
			out.Databases = append(out.Databases, row)
		}
		c.printJSON(out)
	} else {
		c.printMany(results, total)
	}
	if failed > 0 {
		return &reportedError{msg: fmt.Sprintf("%d of %d databases could not be read (see their rows)", failed, len(results))}
	}
	return nil
}

// statsOf opens one database on one connection, counts, reads its log readers' state
// and closes it, all within timeout.
func statsOf(ctx context.Context, t target, table dialect.Table, sc outbox.Scope, slots []string, timeout time.Duration) dbStats {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	r := dbStats{shown: t.shown}
	r.err = func() error {
		cn, err := open(ctx, t, table, needTable)
		if err != nil {
			return err
		}
		defer cn.Close()
		if r.st, err = cn.store.Stats(ctx, sc); err != nil {
			return fmt.Errorf("stats of %s: %w", table.Name(), err)
		}
		r.logs, r.logErr = readLogState(ctx, cn, slots)
		return nil
	}()
	if r.err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		r.err = fmt.Errorf("no answer within --timeout %s: %w", timeout, r.err)
	}
	return r
}

// sumStats adds up the databases that answered: counts are summed, the oldest pending age
// is the largest, topics are merged by namespace and topic, and delivered counts are
// estimates if any database's are.
func sumStats(results []dbStats) (total outbox.Stats, failed int) {
	topics := map[[2]string]*outbox.TopicStats{}
	for _, r := range results {
		if r.err != nil {
			failed++
			continue
		}
		st := r.st
		total.Pending += st.Pending
		total.Scheduled += st.Scheduled
		total.Processing += st.Processing
		total.Delivered += st.Delivered
		total.Dead += st.Dead
		total.OldestPendingAge = max(total.OldestPendingAge, st.OldestPendingAge)
		total.OldestUndeliveredAge = max(total.OldestUndeliveredAge, st.OldestUndeliveredAge)
		total.DeliveredEstimated = total.DeliveredEstimated || st.DeliveredEstimated
		// Each database counts since its own time; the total since the latest of them at
		// most (its per-topic sums may reach further back in some databases).
		if st.DeliveredSince.After(total.DeliveredSince) {
			total.DeliveredSince = st.DeliveredSince
		}
		for _, t := range st.Topics {
			k := [2]string{t.Namespace, t.Topic}
			sum := topics[k]
			if sum == nil {
				sum = &outbox.TopicStats{Namespace: t.Namespace, Topic: t.Topic}
				topics[k] = sum
			}
			sum.Pending += t.Pending
			sum.Scheduled += t.Scheduled
			sum.Processing += t.Processing
			sum.Delivered += t.Delivered
			sum.Dead += t.Dead
			sum.OldestPendingAge = max(sum.OldestPendingAge, t.OldestPendingAge)
			sum.OldestUndeliveredAge = max(sum.OldestUndeliveredAge, t.OldestUndeliveredAge)
		}
	}
	for _, t := range topics {
		total.Topics = append(total.Topics, *t)
	}
	slices.SortFunc(total.Topics, func(a, b outbox.TopicStats) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Topic, b.Topic))
	})
	return total, failed
}

// printMany prints a row per database, then the total. A database that could not be read
// shows its error in place of counts, in an ERROR column that is there only then.
func (c *cli) printMany(results []dbStats, total outbox.Stats) {
	failed := slices.ContainsFunc(results, func(r dbStats) bool { return r.err != nil })
	tw := c.table()
	head := "DATABASE\tPENDING\tSCHEDULED\tPROCESSING\tDELIVERED\tDEAD\tOLDEST PENDING\tOLDEST UNDELIVERED"
	if failed {
		head += "\tERROR"
	}
	fmt.Fprintln(tw, head)
	for _, r := range results {
		if r.err != nil {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t-\t%s\n", r.shown, c.rowError(r.err))
			continue
		}
		st := r.st
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%d\t%s\t%s\n", r.shown,
			st.Pending, st.Scheduled, st.Processing, deliveredCell(st), st.Dead, age(st.OldestPendingAge), age(st.OldestUndeliveredAge))
	}
	fmt.Fprintf(tw, "total\t%d\t%d\t%d\t%s\t%d\t%s\t%s\n",
		total.Pending, total.Scheduled, total.Processing, deliveredCell(total), total.Dead, age(total.OldestPendingAge), age(total.OldestUndeliveredAge))
	_ = tw.Flush()
	deliveredNotes(c, total.DeliveredEstimated, total.DeliveredSince)
	var logs []logRow
	for _, r := range results {
		for _, l := range r.logs {
			logs = append(logs, logRow{db: r.shown, r: l})
		}
	}
	printLog(c, logs, true)
	for _, r := range results {
		if r.logErr != nil {
			fmt.Fprintf(c.stdout, "%s: log readers: cannot read their state: %s\n", r.shown, c.rowError(r.logErr))
		}
	}
}

// deliveredCell is a total delivered count with its mark: ~ an estimate, * since a time.
func deliveredCell(st outbox.Stats) string {
	if st.DeliveredEstimated {
		return delivered(st.Delivered, true)
	}
	return since(st.Delivered, st.DeliveredSince)
}

// rowError is a database's error as its row shows it: one line, no secrets, the library's
// "outbox: " prefix said once.
func (c *cli) rowError(err error) string {
	return c.scrub(strings.ReplaceAll(oneLine(err.Error()), ": outbox: ", ": "))
}
