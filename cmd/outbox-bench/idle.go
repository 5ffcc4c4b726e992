package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/outboxgo/outbox"
)

// idleCostResult is what an idle publisher costs the database in one configuration.
type idleCostResult struct {
	Config string `json:"config"`
	// StatementsPerSecond counts what the publisher's pool sent (statements, prepared
	// executions and commits) while idle.
	StatementsPerSecond float64 `json:"statements_per_second"`
	// ServerCPUPercent is the CPU time of the database sessions of the bench database
	// (MySQL: their server threads; PostgreSQL: their backends; SQLite: the bench process,
	// where SQLite runs), in percent of one core.
	ServerCPUPercent float64 `json:"server_cpu_percent"`
	Seconds          float64 `json:"seconds"`
}

// runIdleCost measures an idle publisher's cost: with default options (listening for
// other processes' commits where the dialect can), and, for comparison, polling every
// 10 ms with wake-ups from other processes off (about the latency a listener gives) and
// polling at the default interval with them off (what MySQL and SQLite did before they
// had a listener).
func runIdleCost(ctx context.Context, cfg config, b backend, res *backendResult) error {
	for _, c := range []struct {
		name   string
		poll   time.Duration
		notify bool
	}{
		{"default options", 0, true},
		{"PollInterval 10ms, no cross-process wake-ups", 10 * time.Millisecond, false},
		{"default PollInterval, no cross-process wake-ups", 0, false},
	} {
		r, err := idleCost(ctx, cfg, b, c.poll, c.notify)
		if err != nil {
			return err
		}
		r.Config = c.name
		logf("%s: idle publisher (%s): %.1f statements/s, server CPU %.2f%% of a core", b.name(), c.name, r.StatementsPerSecond, r.ServerCPUPercent)
		res.IdleCost = append(res.IdleCost, r)
	}
	return nil
}

func idleCost(ctx context.Context, cfg config, b backend, poll time.Duration, notify bool) (idleCostResult, error) {
	var r idleCostResult
	if err := b.reset(ctx, mainTable); err != nil {
		return r, err
	}
	db, counter, err := b.pool(cfg.Workers + 2)
	if err != nil {
		return r, err
	}
	defer db.Close()
	store, err := outbox.New(db, b.dialect(), outbox.Options{DisableNotify: !notify})
	if err != nil {
		return r, err
	}
	opts := outbox.PublisherOptions{Scope: outbox.Scope{Namespace: benchNamespace}, Logger: discard, PollInterval: poll}
	if poll > 0 {
		opts.IdleBackoffMax = poll
	}
	pub, err := outbox.NewPublisher(store, outbox.TransportFunc(func(context.Context, []outbox.Delivery) []error { return nil }), opts)
	if err != nil {
		return r, err
	}
	pctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- pub.Run(pctx) }()
	defer func() { stop(); <-done }()
	// Settle: start-up claims, the idle backoff growing to its ceiling.
	if !sleepCtx(ctx, 2*time.Second) {
		return r, ctx.Err()
	}
	cpu0, err := sessionCPU(ctx, b)
	if err != nil {
		return r, err
	}
	s0, t0 := counter.snapshot(), time.Now()
	if !sleepCtx(ctx, cfg.IdleDur) {
		return r, ctx.Err()
	}
	s1, secs := counter.snapshot(), time.Since(t0).Seconds()
	cpu1, err := sessionCPU(ctx, b)
	if err != nil {
		return r, err
	}
	var cpu time.Duration
	for k, v := range cpu1 {
		cpu += v - cpu0[k] // a session opened in the window counts from zero
	}
	stmts := (s1.Autocommit - s0.Autocommit) + (s1.InTx - s0.InTx) + (s1.Commits - s0.Commits)
	r.StatementsPerSecond = float64(stmts) / secs
	r.ServerCPUPercent = 100 * cpu.Seconds() / secs
	r.Seconds = secs
	return r, nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// clockTick is the unit of the CPU times in /proc (USER_HZ), 100 a second on Linux.
const clockTick = 10 * time.Millisecond

// sessionCPU returns the CPU time used so far by each database session of the bench
// database, by a key that names it: see idleCostResult.ServerCPUPercent.
func sessionCPU(ctx context.Context, b backend) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	switch bk := b.(type) {
	case *myBackend:
		pid, err := processByName("mariadbd", "mysqld")
		if err != nil {
			return nil, err
		}
		rows, err := bk.server.QueryContext(ctx, `SELECT TID FROM information_schema.PROCESSLIST WHERE DB = ?`, bk.dbName)
		if err != nil {
			return nil, fmt.Errorf("server threads (MariaDB 10.5+ has PROCESSLIST.TID): %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var tid int
			if err := rows.Scan(&tid); err != nil {
				return nil, err
			}
			out[strconv.Itoa(tid)] = procCPU(filepath.Join("/proc", strconv.Itoa(pid), "task", strconv.Itoa(tid), "stat"))
		}
		return out, rows.Err()
	case *pgBackend:
		rows, err := bk.server.QueryContext(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = $1`, bk.dbName)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		for rows.Next() {
			var pid int
			if err := rows.Scan(&pid); err != nil {
				return nil, err
			}
			out[strconv.Itoa(pid)] = procCPU(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		}
		return out, rows.Err()
	default:
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			return nil, err
		}
		out["self"] = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		return out, nil
	}
}

// procCPU reads user plus system time from a /proc stat file; 0 when it is gone.
func procCPU(path string) time.Duration {
	f := procStat(path)
	if len(f) < 13 {
		return 0
	}
	return ticks(f[11], f[12])
}

// procStat returns the fields of a /proc stat file after the command name, which is in
// parentheses and may hold spaces: f[0] is the state, f[2] the process group, f[11] to
// f[14] utime, stime, cutime and cstime. It is nil when the process is gone.
func procStat(path string) []string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}

// ticks adds CPU times given in clock ticks.
func ticks(fields ...string) time.Duration {
	var n int64
	for _, f := range fields {
		v, _ := strconv.ParseInt(f, 10, 64)
		n += v
	}
	return time.Duration(n) * clockTick
}

// processByName returns the pid of the first process whose command is one of names.
func processByName(names ...string) (int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil {
			continue
		}
		for _, n := range names {
			if strings.TrimSpace(string(comm)) == n {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("no %s process on this host", strings.Join(names, " or "))
}
