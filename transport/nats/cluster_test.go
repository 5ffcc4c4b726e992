//go:build natscluster

package outboxnats_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/outboxtest/transporttest"
	outboxnats "github.com/outboxgo/outbox/transport/nats"
)

// clusterNode is one nats-server of a private JetStream cluster: a child process on
// loopback ports of its own, with a store directory that outlives a kill.
type clusterNode struct {
	name               string
	client, route      int
	dir                string
	args               []string
	cmd                *exec.Cmd
	exited             chan struct{}
	clientURL, logPath string
}

func clusterFreePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startClusterNodes starts a 3-node JetStream cluster, stopped when the test ends.
func startClusterNodes(t *testing.T) []*clusterNode {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		t.Fatalf("nats-server not found: apt-get install -y nats-server")
	}
	nodes := make([]*clusterNode, 3)
	for i := range nodes {
		dir := t.TempDir()
		nodes[i] = &clusterNode{name: fmt.Sprintf("n%d", i), client: clusterFreePort(t), route: clusterFreePort(t), dir: dir,
			logPath: filepath.Join(dir, "server.log")}
		nodes[i].clientURL = fmt.Sprintf("nats://127.0.0.1:%d", nodes[i].client)
	}
	for i, n := range nodes {
		var routes []string
		for j, o := range nodes {
			if j != i {
				routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", o.route))
			}
		}
		n.args = []string{"-a", "127.0.0.1", "-p", strconv.Itoa(n.client), "-n", n.name, "-js", "-sd", filepath.Join(n.dir, "js"),
			"--cluster_name", "outbox", "-cluster", fmt.Sprintf("nats://127.0.0.1:%d", n.route), "-routes", strings.Join(routes, ","),
			"-l", n.logPath}
		n.start(t, bin)
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			n.kill()
		}
	})
	return nodes
}

func (n *clusterNode) start(t *testing.T, bin string) {
	t.Helper()
	cmd := exec.Command(bin, n.args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	n.cmd, n.exited = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(n.exited)
}

// kill stops the node with SIGKILL, as a crash would, and waits for it to exit.
func (n *clusterNode) kill() {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Kill()
	<-n.exited
	n.cmd = nil
}

// clusterRecorder wraps a transport and records, per message id, how often it was handed
// over and when a publish of it first succeeded.
type clusterRecorder struct {
	next outbox.Transport

	mu        sync.Mutex
	handed    map[uuid.UUID]int
	successes []time.Time
}

func (r *clusterRecorder) Publish(ctx context.Context, batch []outbox.Delivery) []error {
	errs := r.next.Publish(ctx, batch)
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, d := range batch {
		r.handed[d.ID]++
		if errs[i] == nil {
			r.successes = append(r.successes, now)
		}
	}
	return errs
}

// firstSuccessAfter returns how long after since a publish first succeeded, or -1.
func (r *clusterRecorder) firstSuccessAfter(since time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, at := range r.successes {
		if !at.Before(since) {
			return at.Sub(since)
		}
	}
	return -1
}

// TestJetStreamCluster publishes an outbox into an R3 stream of a private 3-node
// JetStream cluster while producers enqueue, kills the stream's leader with SIGKILL, and
// starts it again. Every committed event is in the stream exactly once: none is lost, and
// the messages the publisher sent again (an acknowledgement lost with the leader) are
// dropped by the stream's duplicate window, keyed on Nats-Msg-Id.
func TestJetStreamCluster(t *testing.T) {
	if os.Getenv("OUTBOX_FAULTS") != "1" {
		t.Skip("starts a NATS cluster of its own: set OUTBOX_FAULTS=1 (make test-faults)")
	}
	bin, err := exec.LookPath("nats-server")
	require.NoError(t, err, "apt-get install -y nats-server")
	nodes := startClusterNodes(t)
	var urls []string
	for _, n := range nodes {
		urls = append(urls, n.clientURL)
	}
	nc, err := nats.Connect(strings.Join(urls, ","), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.DontRandomize(), nats.RetryOnFailedConnect(true))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)

	ctx := context.Background()
	ns := transporttest.Name("clu")
	var stream jetstream.Stream
	transporttest.Poll(t, 60*time.Second, func() bool {
		// The cluster elects its meta leader first; until then stream creation fails.
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		stream, err = js.CreateStream(cctx, jetstream.StreamConfig{Name: ns, Subjects: []string{ns + ".>"},
			Replicas: 3, Storage: jetstream.FileStorage, Duplicates: 5 * time.Minute})
		return err == nil
	}, "no R3 stream on the cluster: %v", err)

	tr, err := outboxnats.New(js, outboxnats.Options{AckTimeout: 2 * time.Second})
	require.NoError(t, err)
	rec := &clusterRecorder{next: tr, handed: map[uuid.UUID]int{}}
	ob := transporttest.Postgres(t)
	pub := ob.Start(t, ns, rec, 50)

	// A producer commits a batch of 10 events every few milliseconds until stopped.
	var mu sync.Mutex
	var ids []uuid.UUID
	stop := make(chan struct{})
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		for {
			select {
			case <-stop:
				return
			default:
			}
			res, err := ob.Store.EnqueueStandalone(ctx, transporttest.Messages(ns, 10)...)
			if err == nil {
				mu.Lock()
				for _, r := range res {
					if !r.Duplicate {
						ids = append(ids, r.ID)
					}
				}
				mu.Unlock()
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	stopProducer := sync.OnceFunc(func() { close(stop); <-produced })
	t.Cleanup(stopProducer)
	delivered := func() int { return ob.Counts(t)["delivered"] }
	transporttest.Poll(t, time.Minute, func() bool { return delivered() >= 300 }, "300 rows not delivered")

	info, err := stream.Info(ctx)
	require.NoError(t, err)
	var leader *clusterNode
	for _, n := range nodes {
		if n.name == info.Cluster.Leader {
			leader = n
		}
	}
	require.NotNil(t, leader, "stream leader %q", info.Cluster.Leader)
	leader.kill()
	killed := time.Now()
	before := delivered()
	transporttest.Poll(t, time.Minute, func() bool { return delivered() >= before+300 }, "delivery did not resume after the leader was killed")
	resumed := rec.firstSuccessAfter(killed)

	leader.start(t, bin)
	transporttest.Poll(t, time.Minute, func() bool {
		info, err := stream.Info(ctx)
		if err != nil || info.Cluster == nil {
			return false
		}
		back := info.Cluster.Leader == leader.name
		for _, p := range info.Cluster.Replicas {
			if p.Name == leader.name && p.Current && !p.Offline {
				back = true
			}
		}
		return back
	}, "the restarted node did not catch up with the stream")
	before = delivered()
	transporttest.Poll(t, time.Minute, func() bool { return delivered() >= before+300 }, "delivery stalled after the node came back")

	stopProducer()
	mu.Lock()
	want := append([]uuid.UUID(nil), ids...)
	mu.Unlock()
	ob.WaitDelivered(t, len(want), 2*time.Minute)
	stats := pub.Stop(t)

	// Read the stream back as a consumer would.
	c, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	info, err = stream.Info(ctx)
	require.NoError(t, err)
	inStream := map[uuid.UUID]int{}
	for read := 0; read < int(info.State.Msgs); {
		batch, err := c.Fetch(int(info.State.Msgs)-read, jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		n := 0
		for m := range batch.Messages() {
			id, err := uuid.Parse(m.Headers().Get(jetstream.MsgIDHeader))
			require.NoError(t, err)
			inStream[id]++
			n++
		}
		require.NoError(t, batch.Error())
		require.NotZero(t, n, "consumer stalled at %d of %d messages", read, info.State.Msgs)
		read += n
	}
	lost, dupInStream := 0, 0
	for _, id := range want {
		if inStream[id] == 0 {
			lost++
		}
	}
	for _, n := range inStream {
		dupInStream += n - 1
	}
	rec.mu.Lock()
	sentAgain := 0
	for _, n := range rec.handed {
		sentAgain += n - 1
	}
	rec.mu.Unlock()
	t.Logf("nats cluster (R3, leader %s killed and restarted): committed=%d in_stream=%d lost=%d duplicates_in_stream=%d "+
		"handed_to_transport_again=%d (dropped by Nats-Msg-Id) first_ack_after_kill=%s publisher_errors=%d",
		leader.name, len(want), len(inStream), lost, dupInStream, sentAgain, resumed.Round(time.Millisecond), stats.Errors)
	require.Zero(t, lost, "committed events missing from the stream")
	require.Zero(t, dupInStream, "messages stored twice")
	require.Len(t, inStream, len(want), "messages in the stream")
}
