package main

import (
	"flag"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRelayReferenceInDocs: docs/relay.md's table of settings is the one relayKeys renders,
// so that it cannot drift from the flags (regenerate it with
// OUTBOX_WRITE_REFERENCE=1 go test -run TestRelayReferenceInDocs), and it names every
// broker option.
func TestRelayReferenceInDocs(t *testing.T) {
	t.Parallel()
	const path = "../../docs/relay.md"
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	doc := string(b)
	const begin, end = "<!-- settings: generated from cmd/outbox/relay_config.go -->\n", "<!-- end of settings -->"
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	require.True(t, i >= 0 && j > i, "docs/relay.md has no generated settings table")
	want := relayReference()
	if os.Getenv("OUTBOX_WRITE_REFERENCE") == "1" {
		require.NoError(t, os.WriteFile(path, []byte(doc[:i+len(begin)]+want+doc[j:]), 0o644))
		return
	}
	require.Equal(t, want, doc[i+len(begin):j], "docs/relay.md's settings table is stale: regenerate it")
	for scheme, opts := range brokerOptions {
		for _, o := range append(slices.Clone(opts), commonBrokerOptions...) {
			require.Contains(t, doc, "`"+o+"`", "broker option %s of %s is not documented", o, scheme)
		}
	}
}

// TestRelayFlagsAreTheKeys: every relay flag the command registers is a documented
// setting, and every setting has a flag.
func TestRelayFlagsAreTheKeys(t *testing.T) {
	t.Parallel()
	c := newCLI(func(string) string { return "" }, nil, nil)
	fs := c.flagSet("relay")
	relayFlags(fs, map[string][]string{})
	flags := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { flags[f.Name] = true })
	for _, k := range relayKeys {
		require.True(t, flags[k.flag], "setting %s has no flag --%s", k.key, k.flag)
		require.True(t, strings.HasPrefix(k.env, "OUTBOX_"), k.env)
	}
}

// TestRelayExampleConfig: deploy/relay.toml is a valid config file.
func TestRelayExampleConfig(t *testing.T) {
	t.Parallel()
	rc := newRelayConfig()
	require.NoError(t, loadRelayFile(rc, "../../deploy/relay.toml"))
	require.NoError(t, rc.validate())
	require.Len(t, rc.Databases, 2)
	_, err := parseBroker(rc.Broker, rc.BrokerOptions)
	require.NoError(t, err)
}
