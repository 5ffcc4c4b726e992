//go:build timing

// The mutation kit's children fail within the suite's deadlines, which the race detector's
// slowdown stretches: make test-timing runs it, without the race detector (CI does too).

package conformance_test

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSuiteCatchesBrokenDialects is the mutation kit: it runs the suite against every
// planted bug of kit, each in a child process (a failing *testing.T cannot be contained
// in-process, and a hung one ends its process), and requires the child to fail in the
// tests that guard against that bug, within their deadlines.
func TestSuiteCatchesBrokenDialects(t *testing.T) {
	t.Parallel()
	start := time.Now()
	t.Cleanup(func() {
		if !t.Failed() {
			t.Logf("%d planted bugs, every one caught, in %s", len(kit), time.Since(start).Round(time.Second))
		}
	})
	// The children mostly wait out the suite's deadlines (the whole kit takes about ten
	// seconds of CPU), so they run kitParallel at a time, not go test's -parallel (the
	// number of cores by default): on 2 cores the kit took 75 s two at a time, 32 s six.
	const kitParallel = 6
	type child struct {
		out []byte
		err error
	}
	results := make(map[string]chan child, len(kit))
	slots := make(chan struct{}, kitParallel)
	for _, m := range kit {
		done := make(chan child, 1)
		results[m.name] = done
		go func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			// Bounded by the suite's own deadlines (a hung test ends its child within a
			// few minutes); this is a backstop.
			ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
			defer cancel()
			run := "^TestBrokenDialectChild$"
			if m.only != "" {
				run += "/" + m.only
			}
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+run, "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "OUTBOX_BROKEN_DIALECT="+m.name)
			out, err := cmd.CombinedOutput()
			done <- child{out, err}
		}()
	}
	for _, m := range kit {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			c := <-results[m.name]
			out, err := c.out, c.err
			require.Error(t, err, "the suite passed a broken dialect:\n%s", out)
			var caught []string
			for _, l := range strings.Split(string(out), "\n") {
				if name, ok := strings.CutPrefix(strings.TrimSpace(l), "--- FAIL: TestBrokenDialectChild/"); ok {
					if name, _, _ = strings.Cut(name, " "); strings.Contains(name, "/") {
						caught = append(caught, name)
					}
				}
			}
			for _, name := range m.mustFail {
				// A test that hangs past its deadline fails, or ends the child with a
				// panic that names it.
				require.True(t, slices.Contains(caught, name) || strings.Contains(string(out), "conformance: "+name+" (section"),
					"the suite must catch the %s bug in %s; it failed %v:\n%s", m.name, name, caught, tail(out))
			}
			// A healthy test still passes: the failures are the bug's, not the harness's.
			require.Contains(t, string(out), "--- PASS: TestBrokenDialectChild/Enqueue/CommitLeavesExactlyOne", "%s", tail(out))
			t.Logf("caught by %s", strings.Join(caught, ", "))
		})
	}
}

// tail returns the end of a child's output, where its failures are summed up.
func tail(out []byte) []byte {
	const n = 8000
	if len(out) > n {
		return out[len(out)-n:]
	}
	return out
}
