// Package deploy holds the files that run outbox relay (a systemd unit, a Kubernetes
// manifest, a Dockerfile, an example config) and the tests that check them.
package deploy

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// buildStatic builds the outbox command as the Dockerfile wants it: static, no cgo.
func buildStatic(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "outbox")
	// Without the Dockerfile's -trimpath and -ldflags, which change nothing the test checks
	// and would rebuild every package instead of reusing the build cache.
	cmd := exec.Command("go", "build", "-o", out, "./cmd/outbox")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)
	return out
}

// documentedVariables returns the OUTBOX_* variables of docs/relay.md's reference, which
// the command's own test holds to its flag set.
func documentedVariables(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("../docs/relay.md")
	require.NoError(t, err)
	vars := map[string]bool{}
	for _, m := range regexp.MustCompile("`(OUTBOX_[A-Z_]+)`").FindAllStringSubmatch(string(b), -1) {
		vars[m[1]] = true
	}
	require.NotEmpty(t, vars)
	return vars
}

// TestSystemdUnit: systemd-analyze verify accepts the unit (with ExecStart pointing at a
// built binary, since it checks that the file exists), and its stop timeout is above the
// example config's drain deadline and the 5s the relay allows past it.
func TestSystemdUnit(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed")
	}
	unit, err := os.ReadFile("systemd/outbox-relay.service")
	require.NoError(t, err)
	// verify checks that ExecStart's file exists and is executable; this test's own binary
	// is one, and needs no build.
	bin, err := os.Executable()
	require.NoError(t, err)
	dir := t.TempDir()
	text := strings.ReplaceAll(string(unit), "/usr/local/bin/outbox", bin)
	path := filepath.Join(dir, "outbox-relay.service")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	cmd := exec.Command(analyze, "verify", "--man=no", path)
	out, err := cmd.CombinedOutput()
	// verify reports problems of other units on the host too: only lines about this
	// unit count.
	var ours []string
	for line := range strings.SplitSeq(string(out), "\n") {
		if strings.Contains(line, "outbox-relay.service") {
			ours = append(ours, line)
		}
	}
	require.Empty(t, ours, "systemd-analyze verify: %v\n%s", err, out)

	stop := regexp.MustCompile(`(?m)^TimeoutStopSec=(\d+)s$`).FindStringSubmatch(string(unit))
	require.NotNil(t, stop, "TimeoutStopSec")
	stopSec, _ := strconv.Atoi(stop[1])
	drain := drainOfExampleConfig(t)
	require.Greater(t, time.Duration(stopSec)*time.Second, drain+5*time.Second)
	require.Contains(t, string(unit), "RestartPreventExitStatus=2", "bad configuration is not restarted")
}

func drainOfExampleConfig(t *testing.T) time.Duration {
	t.Helper()
	b, err := os.ReadFile("relay.toml")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^drain_timeout = "([^"]+)"`).FindStringSubmatch(string(b))
	require.NotNil(t, m)
	d, err := time.ParseDuration(m[1])
	require.NoError(t, err)
	return d
}

// TestKubernetesManifest decodes each document of the manifest strictly into the
// Kubernetes API's own Go types (an unknown or misplaced field is an error, as the API
// server's strict field validation makes it), then checks what the relay needs: two
// replicas, the probes on /healthz and /readyz at the port the relay listens on, a grace
// period above the drain deadline, and only variables the relay reads.
func TestKubernetesManifest(t *testing.T) {
	b, err := os.ReadFile("kubernetes/relay.yaml")
	require.NoError(t, err)
	var (
		cm  *corev1.ConfigMap
		sec *corev1.Secret
		dep *appsv1.Deployment
	)
	for i, doc := range regexp.MustCompile(`(?m)^---$`).Split(string(b), -1) {
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		require.NoError(t, yaml.Unmarshal([]byte(doc), &meta), "document %d", i+1)
		var target any
		switch meta.APIVersion + "/" + meta.Kind {
		case "v1/ConfigMap":
			cm = &corev1.ConfigMap{}
			target = cm
		case "v1/Secret":
			sec = &corev1.Secret{}
			target = sec
		case "apps/v1/Deployment":
			dep = &appsv1.Deployment{}
			target = dep
		default:
			t.Fatalf("document %d: unexpected %s %s", i+1, meta.APIVersion, meta.Kind)
		}
		require.NoError(t, yaml.UnmarshalStrict([]byte(doc), target), "document %d (%s)", i+1, meta.Kind)
	}
	require.NotNil(t, cm)
	require.NotNil(t, sec)
	require.NotNil(t, dep)

	require.NotNil(t, dep.Spec.Replicas)
	require.EqualValues(t, 2, *dep.Spec.Replicas)
	require.Equal(t, dep.Spec.Selector.MatchLabels, dep.Spec.Template.Labels, "the selector matches the pods")
	pod := dep.Spec.Template.Spec
	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]
	require.Equal(t, []string{"relay"}, c.Args)

	listen := cm.Data["OUTBOX_LISTEN"]
	_, port, ok := strings.Cut(listen, ":")
	require.True(t, ok, "OUTBOX_LISTEN %q", listen)
	require.Len(t, c.Ports, 1)
	require.Equal(t, port, strconv.Itoa(int(c.Ports[0].ContainerPort)), "the container port is the relay's")
	for probe, path := range map[*corev1.Probe]string{c.LivenessProbe: "/healthz", c.ReadinessProbe: "/readyz"} {
		require.NotNil(t, probe, path)
		require.NotNil(t, probe.HTTPGet, path)
		require.Equal(t, path, probe.HTTPGet.Path)
		require.Equal(t, c.Ports[0].Name, probe.HTTPGet.Port.String(), "%s probes the relay's port", path)
	}

	drain, err := time.ParseDuration(cm.Data["OUTBOX_DRAIN_TIMEOUT"])
	require.NoError(t, err)
	require.NotNil(t, pod.TerminationGracePeriodSeconds)
	require.Greater(t, time.Duration(*pod.TerminationGracePeriodSeconds)*time.Second, drain+5*time.Second)

	refs := map[string]bool{}
	for _, e := range c.EnvFrom {
		switch {
		case e.ConfigMapRef != nil:
			refs["cm/"+e.ConfigMapRef.Name] = true
		case e.SecretRef != nil:
			refs["secret/"+e.SecretRef.Name] = true
		}
	}
	require.True(t, refs["cm/"+cm.Name], "the ConfigMap is the container's environment")
	require.True(t, refs["secret/"+sec.Name], "the Secret is the container's environment")
	known := documentedVariables(t)
	for name := range cm.Data {
		require.True(t, known[name], "ConfigMap variable %s is not one the relay reads", name)
	}
	for name := range sec.StringData {
		require.True(t, known[name], "Secret variable %s is not one the relay reads", name)
	}
}

// TestDockerfile: the Dockerfile starts FROM scratch and copies only what its comment
// says to put beside it; the command's packages build without cgo (a cgo-free Go binary is
// statically linked). When a Docker daemon answers, or OUTBOX_TEST_STATIC=1 asks, the
// static binary is built (a build of its own: minutes on a small machine), checked to
// have no interpreter and no dynamic section, and run; with a daemon the image is built
// and run too.
func TestDockerfile(t *testing.T) {
	df, err := os.ReadFile("Dockerfile")
	require.NoError(t, err)
	require.Regexp(t, `(?m)^FROM scratch$`, string(df))
	var copied []string
	for _, m := range regexp.MustCompile(`(?m)^COPY (\S+) `).FindAllStringSubmatch(string(df), -1) {
		copied = append(copied, m[1])
	}
	require.ElementsMatch(t, []string{"outbox", "ca-certificates.crt"}, copied)

	list := exec.Command("go", "list", "-deps", "-e", "-f", "{{with .Error}}{{$.ImportPath}}: {{.}}{{end}}", "./cmd/outbox")
	list.Dir = ".."
	list.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := list.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Empty(t, strings.TrimSpace(string(out)), "packages that do not build without cgo")

	docker, _ := exec.LookPath("docker")
	daemon := ""
	if docker == "" {
		daemon = "docker is not installed"
	} else if out, err := exec.Command(docker, "info").CombinedOutput(); err != nil {
		daemon = "no Docker daemon answers: " + firstLine(out)
	}
	if daemon != "" && os.Getenv("OUTBOX_TEST_STATIC") != "1" {
		t.Skipf("%s; the image and the static binary were not built (OUTBOX_TEST_STATIC=1 builds the binary)", daemon)
	}
	bin := buildStatic(t)
	f, err := elf.Open(bin)
	require.NoError(t, err)
	for _, p := range f.Progs {
		require.NotEqual(t, elf.PT_INTERP, p.Type, "the binary needs a dynamic loader")
		require.NotEqual(t, elf.PT_DYNAMIC, p.Type, "the binary is dynamically linked")
	}
	require.NoError(t, f.Close())
	out, err = exec.Command(bin, "version").CombinedOutput()
	require.NoError(t, err, "%s", out)
	if daemon != "" {
		t.Skipf("%s: the image was not built", daemon)
	}

	ctx := t.TempDir()
	require.NoError(t, copyFile(bin, filepath.Join(ctx, "outbox")))
	require.NoError(t, copyFile("/etc/ssl/certs/ca-certificates.crt", filepath.Join(ctx, "ca-certificates.crt")))
	require.NoError(t, os.WriteFile(filepath.Join(ctx, "Dockerfile"), df, 0o644))
	tag := fmt.Sprintf("outbox-relay-test:%d", time.Now().UnixNano())
	out, err = exec.Command(docker, "build", "-t", tag, ctx).CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Cleanup(func() { _ = exec.Command(docker, "rmi", "-f", tag).Run() })
	out, err = exec.Command(docker, "run", "--rm", tag, "version").CombinedOutput()
	require.NoError(t, err, "%s", out)
}

// firstLine returns the line of docker info's output that says what is wrong.
func firstLine(b []byte) string {
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if bytes.Contains(line, []byte("Cannot connect")) || bytes.Contains(line, []byte("rror")) {
			return string(bytes.TrimSpace(line))
		}
	}
	return string(bytes.TrimSpace(b))
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}
