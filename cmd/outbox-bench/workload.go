package main

import (
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
)

// The rows every scenario writes, library and raw alike: one namespace and topic, a partition
// key, no tenant, dedupe key or headers, and a JSON payload of 200 to 500 bytes.
const (
	benchNamespace = "bench"
	benchTopic     = "order.paid"
	businessTable  = "bench_orders"
	mainTable      = outbox.DefaultTable
	retainedTable  = "outbox_retained"
	// orderedTable is the ordered burn-down's table: the library's with the ordered
	// migration set, which ordered publishers need and the other scenarios' tables lack.
	orderedTable = "outbox_ordered"
)

// payloads are 64 deterministic order events of 200 to 500 bytes.
var payloads = orderEvents(func(r *rand.Rand) int { return 200 + r.IntN(301) })

// payloads200 are 64 deterministic order events of exactly 200 bytes: the rows of the short
// drains and the table-cost scenario.
var payloads200 = orderEvents(func(*rand.Rand) int { return 200 })

// orderEvents returns 64 deterministic JSON order events of size bytes each.
func orderEvents(size func(r *rand.Rand) int) [][]byte {
	r := rand.New(rand.NewPCG(1, 2))
	out := make([][]byte, 64)
	for i := range out {
		size := size(r)
		var b strings.Builder
		fmt.Fprintf(&b, `{"order_id":%d,"customer_id":%d,"status":"paid","amount_cents":%d,"currency":"EUR","items":[`,
			100000+i, r.IntN(1_000_000), r.IntN(100_000))
		for j := 0; b.Len() < size-40; j++ {
			if j > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"sku":"SKU-%05d","qty":%d}`, r.IntN(100000), 1+r.IntN(5))
		}
		b.WriteString(`],"note":"`)
		for b.Len() < size-2 {
			b.WriteByte('x')
		}
		b.WriteString(`"}`)
		out[i] = []byte(b.String())
	}
	return out
}

// payloadBytes is the mean payload size, for the report.
func payloadBytes() (lo, hi, mean int) {
	lo, hi, sum := 1<<30, 0, 0
	for _, p := range payloads {
		lo, hi, sum = min(lo, len(p)), max(hi, len(p)), sum+len(p)
	}
	return lo, hi, sum / len(payloads)
}

func partitionKey(i int) string { return "order-" + strconv.Itoa(i) }

// message is the i-th event as the library enqueues it.
func message(i int) outbox.Message {
	return outbox.Message{
		Namespace:    benchNamespace,
		Topic:        benchTopic,
		PartitionKey: partitionKey(i),
		Payload:      payloads[i%len(payloads)],
	}
}

// rawRow is the i-th event as hand-written SQL inserts it: the same columns the library
// writes, with the id (UUIDv7) and SHA-256 computed here, as the library computes them.
type rawRow struct {
	id        uuid.UUID
	namespace string
	topic     string
	pkey      string
	payload   []byte
	hash      []byte
}

func newRawRow(i int) rawRow { return rawRowOf(i, payloads) }

func newRawRows(start, n int) []rawRow { return rawRowsOf(start, n, payloads) }

// rawRowOf is the i-th event with its payload from set.
func rawRowOf(i int, set [][]byte) rawRow {
	p := set[i%len(set)]
	sum := sha256.Sum256(p)
	return rawRow{
		id: uuid.Must(uuid.NewV7()), namespace: benchNamespace, topic: benchTopic,
		pkey: partitionKey(i), payload: p, hash: sum[:],
	}
}

func rawRowsOf(start, n int, set [][]byte) []rawRow {
	rows := make([]rawRow, n)
	for i := range rows {
		rows[i] = rawRowOf(start+i, set)
	}
	return rows
}

// rawMsg is what a hand-written relay reads back from its claim: what a transport needs.
type rawMsg struct {
	topic    string
	pkey     []byte
	headers  []byte
	payload  []byte
	attempts int
}
