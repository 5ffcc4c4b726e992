package outboxotel

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// SlotKey names the replication slot of a log reader's metrics.
const SlotKey = attribute.Key("outbox.log.slot")

// LogReaderStats are what a log reader tells of its replication slot, as the function given
// to [Telemetry.WatchLogReader] returns them. The fields mirror those of the same names in the
// PostgreSQL log reader's Stats (module logrepl/pglog), so that this module imports no log
// reader and its dependencies.
type LogReaderStats struct {
	// Reading is whether this process holds the slot now (a standby waits for it).
	Reading bool
	// SlotLagBytes is how far the slot's confirmed position is behind the server's WAL;
	// RetainedWALBytes how much WAL the slot keeps from being recycled.
	SlotLagBytes, RetainedWALBytes int64
	// SlotResets counts the times the slot was found lost and created again.
	SlotResets int64
}

// logReaderWatch is one log reader the outbox.log.* metrics report.
type logReaderWatch struct {
	attrs attribute.Set
	read  func() LogReaderStats
}

// WatchLogReader reports a log reader's slot: outbox.log.reading (1 while this process holds
// the slot), outbox.log.slot.lag and outbox.log.slot.retained_wal (bytes) and
// outbox.log.slot.resets (a counter), with outbox.log.slot set to slot. read is called at
// each collection and must be quick; for the PostgreSQL log reader:
//
//	tel.WatchLogReader("outbox", func() outboxotel.LogReaderStats {
//		s := logPub.Stats()
//		return outboxotel.LogReaderStats{Reading: s.Reading, SlotLagBytes: s.SlotLagBytes,
//			RetainedWALBytes: s.RetainedWALBytes, SlotResets: s.SlotResets}
//	})
//
// The returned function stops the reporting. A nil read is ignored.
func (t *Telemetry) WatchLogReader(slot string, read func() LogReaderStats) (stop func()) {
	if read == nil {
		return func() {}
	}
	w := &logReaderWatch{attrs: attribute.NewSet(SlotKey.String(slot)), read: read}
	t.mu.Lock()
	t.logReaders[w] = struct{}{}
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		delete(t.logReaders, w)
		t.mu.Unlock()
	}
}

func (w *logReaderWatch) observe(t *Telemetry, o metric.Observer) {
	st := w.read()
	reading := int64(0)
	if st.Reading {
		reading = 1
	}
	opt := metric.WithAttributeSet(w.attrs)
	o.ObserveInt64(t.logReading, reading, opt)
	o.ObserveInt64(t.slotLag, st.SlotLagBytes, opt)
	o.ObserveInt64(t.slotRetained, st.RetainedWALBytes, opt)
	o.ObserveInt64(t.slotResets, st.SlotResets, opt)
}
