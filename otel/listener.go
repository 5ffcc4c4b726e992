package outboxotel

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/outboxgo/outbox"
)

// listenerWatch is one publisher whose listener outbox.listener.connected reports.
type listenerWatch struct {
	attrs attribute.Set
	state func() outbox.ListenerState
}

// WatchListener reports outbox.listener.connected for the publisher called name (the
// outbox.publisher attribute, as on outbox.circuit.open): 1 while state returns
// [outbox.ListenerConnected], 0 while [outbox.ListenerDown] (rows committed by other
// processes wait for a poll), and nothing while [outbox.ListenerNone] (the publisher polls
// by design, or is not running). state is called at each collection and must be quick:
//
//	tel.WatchListener("shop", func() outbox.ListenerState { return pub.Stats().Listener })
//
// or, for a store of a relay, relay.Stats().Stores[name].Listener. The returned function
// stops the reporting. A nil state is ignored.
func (t *Telemetry) WatchListener(name string, state func() outbox.ListenerState) (stop func()) {
	if state == nil {
		return func() {}
	}
	w := &listenerWatch{attrs: attribute.NewSet(PublisherKey.String(name), semconv.MessagingSystemKey.String(t.system)), state: state}
	t.mu.Lock()
	t.listeners[w] = struct{}{}
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		delete(t.listeners, w)
		t.mu.Unlock()
	}
}

func (w *listenerWatch) observe(t *Telemetry, o metric.Observer) {
	var v int64
	switch w.state() {
	case outbox.ListenerConnected:
		v = 1
	case outbox.ListenerDown:
	default:
		return
	}
	o.ObserveInt64(t.listenerUp, v, metric.WithAttributeSet(w.attrs))
}
