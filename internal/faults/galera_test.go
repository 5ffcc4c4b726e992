package faults

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/testdb"
)

// galeraProvider is where Debian's galera-4 package installs the wsrep provider.
const galeraProvider = "/usr/lib/galera/libgalera_smm.so"

// galeraMissing returns what to install for a Galera cluster, or "" when nothing is
// missing.
func galeraMissing() string {
	var pkgs []string
	if _, err := os.Stat(galeraProvider); err != nil {
		pkgs = append(pkgs, "galera-4")
	}
	if _, err := exec.LookPath("wsrep_sst_rsync"); err != nil {
		pkgs = append(pkgs, "mariadb-server")
	} else if _, err := user.Lookup("mysql"); err != nil && os.Geteuid() == 0 {
		pkgs = append(pkgs, "mariadb-server") // it creates the mysql user the nodes run as
	}
	if _, err := exec.LookPath("rsync"); err != nil {
		pkgs = append(pkgs, "rsync")
	}
	if len(pkgs) == 0 {
		return ""
	}
	return "apt-get install -y " + strings.Join(pkgs, " ")
}

// galera is a private 3-node MariaDB Galera cluster: each node a mariadbd with a data
// directory, a client port, a group communication port, an IST port and an SST port of
// its own, state transfers by rsync.
type galera struct {
	nodes []*server
}

// newGalera starts the cluster, node 0 bootstrapping it, and waits until every node is
// synced in a cluster of three. The nodes are stopped and removed when the test ends.
func newGalera(t *testing.T) *galera {
	t.Helper()
	if missing := galeraMissing(); missing != "" {
		t.Fatalf("a Galera cluster needs packages this machine lacks; install them with: %s", missing)
	}
	const n = 3
	gports := make([]int, n)
	var addrs []string
	for i := range gports {
		p, err := testdb.FreePort()
		require.NoError(t, err)
		gports[i] = p
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", p))
	}
	g := &galera{}
	t.Cleanup(func() {
		for i := len(g.nodes) - 1; i >= 0; i-- {
			_ = g.nodes[i].stop(false)
			_ = os.RemoveAll(g.nodes[i].dir)
		}
	})
	for i := range n {
		ist, err := testdb.FreePort()
		require.NoError(t, err)
		sst, err := testdb.FreePort()
		require.NoError(t, err)
		args := []string{
			"--wsrep-on=ON", "--wsrep-provider=" + galeraProvider,
			"--wsrep-cluster-name=outbox_faults", "--wsrep-cluster-address=gcomm://" + strings.Join(addrs, ","),
			fmt.Sprintf("--wsrep-node-name=node%d", i), "--wsrep-node-address=" + addrs[i],
			fmt.Sprintf("--wsrep-provider-options=gmcast.listen_addr=tcp://%s;ist.recv_addr=127.0.0.1:%d;gcache.size=64M", addrs[i], ist),
			fmt.Sprintf("--wsrep-sst-receive-address=127.0.0.1:%d", sst), "--wsrep-sst-method=rsync",
			"--binlog-format=ROW", "--innodb-autoinc-lock-mode=2", "--default-storage-engine=InnoDB",
			"--innodb-flush-log-at-trx-commit=2",
		}
		if i == 0 {
			args = append(args, "--wsrep-new-cluster")
		}
		s, err := newServerAs("mysql", "mysql", args...)
		require.NoError(t, err, "galera node %d", i)
		g.nodes = append(g.nodes, s)
		g.waitSynced(t, s, i+1)
	}
	return g
}

// waitSynced waits until node s is synced in a cluster of size nodes.
func (g *galera) waitSynced(t *testing.T, s *server, size int) {
	t.Helper()
	db, err := sql.Open("mysql", s.dsn("", ""))
	require.NoError(t, err)
	defer db.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		state, cluster := "", 0
		err := db.QueryRow(`SELECT
			(SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'WSREP_LOCAL_STATE_COMMENT'),
			(SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'WSREP_CLUSTER_SIZE')`).Scan(&state, &cluster)
		if err == nil && state == "Synced" && cluster == size {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("galera node not synced in a cluster of %d after 60s (%v, %q, %d): %s", size, err, state, cluster, s.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// dsn routes a flow's pools by role: producer<i> and pub<i> to node i (mod 3), anything
// else (setup, check) to node 0 with causality checks on reads, so that it sees every
// write the cluster committed.
func (g *galera) dsn(db, app string) string {
	role := app[strings.LastIndexByte(app, '_')+1:]
	node := 0
	for _, prefix := range []string{"producer", "pub"} {
		if rest, ok := strings.CutPrefix(role, prefix); ok {
			var i int
			if _, err := fmt.Sscan(rest, &i); err == nil {
				node = i % len(g.nodes)
			}
		}
	}
	d := g.nodes[node].dsn(db, "")
	if node == 0 && !strings.HasPrefix(role, "producer") && !strings.HasPrefix(role, "pub") {
		d += "&wsrep_sync_wait=1"
	}
	return d
}

// TestGalera runs producers on two nodes of a 3-node Galera cluster and a publisher on
// each node, while pairs of racers on two nodes enqueue the same dedupe keys. Every
// committed event is delivered, nothing else is, no message is ever in flight at two
// publishers, each dedupe key has one row and one racer that enqueued it, and the
// certification conflicts inside the library's statements are retried without an ERROR
// log line. The racers retry their business transaction on error 1213, as a caller must.
func TestGalera(t *testing.T) {
	noLeaks(t)
	g := newGalera(t)
	adm, err := sql.Open("mysql", g.nodes[0].dsn("", ""))
	require.NoError(t, err)
	defer adm.Close()
	_, err = adm.Exec(`CREATE DATABASE galera`)
	require.NoError(t, err)

	opts := defaultFlowOptions()
	opts.producers, opts.producerPools, opts.publishers = 4, 2, 3
	logs := &logCapture{}
	opts.logs = logs
	f := newFlowOn(t, "mysql", "galera", g.dsn, opts)
	// A read with causality checks waits until the node applied the schema made on node 0.
	for _, n := range g.nodes {
		db, err := sql.Open("mysql", n.dsn("galera", "")+"&wsrep_sync_wait=1")
		require.NoError(t, err)
		_, err = db.Exec(`SELECT COUNT(*) FROM orders`)
		db.Close()
		require.NoError(t, err)
	}
	f.start()

	// Racers: for each key, one enqueue on node 0 and one on node 1, released together.
	const keys = 200
	var racers []*sql.DB
	var stores []*outbox.Store
	for i := range 2 {
		db, err := sql.Open("mysql", g.nodes[i].dsn("galera", ""))
		require.NoError(t, err)
		defer db.Close()
		s, err := outbox.New(db, outbox.MySQL(), outbox.Options{})
		require.NoError(t, err)
		racers, stores = append(racers, db), append(stores, s)
	}
	var enqueued, duplicates, retries atomic.Int64
	for k := range keys {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range racers {
			wg.Go(func() {
				<-start
				dup, n, err := raceEnqueue(racers[i], stores[i], fmt.Sprintf("key-%d", k))
				retries.Add(int64(n))
				if err != nil {
					t.Errorf("racer %d, key %d: %v", i, k, err)
					return
				}
				if dup {
					duplicates.Add(1)
				} else {
					enqueued.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		f.checkRunning()
	}
	require.EqualValues(t, keys, enqueued.Load(), "racers that enqueued a key (one per key)")
	require.EqualValues(t, keys, duplicates.Load(), "racers told the key was enqueued already")
	var rows, distinct int
	check, err := sql.Open("mysql", g.nodes[2].dsn("galera", "")+"&wsrep_sync_wait=1")
	require.NoError(t, err)
	defer check.Close()
	require.NoError(t, check.QueryRow(`SELECT COUNT(*), COUNT(DISTINCT dedupe_key) FROM outbox_events WHERE namespace = 'race'`).Scan(&rows, &distinct))
	require.Equal(t, keys, rows, "rows of the raced keys")
	require.Equal(t, keys, distinct, "distinct raced keys")

	f.waitDelivered(f.delivered()+200, time.Minute)
	rep := f.finish(2 * time.Minute)
	t.Logf("galera: %s", rep)
	t.Logf("galera: business transactions rolled back by error 1213: %d at the business INSERT, %d at Enqueue, %d at Commit; "+
		"dedupe race: %d keys, %d enqueued, %d duplicates, %d transaction retries",
		f.insertConflicts.Load(), f.enqueueConflicts.Load(), f.commitConflicts.Load(), keys, enqueued.Load(), duplicates.Load(), retries.Load())
	t.Logf("galera: publisher log lines: %d warnings of conflicts past the retries, %d errors",
		logs.countAttr(slog.LevelWarn, "Error 1213"), logs.count(slog.LevelError, ""))
	f.mu.Lock()
	for step, err := range f.aborts {
		t.Logf("galera: first business transaction aborted at %s: %s", step, err)
	}
	f.mu.Unlock()
	require.Zero(t, logs.count(slog.LevelError, ""), "publisher ERROR log lines:\n%s", logs)
}

// raceEnqueue enqueues a message with dedupe key key in a transaction of its own on db,
// and runs the transaction again, up to 20 times, when the database rolls it back with
// error 1213, at Enqueue or at Commit. It returns whether the key was enqueued already and
// how many times the transaction ran again.
func raceEnqueue(db *sql.DB, s *outbox.Store, key string) (dup bool, retries int, err error) {
	ctx := context.Background()
	for try := 0; ; try++ {
		dup, err = raceOnce(ctx, db, s, key)
		if err == nil || try == 20 || !isRetryTransaction(err) {
			return dup, try, err
		}
		time.Sleep(time.Duration(try+1) * 5 * time.Millisecond)
	}
}

func raceOnce(ctx context.Context, db *sql.DB, s *outbox.Store, key string) (bool, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback() }()
	res, err := s.Enqueue(ctx, tx, outbox.Message{Namespace: "race", Topic: "key", DedupeKey: key, Payload: []byte(`{}`)})
	if err != nil {
		return false, err
	}
	return res.Duplicate, tx.Commit()
}

// isRetryTransaction is what a caller on a Galera cluster checks: Enqueue's error matches
// outbox.ErrRetryTransaction, and Commit's is the driver's error 1213.
func isRetryTransaction(err error) bool {
	var me *mysql.MySQLError
	return errors.Is(err, outbox.ErrRetryTransaction) || (errors.As(err, &me) && me.Number == 1213)
}
