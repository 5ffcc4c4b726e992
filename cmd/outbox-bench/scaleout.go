package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxgo/outbox"
)

// The scale-out scenario drains one table with 1, 2, 4 and 8 publisher *processes*: the
// bench binary runs itself as children, each with one Publisher (or one raw claim + ack
// loop) on a pool of its own, as a fleet of service instances would. The parent preloads the
// rows, starts the children, lets them go at once, and times the middle 80 % of the drain
// from the children's reports of acknowledged rows.
//
// A child is told what to do by environment variables (childEnv); it speaks a line protocol:
// it prints "ready" once its pool answers, starts on a line "go" on stdin, prints
// "acked <n>" as its count of acknowledged rows grows (at most every 2 ms), and on EOF of
// stdin stops and prints "done <n>".

// childEnv is the variable that makes the bench binary a scale-out child; its value is the
// kind ("library" or "raw"). The others say where and how.
const (
	childEnv        = "OUTBOX_BENCH_CHILD"
	childBackendEnv = "OUTBOX_BENCH_CHILD_BACKEND"
	childDSNEnv     = "OUTBOX_BENCH_CHILD_DSN"
	childTableEnv   = "OUTBOX_BENCH_CHILD_TABLE"
	childBatchEnv   = "OUTBOX_BENCH_CHILD_BATCH"
)

// lockWatcher is a backend that can count the sessions of the bench database that wait for
// a lock (SQLite's writers wait in their busy handler, which nothing outside sees).
type lockWatcher interface {
	lockWaiters(ctx context.Context) (int, error)
}

// scaleOutPoint is one process count: library and raw drains of the same rows, alternated.
type scaleOutPoint struct {
	Procs   int     `json:"processes"`
	N       int     `json:"n"`
	Batch   int     `json:"batch"`
	Library sample  `json:"library"`
	Raw     sample  `json:"raw"`
	Ratio   float64 `json:"library_vs_raw"`
	// LibraryVsOne and RawVsOne are each side's median rate over its own rate with one
	// process: how well it scales out.
	LibraryVsOne float64 `json:"library_vs_one_process"`
	RawVsOne     float64 `json:"raw_vs_one_process"`
	// LibraryLockWaits and RawLockWaits are the sessions found waiting for a lock, on
	// average over samples taken every 20 ms during the drains (PostgreSQL pg_locks,
	// MariaDB INNODB_TRX); -1 where the backend cannot tell.
	LibraryLockWaits float64 `json:"library_lock_waits"`
	RawLockWaits     float64 `json:"raw_lock_waits"`
}

// runScaleOut measures every process count of cfg.ScaleProcs.
func runScaleOut(ctx context.Context, cfg config, b backend, res *backendResult) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	// Warm-up: one small drain of each with two processes.
	for _, kind := range []string{kindRaw, "library"} {
		if _, _, err := scaleDrain(ctx, exe, b, kind, min(cfg.ScaleN, 2000), cfg.Batch, 2); err != nil {
			return err
		}
	}
	var one [2]float64
	for _, procs := range cfg.ScaleProcs {
		var lib, raw, libWaits, rawWaits []float64
		vs := []variant{
			{name: kindRaw, run: func(ctx context.Context) (float64, error) {
				r, w, err := scaleDrain(ctx, exe, b, kindRaw, cfg.ScaleN, cfg.Batch, procs)
				raw, rawWaits = append(raw, r), append(rawWaits, w)
				return r, err
			}},
			{name: "library", run: func(ctx context.Context) (float64, error) {
				r, w, err := scaleDrain(ctx, exe, b, "library", cfg.ScaleN, cfg.Batch, procs)
				lib, libWaits = append(lib, r), append(libWaits, w)
				return r, err
			}},
		}
		if _, err := alternate(ctx, cfg.ScaleRounds, vs); err != nil {
			return err
		}
		p := scaleOutPoint{Procs: procs, N: cfg.ScaleN, Batch: cfg.Batch, Library: summarize(lib), Raw: summarize(raw), Ratio: pairedRatio(lib, raw),
			LibraryLockWaits: median(libWaits), RawLockWaits: median(rawWaits)}
		if procs == 1 {
			one = [2]float64{p.Library.Median, p.Raw.Median}
		}
		if one[0] > 0 {
			p.LibraryVsOne, p.RawVsOne = p.Library.Median/one[0], p.Raw.Median/one[1]
		}
		logf("%s: scale-out p=%d n=%d b=%d: library %.0f rows/s (%.2f× one process), raw %.0f rows/s (%.2f×): %.3f (pairs %s); sessions waiting for a lock: library %.2f, raw %.2f",
			b.name(), procs, cfg.ScaleN, cfg.Batch, p.Library.Median, p.LibraryVsOne, p.Raw.Median, p.RawVsOne, p.Ratio, pairRatios(lib, raw),
			p.LibraryLockWaits, p.RawLockWaits)
		res.ScaleOut = append(res.ScaleOut, p)
	}
	return nil
}

// child is one running child process.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // stdout, line by line; closed at EOF
}

// scaleDrain preloads n rows and drains them with procs children of kind; it returns the
// rate over the middle of the drain (the 10th to the 90th percent of the rows).
func scaleDrain(ctx context.Context, exe string, b backend, kind string, n, batch, procs int) (rate, waits float64, err error) {
	waits = -1
	lw, watch := b.(lockWatcher)
	var (
		samples, waiting int
		sampleMu         sync.Mutex
	)
	if watch {
		defer func() {
			sampleMu.Lock()
			defer sampleMu.Unlock()
			if samples > 0 {
				waits = float64(waiting) / float64(samples)
			}
		}()
	}
	rate, err = scaleDrainWatched(ctx, exe, b, kind, n, batch, procs, func(sctx context.Context) {
		if !watch {
			return
		}
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				if w, err := lw.lockWaiters(sctx); err == nil {
					sampleMu.Lock()
					samples, waiting = samples+1, waiting+w
					sampleMu.Unlock()
				}
			}
		}
	})
	return rate, waits, err
}

// scaleDrainWatched is scaleDrain; watch runs during the drain, until its context ends.
func scaleDrainWatched(ctx context.Context, exe string, b backend, kind string, n, batch, procs int, watch func(context.Context)) (float64, error) {
	if err := b.reset(ctx, mainTable); err != nil {
		return 0, err
	}
	if err := preload(ctx, b, mainTable, n); err != nil {
		return 0, fmt.Errorf("preload: %w", err)
	}
	if err := b.maintain(ctx, mainTable); err != nil {
		return 0, err
	}
	driver, dsn := b.childDSN()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	children := make([]*child, 0, procs)
	defer func() {
		for _, c := range children {
			_ = c.stdin.Close()
			_ = c.cmd.Wait()
		}
	}()
	for range procs {
		cmd := exec.CommandContext(cctx, exe)
		cmd.Env = append(os.Environ(), childEnv+"="+kind, childBackendEnv+"="+driver, childDSNEnv+"="+dsn,
			childTableEnv+"="+mainTable, childBatchEnv+"="+strconv.Itoa(batch))
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return 0, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return 0, err
		}
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		c := &child{cmd: cmd, stdin: stdin, lines: make(chan string, 64)}
		go func() {
			defer close(c.lines)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				c.lines <- sc.Text()
			}
		}()
		children = append(children, c)
	}
	timeout := time.NewTimer(time.Duration(max(120, n/200)) * time.Second)
	defer timeout.Stop()
	for i, c := range children {
		select {
		case l, ok := <-c.lines:
			if !ok || l != "ready" {
				return 0, fmt.Errorf("child %d of %d: %q before ready", i+1, procs, l)
			}
		case <-timeout.C:
			return 0, errors.New("children not ready in time")
		}
	}

	for _, c := range children {
		if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
			return 0, err
		}
	}
	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() { defer close(watched); watch(wctx) }()
	defer func() { stopWatch(); <-watched }()
	// Merge the children's counts until they add up to n.
	type report struct {
		i     int
		acked int64
		eof   bool
	}
	reports := make(chan report, procs*4)
	var wg sync.WaitGroup
	stopReading := make(chan struct{})
	var finals = make([]int64, procs)
	var finalsMu sync.Mutex
	for i, c := range children {
		wg.Go(func() {
			for l := range c.lines {
				if v, ok := strings.CutPrefix(l, "acked "); ok {
					x, _ := strconv.ParseInt(v, 10, 64)
					select {
					case reports <- report{i: i, acked: x}:
					case <-stopReading:
					}
				} else if v, ok := strings.CutPrefix(l, "done "); ok {
					x, _ := strconv.ParseInt(v, 10, 64)
					finalsMu.Lock()
					finals[i] = x
					finalsMu.Unlock()
				}
			}
			select {
			case reports <- report{i: i, eof: true}:
			case <-stopReading:
			}
		})
	}
	// The rate is taken over the middle of the drain, from the 10th to the 90th percent of
	// the rows: a fleet starts once and runs for hours, so the start (each process's first
	// check and claim, 8 at once on a small machine) and the tail (the last batches, fewer
	// than the processes) are left out, on both sides alike.
	lo, hi := int64(n)/10, int64(n)*9/10
	var tLo time.Time
	acked := make([]int64, procs)
	var elapsed time.Duration
	for elapsed == 0 {
		select {
		case r := <-reports:
			if r.eof {
				close(stopReading)
				return 0, fmt.Errorf("child %d of %d exited during the drain", r.i+1, procs)
			}
			acked[r.i] = r.acked
			var sum int64
			for _, a := range acked {
				sum += a
			}
			if tLo.IsZero() && sum >= lo {
				tLo = time.Now()
			}
			if sum >= hi && !tLo.IsZero() && elapsed == 0 {
				elapsed = time.Since(tLo)
			}
		case <-timeout.C:
			close(stopReading)
			return 0, fmt.Errorf("%d %s processes acknowledged %v of %d rows in time", procs, kind, acked, n)
		case <-ctx.Done():
			close(stopReading)
			return 0, ctx.Err()
		}
	}
	for sum := int64(0); sum < int64(n); {
		select {
		case r := <-reports:
			if r.eof {
				close(stopReading)
				return 0, fmt.Errorf("child %d of %d exited during the drain", r.i+1, procs)
			}
			acked[r.i] = r.acked
			sum = 0
			for _, a := range acked {
				sum += a
			}
		case <-timeout.C:
			close(stopReading)
			return 0, fmt.Errorf("%d %s processes acknowledged %v of %d rows in time", procs, kind, acked, n)
		case <-ctx.Done():
			close(stopReading)
			return 0, ctx.Err()
		}
	}
	close(stopReading)
	for _, c := range children {
		_ = c.stdin.Close()
	}
	wg.Wait() // every child's stdout at EOF: read whole before Wait closes it
	var waitErr error
	for i, c := range children {
		if err := c.cmd.Wait(); err != nil && waitErr == nil {
			waitErr = fmt.Errorf("child %d of %d: %w", i+1, procs, err)
		}
	}
	children = nil
	if waitErr != nil {
		return 0, waitErr
	}
	var total int64
	for _, f := range finals {
		total += f
	}
	delivered, rows, err := countStatus(ctx, b.admin(), mainTable)
	if err != nil {
		return 0, err
	}
	if total != int64(n) || delivered != int64(n) || rows != int64(n) {
		return 0, fmt.Errorf("%d %s processes acknowledged %d rows (each %v); %d of %d rows delivered", procs, kind, total, finals, delivered, rows)
	}
	return float64(hi-lo) / elapsed.Seconds(), nil
}

// runChild is the bench binary as a scale-out child (its environment says so). It returns
// the process's exit code.
// childBackend is the backend of a child process's driver, for its dialect and its
// hand-written SQL.
func childBackend(driver string) (backend, error) {
	switch driver {
	case "pgx":
		return &pgBackend{}, nil
	case "mysql":
		return &myBackend{}, nil
	case "sqlite":
		return &liteBackend{}, nil
	}
	return nil, fmt.Errorf("unknown driver %q", driver)
}

func runChild() int {
	err := child1(context.Background(), os.Getenv(childEnv), os.Getenv(childBackendEnv), os.Getenv(childDSNEnv),
		os.Getenv(childTableEnv), os.Getenv(childBatchEnv))
	if err != nil {
		fmt.Fprintf(os.Stderr, "outbox-bench child %d: %v\n", os.Getpid(), err)
		return 1
	}
	return 0
}

func child1(ctx context.Context, kind, driver, dsn, table, batchArg string) error {
	batch, err := strconv.Atoi(batchArg)
	if err != nil {
		return fmt.Errorf("batch %q: %w", batchArg, err)
	}
	b, err := childBackend(driver)
	if err != nil {
		return err
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	// Enough for the Publisher's claim loop, its settles and (PostgreSQL) its listener;
	// the raw loop uses one.
	db.SetMaxOpenConns(4)
	db.SetMaxIdleConns(4)
	if err := db.PingContext(ctx); err != nil {
		return err
	}
	out := bufio.NewWriter(os.Stdout)
	say := func(format string, args ...any) {
		fmt.Fprintf(out, format+"\n", args...)
		_ = out.Flush()
	}
	say("ready")
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() || in.Text() != "go" {
		return errors.New("no go")
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	stdinClosed := make(chan struct{})
	go func() {
		for in.Scan() {
		}
		close(stdinClosed)
		stop()
	}()

	var acked atomic.Int64
	// Report the count as it grows, at most every 2 ms.
	reported := make(chan struct{})
	go func() {
		defer close(reported)
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		var last int64
		for {
			select {
			case <-t.C:
				if a := acked.Load(); a != last {
					last = a
					say("acked %d", a)
				}
			case <-rctx.Done():
				return
			}
		}
	}()
	switch kind {
	case "library":
		err = childPublisher(rctx, b, db, table, batch, &acked)
	case kindRaw:
		err = childRaw(rctx, b, db, table, batch, &acked)
		<-stdinClosed
	default:
		err = fmt.Errorf("unknown kind %q", kind)
	}
	stop()
	<-reported
	if err != nil {
		return err
	}
	say("done %d", acked.Load())
	return nil
}

// childPublisher runs one Publisher (one claim loop) until ctx ends, counting its
// acknowledged rows into acked.
func childPublisher(ctx context.Context, b backend, db *sql.DB, table string, batch int, acked *atomic.Int64) error {
	store, err := outbox.New(db, b.dialect(), outbox.Options{Table: table})
	if err != nil {
		return err
	}
	noop := outbox.TransportFunc(func(context.Context, []outbox.Delivery) []error { return nil })
	pub, err := outbox.NewPublisher(store, noop, outbox.PublisherOptions{
		Scope: outbox.Scope{Namespace: benchNamespace}, BatchSize: batch, Concurrency: 1, Logger: discard,
	})
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- pub.Run(ctx) }()
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			st := pub.Stats()
			acked.Store(st.Delivered)
			if st.Errors > 0 {
				return fmt.Errorf("publisher reported %d errors", st.Errors)
			}
			return err
		case <-t.C:
			acked.Store(pub.Stats().Delivered)
		}
	}
}

// childRaw runs the raw claim + ack loop until a claim finds nothing.
func childRaw(ctx context.Context, b backend, db *sql.DB, table string, batch int, acked *atomic.Int64) error {
	r := b.raw(table)
	worker := "raw-" + strconv.Itoa(os.Getpid())
	for {
		got, err := claimAck(ctx, r, db, batch, worker)
		if ctx.Err() != nil {
			return nil // the parent counted every row and stopped the children
		}
		if err != nil {
			return err
		}
		if got == 0 {
			return nil
		}
		acked.Add(int64(got))
	}
}
