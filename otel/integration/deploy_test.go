package integration_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.yaml.in/yaml/v3"

	"github.com/outboxgo/outbox"
	outboxotel "github.com/outboxgo/outbox/otel"
	"github.com/outboxgo/outbox/outboxtest/testdb"
)

// deployDir holds the alert rules and the dashboard.
const deployDir = "../../deploy"

// exported maps each series name to its label names.
type exported map[string]map[string]bool

var (
	scrapeOnce  sync.Once
	scrapeNames exported
)

// exportedNames returns the name and labels of every series a publisher's telemetry exports
// through the OpenTelemetry Prometheus exporter, histograms' _bucket, _sum and _count
// included, and the labels Prometheus adds to every scraped series (job, instance): a
// Publisher on PostgreSQL delivers, retries and dead-letters rows with every watcher of the
// module on, and the registry is gathered once the outcomes are in the table.
func exportedNames(t *testing.T) exported {
	t.Helper()
	scrapeOnce.Do(func() { scrapeNames = scrape(t) })
	if scrapeNames == nil {
		t.Fatal("the scrape failed (see the first test that asked for it)")
	}
	return scrapeNames
}

func scrape(t *testing.T) exported {
	ctx := context.Background()
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	require.NoError(t, err)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { _ = mp.Shutdown(ctx) }()
	tel, err := outboxotel.New(outboxotel.Options{MeterProvider: mp})
	require.NoError(t, err)

	e := setup(t, "postgres", tel.StoreHooks())
	ns := "deploy"
	tx, err := e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	var msgs []outbox.Message
	for i := range 6 {
		msgs = append(msgs, outbox.Message{Namespace: ns, Topic: "order.created", Payload: []byte(`{"n":` + string(rune('0'+i)) + `}`)})
	}
	msgs = append(msgs, outbox.Message{Namespace: ns, Topic: "refund.issued", Payload: []byte(`{"refused":true}`)})
	_, err = e.store.EnqueueBatch(ctx, tx, msgs)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())

	var mu sync.Mutex
	tries := map[string]int{}
	tr := outbox.TransportFunc(func(_ context.Context, batch []outbox.Delivery) []error {
		mu.Lock()
		defer mu.Unlock()
		errs := make([]error, len(batch))
		for i, d := range batch {
			tries[d.ID.String()]++
			switch {
			case d.Topic == "refund.issued":
				errs[i] = outbox.Permanent(errors.New("refused"))
			case tries[d.ID.String()] == 1 && i%2 == 0:
				errs[i] = errors.New("try again")
			}
		}
		return errs
	})
	opts := fast(ns)
	obs := tel.PublisherObserver(tr, ns)
	defer obs.Close()
	opts.Observer = obs
	pub, err := outbox.NewPublisher(e.store, tr, opts)
	require.NoError(t, err)
	stopListener := tel.WatchListener(ns, func() outbox.ListenerState { return pub.Stats().Listener })
	defer stopListener()
	// A log reader needs a server with wal_level=logical; its figures come through the same
	// callback whatever reads them, so fixed ones show the names.
	stopLog := tel.WatchLogReader("outbox_slot", func() outboxotel.LogReaderStats {
		return outboxotel.LogReaderStats{Reading: true, SlotLagBytes: 4096, RetainedWALBytes: 1 << 20}
	})
	defer stopLog()
	watcher, err := tel.WatchStore(e.store, outboxotel.WatchOptions{Interval: time.Hour, Name: "orders"})
	require.NoError(t, err)
	defer watcher.Close()

	stop := run(t, pub)
	testdb.Poll(t, 15*time.Second, "every row delivered or dead", func() bool {
		st := pub.Stats()
		return st.Delivered == 6 && st.Dead == 1
	})
	testdb.Poll(t, 15*time.Second, "the listener connected", func() bool { return pub.Stats().Listener == outbox.ListenerConnected })
	watcher.Refresh(ctx)
	families, err := registry.Gather()
	require.NoError(t, err)
	stop()

	names := exported{}
	add := func(name string, labels []*dto.LabelPair, extra ...string) {
		if names[name] == nil {
			names[name] = map[string]bool{"job": true, "instance": true}
		}
		for _, l := range labels {
			names[name][l.GetName()] = true
		}
		for _, l := range extra {
			names[name][l] = true
		}
	}
	for _, f := range families {
		n := f.GetName()
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				add(n+"_bucket", m.GetLabel(), "le")
				add(n+"_sum", m.GetLabel())
				add(n+"_count", m.GetLabel())
			default:
				add(n, m.GetLabel())
			}
		}
	}
	return names
}

// exprs are the PromQL expressions of a deployment file, by where they are.
type exprs map[string]string

// ruleExprs returns the expressions of a Prometheus rules file.
func ruleExprs(t *testing.T, path string) exprs {
	t.Helper()
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert, Record, Expr string
			}
		}
	}
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &f))
	out := exprs{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out[path+": "+r.Alert+r.Record] = r.Expr
		}
	}
	require.NotEmpty(t, out, path)
	return out
}

// testSeries returns the series of a promtool unit-test file, as selectors.
func testSeries(t *testing.T, path string) exprs {
	t.Helper()
	var f struct {
		Tests []struct {
			InputSeries []struct{ Series string } `yaml:"input_series"`
		}
	}
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &f))
	out := exprs{}
	for i, tc := range f.Tests {
		for j, s := range tc.InputSeries {
			out[path+": test "+strconv.Itoa(i)+" series "+strconv.Itoa(j)] = s.Series
		}
	}
	require.NotEmpty(t, out, path)
	return out
}

// grafanaVars are the variables of Grafana's that may stand in a query, with a value the
// PromQL parser accepts.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// labelValues matches Grafana's label_values(metric, label) in a variable's query.
var labelValues = regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)`)

// dashboardExprs returns the expressions of a Grafana dashboard: every panel target's expr
// and every query variable's metric.
func dashboardExprs(t *testing.T, path string) exprs {
	t.Helper()
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
			Panels  []json.RawMessage
		}
		Templating struct {
			List []struct {
				Name, Type string
				Query      any
			}
		}
	}
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &d))
	out := exprs{}
	for _, p := range d.Panels {
		for i, tg := range p.Targets {
			out[path+": "+p.Title+" #"+strconv.Itoa(i)] = grafanaVars.Replace(tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(string)
		if m, ok := v.Query.(map[string]any); ok {
			q, _ = m["query"].(string)
		}
		sub := labelValues.FindStringSubmatch(q)
		require.NotNil(t, sub, "variable %s: %q", v.Name, q)
		out[path+": variable "+v.Name] = sub[1]
	}
	require.NotEmpty(t, out, path)
	return out
}

// missing returns, for each expression, the metric names it selects that are not exported,
// the label names it matches or groups by that those metrics do not have, and the
// expressions that do not parse.
func missing(all exprs, names exported) []string {
	var out []string
	for where, expr := range all {
		e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
		if err != nil {
			out = append(out, where+": "+err.Error())
			continue
		}
		var grouping []string
		labels := map[string]bool{} // of every metric the expression selects
		selected := 0
		parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
			switch n := n.(type) {
			case *parser.AggregateExpr:
				grouping = append(grouping, n.Grouping...)
			case *parser.VectorSelector:
				selected++
				have, ok := names[n.Name]
				if !ok {
					out = append(out, where+": "+n.Name+" is not exported")
					return nil
				}
				for l := range have {
					labels[l] = true
				}
				for _, m := range n.LabelMatchers {
					if m.Name != "__name__" && !have[m.Name] {
						out = append(out, where+": "+n.Name+" has no label "+m.Name)
					}
				}
			}
			return nil
		})
		if selected == 0 {
			out = append(out, where+": selects no metric")
		}
		for _, l := range grouping {
			if len(labels) > 0 && !labels[l] {
				out = append(out, where+": no metric it selects has label "+l)
			}
		}
	}
	slices.Sort(out)
	return out
}

// Every metric the alert rules, their unit tests and the dashboard name is one the module
// really exports, with the labels they match and group by; a misspelled one is caught.
func TestDeployNamesExportedMetrics(t *testing.T) {
	names := exportedNames(t)
	all := exprs{}
	for _, m := range []exprs{
		ruleExprs(t, filepath.Join(deployDir, "prometheus/outbox-alerts.yml")),
		testSeries(t, filepath.Join(deployDir, "prometheus/outbox-alerts.test.yml")),
		dashboardExprs(t, filepath.Join(deployDir, "grafana/outbox.json")),
	} {
		for k, v := range m {
			all[k] = v
		}
	}
	require.Empty(t, missing(all, names), "exported: %v", sortedKeys(names))

	// The check catches a name without its unit suffix, a gauge read as a counter, and
	// an expression that does not parse.
	bad := missing(exprs{
		"a": `max(outbox_oldest_undelivered_age) > 300`,
		"b": `rate(outbox_circuit_open_total[5m])`,
		"c": `outbox_messages{outbox_state="dead"}`,
		"d": `max by (outbox_namespace, topic) (outbox_oldest_pending_age_seconds)`,
		"e": `up{a>1}`,
	}, names)
	require.Len(t, bad, 5, "%q", bad)
	require.Equal(t, []string{
		"a: outbox_oldest_undelivered_age is not exported",
		"b: outbox_circuit_open_total is not exported",
		"c: outbox_messages has no label outbox_state",
		"d: no metric it selects has label topic",
	}, bad[:4])
	require.True(t, strings.HasPrefix(bad[4], "e: 1:5: parse error"), bad[4])
	t.Logf("exported: %v", sortedKeys(names))
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// The alert rules pass promtool's checks and their unit tests, which fire and hold back
// every alert.
func TestAlertRulesPromtool(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if testdb.Required("promtool") {
			t.Fatal("no promtool on PATH: install Debian's prometheus package (apt-get install -y prometheus; stop the service it may start), or set OUTBOX_TEST_SKIP=promtool to skip this test on purpose")
		}
		t.Skip("SKIPPING PROMTOOL TEST: no promtool; OUTBOX_TEST_SKIP allows it")
	}
	dir := filepath.Join(deployDir, "prometheus")
	for _, args := range [][]string{
		{"check", "rules", "outbox-alerts.yml"},
		{"test", "rules", "outbox-alerts.test.yml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	}
}
