package outboxpglog

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
)

// TestTransactionShapes: a payload big enough to be TOASTed arrives byte for byte, a
// transaction of many rows arrives whole and in insert order, and a transaction that
// began first but commits last is delivered after the one that committed before it.
func TestTransactionShapes(t *testing.T) {
	leakCheck(t)
	b := setup(t, time.Minute)
	lp := b.publisher(t, Options{Slot: "shapes_slot", BatchSize: 300})
	b.start(t, lp)

	big := msg(0)
	blob := make([]byte, 256<<10)
	_, _ = rand.NewChaCha8([32]byte{1}).Read(blob)
	// Hex of random bytes compresses to about half: stored out of line, in TOAST.
	big.Payload = json.RawMessage(`{"blob":"` + hex.EncodeToString(blob) + `"}`)
	bigID := b.enqueue(t, big)[0]

	many := make([]outbox.Message, 1000)
	for i := range many {
		many[i] = msg(1000 + i)
	}
	tx, err := b.db.BeginTx(b.ctx, nil)
	require.NoError(t, err)
	res, err := b.store.EnqueueBatch(b.ctx, tx, many)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	manyIDs := make([]uuid.UUID, len(res))
	for i, r := range res {
		manyIDs[i] = r.ID
	}

	long, err := b.db.BeginTx(b.ctx, nil)
	require.NoError(t, err)
	defer func() { _ = long.Rollback() }()
	first, err := b.store.Enqueue(b.ctx, long, msg(-1))
	require.NoError(t, err)
	second := b.enqueue(t, msg(-2))[0]
	require.NoError(t, long.Commit())

	all := append(append([]uuid.UUID{bigID}, manyIDs...), second, first.ID)
	b.waitDelivered(t, "every row is delivered", all)
	got := b.tr.deliveries()
	require.Equal(t, all, deliveredIDs(got), "in commit order")
	require.Equal(t, string(big.Payload), string(got[0].Payload), "the TOASTed payload byte for byte")
	for i, d := range got[1 : 1+len(many)] {
		require.Equal(t, fmt.Sprintf(`{"n":%d}`, 1000+i), string(d.Payload))
	}
	b.wait(t, "the publisher counts its settles", func() bool { return lp.Stats().Delivered == int64(len(all)) })
	require.Zero(t, lp.Stats().Dead, "every payload passed its integrity check")
}
