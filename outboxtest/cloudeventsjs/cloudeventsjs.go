// Package cloudeventsjs decodes broker messages with the CloudEvents JavaScript SDK (npm
// package cloudevents), as a JavaScript consumer would, for the transports' tests. The SDK is
// installed with npm from the committed package-lock.json into the user's cache directory,
// once per lock file. A test fails when node or npm is missing, unless OUTBOX_TEST_SKIP names
// "node" (and OUTBOX_TEST_REQUIRE does not).
//
// Support for this repository's own tests, with no compatibility promise.
package cloudeventsjs

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/outboxtest/testdb"
)

var (
	//go:embed package.json
	packageJSON []byte
	//go:embed package-lock.json
	packageLock []byte
	//go:embed decode.mjs
	decodeScript []byte
)

// Bindings of [Message].
const (
	HTTP  = "http"  // the HTTP binding (webhooks)
	Kafka = "kafka" // the Kafka binding
	// NATS: the SDK has no NATS binding; the message is read with its HTTP binding, whose
	// header rules the NATS binding follows, ce-datacontenttype taken as Content-Type.
	NATS = "nats"
)

// Message is a broker message as a consumer receives it.
type Message struct {
	Binding string            `json:"binding"`
	Headers map[string]string `json:"headers"`
	Key     string            `json:"key,omitempty"` // Kafka's record key
	Body    []byte            `json:"body"`
}

// Event is what the SDK made of a [Message].
type Event struct {
	// Attributes are the event's attributes and extensions, as strings.
	Attributes map[string]string `json:"attributes"`
	// DataKind says what the SDK handed the consumer as data: "json" (a value it parsed;
	// Data is its JSON), "string" (Data is its UTF-8), "bytes", or "none".
	DataKind string `json:"dataKind"`
	Data     []byte `json:"data"`
	// Error is the SDK's error when it could not decode the message.
	Error string `json:"error"`
}

var install struct {
	once sync.Once
	dir  string
	err  error
}

// Decode decodes msgs with the SDK and returns one Event per message, in order.
func Decode(t testing.TB, msgs []Message) []Event {
	t.Helper()
	node, nerr := exec.LookPath("node")
	_, perr := exec.LookPath("npm")
	if nerr != nil || perr != nil {
		if testdb.Required("node") {
			t.Fatal("node and npm are needed to decode CloudEvents with the JavaScript SDK: install them (apt-get install -y nodejs npm), or set OUTBOX_TEST_SKIP=node to skip this check on purpose")
		}
		t.Skip("SKIPPING THE JAVASCRIPT CLOUDEVENTS CHECK: no node or npm; OUTBOX_TEST_SKIP allows it")
	}
	install.once.Do(func() { install.dir, install.err = installSDK() })
	if install.err != nil {
		t.Fatalf("installing the CloudEvents JavaScript SDK: %v", install.err)
	}
	in, err := json.Marshal(msgs)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, "decode.mjs")
	cmd.Dir = install.dir
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node decode.mjs: %v\n%s", err, stderr.String())
	}
	var events []Event
	if err := json.Unmarshal(out, &events); err != nil {
		t.Fatalf("node decode.mjs printed %q: %v", out, err)
	}
	if len(events) != len(msgs) {
		t.Fatalf("node decode.mjs decoded %d messages of %d", len(events), len(msgs))
	}
	return events
}

// installSDK installs the locked packages into a directory of the user's cache named after
// the lock file's hash, unless it is there already, and writes the script beside them.
// Concurrent installs (test binaries of several modules) each install into a directory of
// their own and rename it into place; the loser uses the winner's.
func installSDK() (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	sum := sha256.Sum256(append(append(append([]byte{}, packageJSON...), packageLock...), decodeScript...))
	dir := filepath.Join(cache, "outbox-test", "cloudeventsjs-"+hex.EncodeToString(sum[:8]))
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "cloudevents", "package.json")); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "install-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp) // gone after a successful rename
	for name, b := range map[string][]byte{"package.json": packageJSON, "package-lock.json": packageLock, "decode.mjs": decodeScript} {
		if err := os.WriteFile(filepath.Join(tmp, name), b, 0o644); err != nil {
			return "", err
		}
	}
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error")
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", &installError{err: err, out: out}
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, "node_modules", "cloudevents", "package.json")); serr == nil {
			return dir, nil // another process installed it meanwhile
		}
		return "", err
	}
	return dir, nil
}

type installError struct {
	err error
	out []byte
}

func (e *installError) Error() string { return "npm ci: " + e.err.Error() + "\n" + string(e.out) }

// RequireDelivery checks that e is d's event as the transport should have sent it: its id,
// source, type, datacontenttype and partition key, and its data the payload, byte for byte
// when the SDK hands over text or bytes, as JSON when it parsed it.
func RequireDelivery(t testing.TB, d outbox.Delivery, e Event, source, typ, contentType string) {
	t.Helper()
	require.Empty(t, e.Error, "message %s", d.ID)
	a := e.Attributes
	require.Equal(t, d.ID.String(), a["id"])
	require.Equal(t, "1.0", a["specversion"])
	require.Equal(t, source, a["source"])
	require.Equal(t, typ, a["type"])
	require.Equal(t, contentType, a["datacontenttype"], "message %s", d.ID)
	if d.PartitionKey != "" {
		require.Equal(t, d.PartitionKey, a["partitionkey"])
	}
	if !d.CreatedAt.IsZero() {
		got, err := time.Parse(time.RFC3339Nano, a["time"])
		require.NoError(t, err)
		require.WithinDuration(t, d.CreatedAt, got, time.Millisecond, "the SDK keeps milliseconds")
	}
	switch e.DataKind {
	case "json":
		require.JSONEq(t, string(d.Payload), string(e.Data), "message %s", d.ID)
	case "string", "bytes":
		require.Equal(t, string(d.Payload), string(e.Data), "message %s: data is the payload byte for byte", d.ID)
	default:
		t.Fatalf("message %s: no data (%s)", d.ID, e.DataKind)
	}
}
