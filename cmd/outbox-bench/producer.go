package main

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
)

// The producer process of the cross-process latency runs: the bench binary run again with
// producerEnv set, which opens the bench database with a pool and a Store of its own, runs
// the steady producer (produceAt) and prints, for every transaction committed after the
// warm-up, one line "c <unix nanoseconds of the commit's return> <id>...", then "done
// <messages> <transactions> <dropped ticks> <elapsed nanoseconds>". Both processes read
// the same host clock.
const (
	producerEnv       = "OUTBOX_BENCH_PRODUCER" // the rate, in messages a second
	producerDriverEnv = "OUTBOX_BENCH_PRODUCER_DRIVER"
	producerDSNEnv    = "OUTBOX_BENCH_PRODUCER_DSN"
	producerDurEnv    = "OUTBOX_BENCH_PRODUCER_DURATION"
	// producerLogEnv, when set, makes the producer's Store take the insert lease of log
	// delivery (outbox.Options.LogLease).
	producerLogEnv = "OUTBOX_BENCH_PRODUCER_LOG_LEASE"
)

// produceInProcess runs the producer in a process of its own at rate for cfg.LatencyDur and
// records what it committed.
func produceInProcess(ctx context.Context, cfg config, b backend, rate float64, record func(ids []uuid.UUID, at time.Time)) (producerStats, error) {
	driver, dsn := b.childDSN()
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), producerEnv+"="+strconv.FormatFloat(rate, 'f', -1, 64), producerDriverEnv+"="+driver,
		producerDSNEnv+"="+dsn, producerDurEnv+"="+cfg.LatencyDur.String())
	if cfg.logReader != nil {
		cmd.Env = append(cmd.Env, producerLogEnv+"="+logLease.String())
	}
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return producerStats{}, err
	}
	if err := cmd.Start(); err != nil {
		return producerStats{}, err
	}
	var ps producerStats
	var done bool
	var parseErr error
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 3 && f[0] == "c":
			ns, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				parseErr = err
				continue
			}
			ids := make([]uuid.UUID, 0, len(f)-2)
			for _, x := range f[2:] {
				id, err := uuid.Parse(x)
				if err != nil {
					parseErr = err
					continue
				}
				ids = append(ids, id)
			}
			record(ids, time.Unix(0, ns))
		case len(f) == 5 && f[0] == "done":
			var n [4]int64
			for i := range n {
				n[i], _ = strconv.ParseInt(f[i+1], 10, 64)
			}
			ps = producerStats{Messages: n[0], Txs: n[1], Dropped: n[2], Elapsed: time.Duration(n[3])}
			done = true
		}
	}
	if err := cmd.Wait(); err != nil {
		return ps, fmt.Errorf("producer process: %w", err)
	}
	if parseErr != nil {
		return ps, fmt.Errorf("producer process output: %w", parseErr)
	}
	if !done {
		return ps, fmt.Errorf("producer process ended without its totals")
	}
	return ps, nil
}

// runProducer is the producer process's main.
func runProducer() int {
	if err := producer1(context.Background()); err != nil {
		fmt.Fprintf(os.Stderr, "outbox-bench producer %d: %v\n", os.Getpid(), err)
		return 1
	}
	return 0
}

func producer1(ctx context.Context) error {
	rate, err := strconv.ParseFloat(os.Getenv(producerEnv), 64)
	if err != nil {
		return err
	}
	dur, err := time.ParseDuration(os.Getenv(producerDurEnv))
	if err != nil {
		return err
	}
	driver := os.Getenv(producerDriverEnv)
	b, err := childBackend(driver)
	if err != nil {
		return err
	}
	db, err := sql.Open(driver, os.Getenv(producerDSNEnv))
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(latencyProducers)
	db.SetMaxIdleConns(latencyProducers)
	var opts outbox.Options
	if v := os.Getenv(producerLogEnv); v != "" {
		if opts.LogLease, err = time.ParseDuration(v); err != nil {
			return err
		}
	}
	store, err := outbox.New(db, b.dialect(), opts)
	if err != nil {
		return err
	}
	out := bufio.NewWriter(os.Stdout)
	var mu sync.Mutex
	ps, err := produceAt(ctx, config{LatencyDur: dur}, db, store, b.raw(mainTable), rate, func(ids []uuid.UUID, at time.Time) {
		var line strings.Builder
		line.WriteString("c " + strconv.FormatInt(at.UnixNano(), 10))
		for _, id := range ids {
			line.WriteString(" " + id.String())
		}
		mu.Lock()
		fmt.Fprintln(out, line.String())
		mu.Unlock()
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "done %d %d %d %d\n", ps.Messages, ps.Txs, ps.Dropped, int64(ps.Elapsed))
	return out.Flush()
}
