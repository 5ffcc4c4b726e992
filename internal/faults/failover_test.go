package faults

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox/internal/testdb"
)

// pgPair is a private PostgreSQL primary and a streaming standby made from it with
// pg_basebackup, each on its own port.
type pgPair struct {
	primary, standby *server
}

// standbyName is the standby's application_name, which synchronous_standby_names names.
const standbyName = "standby1"

// newPGPair starts a primary (synchronous replication to the standby when sync is set)
// and a standby streaming from it, and waits until the primary sees it streaming (as its
// synchronous standby when sync is set). Both are stopped and removed when the test ends.
func newPGPair(t *testing.T, sync bool) *pgPair {
	t.Helper()
	var args []string
	if sync {
		args = append(args, "-c", "synchronous_standby_names="+standbyName)
	}
	primary, err := newServer("postgres", args...)
	require.NoError(t, err)
	p := &pgPair{primary: primary}
	t.Cleanup(func() {
		for _, s := range []*server{p.primary, p.standby} {
			if s != nil {
				_ = s.stop(true)
				_ = os.RemoveAll(s.dir)
			}
		}
	})

	dir, err := os.MkdirTemp("", "outbox-faults-standby-")
	require.NoError(t, err)
	port, err := testdb.FreePort()
	require.NoError(t, err)
	standby := &server{backend: "postgres", dir: dir, port: port, cred: primary.cred,
		args: []string{"-c", fmt.Sprintf("primary_conninfo=host=127.0.0.1 port=%d user=postgres application_name=%s", primary.port, standbyName)}}
	p.standby = standby
	if c := primary.cred; c != nil {
		require.NoError(t, os.Chown(dir, int(c.Uid), int(c.Gid)))
	}
	bin, err := pgBin()
	require.NoError(t, err)
	// -R writes standby.signal; primary_conninfo comes from the command line above.
	base := exec.Command(filepath.Join(bin, "pg_basebackup"), "-h", "127.0.0.1", "-p", strconv.Itoa(primary.port),
		"-U", "postgres", "-D", filepath.Join(dir, "data"), "-X", "stream", "-R", "-c", "fast", "--no-sync")
	base.SysProcAttr = &syscall.SysProcAttr{Credential: primary.cred}
	out, err := base.CombinedOutput()
	require.NoError(t, err, "pg_basebackup: %s", out)
	require.NoError(t, standby.start())

	adm, err := sql.Open("pgx", primary.dsn("", "faults_admin"))
	require.NoError(t, err)
	defer adm.Close()
	want := "async"
	if sync {
		want = "sync"
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var state string
		err := adm.QueryRow(`SELECT sync_state FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'`,
			standbyName).Scan(&state)
		if err == nil && state == want {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("standby not streaming (%s) after 30s: %v %q: %s", want, err, state, standby.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dsn returns a multi-host DSN that reaches whichever of the two accepts writes.
func (p *pgPair) dsn(db, app string) string {
	return fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres dbname=%s sslmode=disable connect_timeout=2 "+
		"target_session_attrs=read-write application_name=%s", p.primary.port, p.standby.port, db, app)
}

// promote promotes the standby and waits until it accepts writes.
func (p *pgPair) promote(t *testing.T) {
	t.Helper()
	bin, err := pgBin()
	require.NoError(t, err)
	cmd := exec.Command(filepath.Join(bin, "pg_ctl"), "promote", "-w", "-t", "60", "-D", filepath.Join(p.standby.dir, "data"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.standby.cred}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "pg_ctl promote: %s", out)
}

// TestFailover crashes a private primary (immediate shutdown) while producers commit and
// two publishers deliver through a multi-host DSN with target_session_attrs=read-write,
// and promotes its streaming standby. With synchronous replication nothing committed is
// lost: every event whose Commit returned is delivered, and no event is delivered that the
// promoted server does not have. With asynchronous replication the commits the standby had
// not received are lost, with their business rows, and the test counts them. In both,
// commits and deliveries resume on the promoted server, the publishers' wake-up listener
// comes back, and no message is ever in flight at two publishers at once. The
// asynchronous case makes the standby lag for certain: it is stopped for 50 commits
// before the crash and started again after it.
func TestFailover(t *testing.T) {
	noLeaks(t)
	for _, mode := range []string{"sync", "async"} {
		t.Run(mode, func(t *testing.T) {
			pair := newPGPair(t, mode == "sync")
			adm, err := sql.Open("pgx", pair.primary.dsn("", "faults_admin"))
			require.NoError(t, err)
			_, err = adm.Exec(`CREATE DATABASE failover`)
			adm.Close()
			require.NoError(t, err)

			opts := defaultFlowOptions()
			logs := &logCapture{}
			opts.logs = logs
			f := newFlowOn(t, "postgres", "failover", pair.dsn, opts)
			f.lossy = mode == "async"
			f.start()
			f.waitDelivered(200, time.Minute)
			f.waitListening(logs, 30*time.Second)

			if mode == "async" {
				// The standby falls behind: it stops while the primary goes on committing,
				// which asynchronous replication allows, and comes back only after the
				// primary is gone, so what it missed is lost for good.
				require.NoError(t, pair.standby.stop(false))
				lagFrom := f.commitsSince(0)
				for deadline := time.Now().Add(30 * time.Second); f.commitsSince(lagFrom) < 50; time.Sleep(10 * time.Millisecond) {
					f.checkRunning()
					require.True(t, time.Now().Before(deadline), "50 commits without the standby took over 30s")
				}
			}
			require.NoError(t, pair.primary.stop(true))
			cut := time.Now()
			if mode == "async" {
				require.NoError(t, pair.standby.start())
			}
			pair.promote(t)
			promoted := time.Now()

			// Measured from the crash: nothing commits or delivers while no server accepts
			// writes, and the promoted server may accept them before pg_ctl returns.
			commit := f.waitCommitted(cut, 30*time.Second)
			delivery, _ := f.waitResumed(cut, 30*time.Second)
			back := logs.wait(msgListenerBackText, cut, 30*time.Second)
			require.GreaterOrEqual(t, back, time.Duration(0), "the wake-up listener did not come back; logs:\n%s", logs)
			f.waitDelivered(f.delivered()+200, time.Minute)
			rep := f.finish(2 * time.Minute)
			t.Logf("failover (%s replication): after the primary's crash, promoted in %s, first commit %s, first delivery %s, listener back %s",
				mode, promoted.Sub(cut).Round(time.Millisecond), commit.Round(time.Millisecond),
				delivery.Round(time.Millisecond), back.Round(time.Millisecond))
			t.Logf("failover (%s replication): %s", mode, rep)
			if mode == "sync" {
				require.Zero(t, rep.lost, "committed events lost with synchronous replication")
				require.Zero(t, rep.phantoms, "events delivered that the promoted server does not have")
			} else {
				require.GreaterOrEqual(t, rep.lost, 50, "the commits the lagging standby missed")
			}
		})
	}
}

// msgListenerBackText is the publisher's log message when its wake-up listener is back.
const msgListenerBackText = "outbox publisher: wake-up listener is back"

// waitListening waits until the flow's publishers hold a wake-up listener: the hub logs
// nothing when it first listens, so the test waits for a LISTEN in pg_stat_activity.
func (f *flow) waitListening(logs *logCapture, within time.Duration) {
	f.t.Helper()
	db := f.open("probe")
	defer db.Close()
	deadline := time.Now().Add(within)
	for {
		var n int
		err := db.QueryRow(`SELECT COUNT(*) FROM pg_stat_activity WHERE left(application_name, length($1)) = $1
			AND query ILIKE 'listen%'`, f.app+"_pub").Scan(&n)
		if err == nil && n > 0 {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("no publisher listening after %s (%v); logs:\n%s", within, err, logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// commitsSince returns how many business transactions committed after the first n.
func (f *flow) commitsSince(n int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.commits) - n
}

// waitCommitted waits for a business transaction committed after since and returns how
// long after since it committed.
func (f *flow) waitCommitted(since time.Time, within time.Duration) time.Duration {
	f.t.Helper()
	deadline := time.Now().Add(within)
	for {
		f.mu.Lock()
		var first time.Time
		for i := len(f.commits) - 1; i >= 0 && !f.commits[i].Before(since); i-- {
			first = f.commits[i]
		}
		f.mu.Unlock()
		if !first.IsZero() {
			return first.Sub(since)
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("no commit within %s", within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// logCapture is a slog.Handler that keeps every record's time, level and message.
type logCapture struct {
	mu   sync.Mutex
	recs []capturedLog
}

type capturedLog struct {
	at    time.Time
	level slog.Level
	msg   string
	attrs string
}

func (c *logCapture) Enabled(context.Context, slog.Level) bool { return true }

func (c *logCapture) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	c.mu.Lock()
	c.recs = append(c.recs, capturedLog{at: time.Now(), level: r.Level, msg: r.Message, attrs: b.String()})
	c.mu.Unlock()
	return nil
}

func (c *logCapture) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *logCapture) WithGroup(string) slog.Handler      { return c }

// String returns the last records, for a failure message.
func (c *logCapture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	for _, r := range c.recs[max(0, len(c.recs)-20):] {
		fmt.Fprintf(&b, "%s %s %s%s\n", r.at.Format("15:04:05.000"), r.level, r.msg, r.attrs)
	}
	return b.String()
}

// count returns how many records at level or above have a message beginning with prefix.
func (c *logCapture) count(level slog.Level, prefix string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, r := range c.recs {
		if r.level >= level && strings.HasPrefix(r.msg, prefix) {
			n++
		}
	}
	return n
}

// countAttr returns how many records at level or above have attributes containing sub.
func (c *logCapture) countAttr(level slog.Level, sub string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, r := range c.recs {
		if r.level >= level && strings.Contains(r.attrs, sub) {
			n++
		}
	}
	return n
}

// wait waits for a record with message msg logged after since and returns how long after
// since it came.
func (c *logCapture) wait(msg string, since time.Time, within time.Duration) time.Duration {
	deadline := time.Now().Add(within)
	for {
		c.mu.Lock()
		for _, r := range c.recs {
			if r.msg == msg && !r.at.Before(since) {
				c.mu.Unlock()
				return r.at.Sub(since)
			}
		}
		c.mu.Unlock()
		if time.Now().After(deadline) {
			return -1
		}
		time.Sleep(10 * time.Millisecond)
	}
}
