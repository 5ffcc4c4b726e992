package sqlkit

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox/dialect"
)

// TestCheckInsertLeases: a dialect that cannot insert leased rows refuses a batch in which
// any row carries a lease, and accepts one in which none does.
func TestCheckInsertLeases(t *testing.T) {
	rows := []dialect.Row{{ID: uuid.New()}, {ID: uuid.New()}}
	require.NoError(t, CheckInsertLeases(rows))
	rows[1].Lease = dialect.InsertLease{WorkerID: "w", Token: uuid.New(), Duration: time.Minute}
	require.True(t, errors.Is(CheckInsertLeases(rows), errors.ErrUnsupported))
}
