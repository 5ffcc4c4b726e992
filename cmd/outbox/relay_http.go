package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/otel"
	"github.com/outboxgo/outbox/outboxui"
)

// relayMetrics holds the Prometheus registry that /metrics serves: the otel module's
// instruments through the OpenTelemetry Prometheus exporter, and the relay's own gauges.
type relayMetrics struct {
	registry *prometheus.Registry
	mp       *sdkmetric.MeterProvider
	tel      *outboxotel.Telemetry
	meter    metric.Meter
}

// metricStoreUp is the relay's own gauge, beside the otel module's (outbox_*):
// docs/relay.md lists them.
const metricStoreUp = "outbox.relay.store.up"

func newRelayMetrics() (*relayMetrics, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("metrics: %v", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	tel, err := outboxotel.New(outboxotel.Options{MeterProvider: mp})
	if err != nil {
		return nil, err
	}
	return &relayMetrics{registry: reg, mp: mp, tel: tel, meter: mp.Meter("github.com/outboxgo/outbox/cmd/outbox")}, nil
}

// watch registers what /metrics reports of the relay beyond its publishers' instruments:
// each store's health (outbox.relay.store.up), its wake-up listener
// (outbox.listener.connected) and, for log delivery, its reader's slot (outbox.log.*). It
// returns the function that stops the reporting.
func (m *relayMetrics) watch(relay *outbox.Relay, stores []*relayStore) func() {
	var stops []func()
	for _, s := range stores {
		name := s.name
		stops = append(stops, m.tel.WatchListener(name, func() outbox.ListenerState { return relay.Stats().Stores[name].Listener }))
		if s.reader != nil {
			stops = append(stops, m.tel.WatchLogReader(s.reader.id, s.reader.metrics))
		}
	}
	up, _ := m.meter.Int64ObservableGauge(metricStoreUp,
		metric.WithDescription("1 while the relay's store is healthy (its check passed and its last claim succeeded), 0 while starting, down or misconfigured."))
	reg, err := m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := relay.Stats()
		for _, s := range stores {
			v := int64(0)
			if st.Stores[s.name].State == outbox.StoreHealthy {
				v = 1
			}
			o.ObserveInt64(up, v, metric.WithAttributes(outboxotel.PublisherKey.String(s.name)))
		}
		return nil
	}, up)
	if err == nil {
		stops = append(stops, func() { _ = reg.Unregister() })
	}
	return func() {
		for _, stop := range stops {
			stop()
		}
	}
}

// relayHTTP serves /healthz, /readyz, /metrics and, optionally, the web view.
type relayHTTP struct {
	relay  *outbox.Relay
	stores []*relayStore
	broker *broker
	spec   *brokerSpec
	met    *relayMetrics
}

// readyTimeout bounds the broker's ping of one /readyz.
const readyTimeout = 2 * time.Second

func (h *relayHTTP) mux(rc *relayConfig) (*http.ServeMux, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", h.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(h.met.registry, promhttp.HandlerOpts{}))
	if rc.UI {
		stores := map[string]*outbox.Store{}
		for _, s := range h.stores {
			stores[s.name] = s.store
		}
		ui, err := outboxui.Databases(outboxui.RelayDatabases(h.relay, stores), outboxui.Options{Prefix: "/ui", ReadOnly: rc.UIReadOnly})
		if err != nil {
			return nil, err
		}
		var handler http.Handler = ui
		if rc.UIToken != "" {
			handler = requireToken(rc.UIToken, ui)
		} else {
			handler = requireLoopbackHost(ui)
		}
		mux.Handle("/ui/", handler)
	}
	return mux, nil
}

// readyz answers 200 when every database is healthy, the broker answers its ping and the
// circuit is closed, and every log reader holds its slot or binlog lock (or stands by for
// another relay's); otherwise 503. The body has a line per check, so that a probe's log
// says what is not ready.
func (h *relayHTTP) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	var lines []string
	ready := true
	st := h.relay.Stats()
	names := make([]string, 0, len(h.stores))
	for _, s := range h.stores {
		names = append(names, s.name)
	}
	slices.Sort(names)
	for _, name := range names {
		ss := st.Stores[name]
		line := fmt.Sprintf("database %s: %s", name, ss.State)
		switch ss.Listener {
		case outbox.ListenerConnected:
			line += " (wake-up listener connected)"
		case outbox.ListenerDown:
			// Degraded, not unready: polling still finds every row, later.
			line += " (wake-up listener down: polling)"
		}
		if ss.State != outbox.StoreHealthy {
			ready = false
			if ss.LastError != "" {
				line += ": " + oneLine(ss.LastError)
			}
		}
		lines = append(lines, line)
	}
	if err := h.broker.ping(ctx); err != nil {
		ready = false
		lines = append(lines, fmt.Sprintf("broker %s: unreachable: %s", h.spec.shown, oneLine(err.Error())))
	} else {
		lines = append(lines, fmt.Sprintf("broker %s: reachable", h.spec.shown))
	}
	if st.Total.CircuitOpen {
		ready = false
		lines = append(lines, fmt.Sprintf("circuit: open since %s (deliveries paused: the broker failed a whole batch)", st.Total.CircuitOpenedAt.UTC().Format(time.RFC3339)))
	} else {
		lines = append(lines, "circuit: closed")
	}
	for _, s := range h.stores {
		if s.reader == nil {
			continue
		}
		ls := s.reader.state()
		switch {
		case ls.reading:
			lines = append(lines, fmt.Sprintf("log listener %s: reading %s", s.name, s.reader.what))
		case ls.standby:
			lines = append(lines, fmt.Sprintf("log listener %s: standby (another reader holds %s)", s.name, s.reader.held))
		default:
			ready = false
			line := fmt.Sprintf("log listener %s: stopped (%s)", s.name, s.reader.what)
			if e := s.reader.failed.Load(); e != nil {
				line += ": " + oneLine(*e)
			}
			lines = append(lines, line)
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if ready {
		w.WriteHeader(http.StatusOK)
		fmt.Fprintln(w, "ready")
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "not ready")
	}
	fmt.Fprintln(w, strings.Join(lines, "\n"))
}
