package outbox

import (
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// TestPGUUIDArray: the array literal holds every id in uuid.UUID.String's form.
func TestPGUUIDArray(t *testing.T) {
	ids := []uuid.UUID{uuid.Nil, uuid.Max, uuid.New(), uuid.New()}
	want := make([]string, len(ids))
	for i, id := range ids {
		want[i] = id.String()
	}
	require.Equal(t, "{"+strings.Join(want, ",")+"}", pgUUIDArray(len(ids), func(i int) uuid.UUID { return ids[i] }))
	require.Equal(t, "{}", pgUUIDArray(0, nil))
}
