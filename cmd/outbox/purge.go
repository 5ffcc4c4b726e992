package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/cmd/outbox/internal/when"
)

const purgeUsage = `  outbox purge [--delivered-older-than D] [--dead-older-than D] [--batch-size N]

Deletes delivered rows last updated more than D ago and dead rows that died more than D ago
(on the database clock), in batches, each its own short transaction; pending and processing
rows are never touched. A kind whose flag is left out is kept. D is a duration such as 72h,
90m or 7d. On a terminal, progress is shown on stderr.`

func runPurge(ctx context.Context, c *cli, args []string) error {
	fs := c.flagSet("purge")
	delivered := fs.String("delivered-older-than", "", "delete delivered rows older than this (72h, 7d)")
	dead := fs.String("dead-older-than", "", "delete dead rows older than this (72h, 7d)")
	batch := fs.Int("batch-size", 0, "rows per batch (default: the library's)")
	pos, err := c.parse(fs, purgeUsage, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("purge takes no arguments, got %q", pos[0])
	}
	if c.filtered() {
		if c.global.namespace == "" && c.env("OUTBOX_NAMESPACE") != "" {
			return usagef("purge applies to the whole table: it takes no namespace, and OUTBOX_NAMESPACE is set (unset it)")
		}
		return usagef("purge applies to the whole table: it takes no --namespace, --topic or --tenant")
	}
	o := outbox.PurgeOptions{BatchSize: *batch}
	if o.DeliveredOlderThan, err = retention("--delivered-older-than", *delivered); err != nil {
		return err
	}
	if o.DeadOlderThan, err = retention("--dead-older-than", *dead); err != nil {
		return err
	}
	if o.DeliveredOlderThan == 0 && o.DeadOlderThan == 0 {
		return usagef("purge needs --delivered-older-than, --dead-older-than or both (run: outbox help purge)")
	}
	if *batch < 0 {
		return usagef("--batch-size must be positive, got %d", *batch)
	}
	cn, err := c.connect(ctx, needTable)
	if err != nil {
		return err
	}
	defer cn.Close()
	progress := c.progress()
	o.Progress = func(r outbox.PurgeResult) {
		if progress != nil {
			fmt.Fprintf(progress, "\rpurging %s: %d delivered, %d dead rows deleted", cn.table.Name(), r.Delivered, r.Dead)
		}
	}
	res, err := cn.store.Purge(ctx, o)
	if progress != nil {
		fmt.Fprintln(progress)
	}
	if err != nil {
		return fmt.Errorf("purge %s (%d delivered and %d dead rows deleted before the error): %w", cn.table.Name(), res.Delivered, res.Dead, err)
	}
	if c.global.json {
		c.printJSON(map[string]int64{"delivered": res.Delivered, "dead": res.Dead})
		return nil
	}
	fmt.Fprintf(c.stdout, "deleted %d delivered and %d dead rows from %s\n", res.Delivered, res.Dead, cn.table.Name())
	return nil
}

// progress returns stderr when it is a terminal, for progress lines, and nil otherwise.
func (c *cli) progress() io.Writer {
	f, ok := c.stderr.(*os.File)
	if !ok {
		return nil
	}
	st, err := f.Stat()
	if err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return nil
	}
	return f
}

func retention(flag, s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := when.Duration(s)
	if err != nil {
		return 0, usagef("invalid %s: %v", flag, err)
	}
	if d <= 0 {
		return 0, usagef("invalid %s: %q must be more than zero (leave the flag out to keep those rows)", flag, s)
	}
	return d, nil
}
