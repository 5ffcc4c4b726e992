package inbox_test

import (
	"context"
	"database/sql"
	"strconv"
	"testing"
	"time"
)

// BenchmarkProcess compares, on each backend, a consumer transaction that writes one
// business row (raw) with the same transaction run by Process, which also claims the message
// id first. Each iteration runs one of each, alternating which goes first, so that a busy
// machine slows both alike; the metric inbox/raw is the ratio of their total times, the
// inbox's cost per message.
func BenchmarkProcess(b *testing.B) {
	for _, backend := range backends {
		b.Run(backend, func(b *testing.B) {
			e := setup(b, backend)
			ctx := context.Background() // setup's context ends after a minute
			insert := e.bind(`INSERT INTO effects (grp, message_id) VALUES (?, ?)`)
			prefix := randomHex(4) + "-"
			raw := func(id string) {
				tx, err := e.db.BeginTx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := tx.ExecContext(ctx, insert, "raw", id); err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
			}
			processed := func(id string) {
				res, err := e.in.Process(ctx, "billing", id, func(ctx context.Context, tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, insert, "billing", id)
					return err
				})
				if err != nil || res.Duplicate {
					b.Fatal(err, res)
				}
			}
			var tRaw, tInbox time.Duration
			timed := func(d *time.Duration, f func(string), id string) {
				start := time.Now()
				f(id)
				*d += time.Since(start)
			}
			for i := 0; b.Loop(); i++ {
				id := prefix + strconv.Itoa(i)
				if i%2 == 0 {
					timed(&tRaw, raw, id)
					timed(&tInbox, processed, id)
				} else {
					timed(&tInbox, processed, id)
					timed(&tRaw, raw, id)
				}
			}
			b.ReportMetric(float64(tInbox)/float64(tRaw), "inbox/raw")
		})
	}
}
