package e2e_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWireFormatShowsTheSQL: docs/wire-format.md shows each statement of docs/sql, the ones
// these tests run, in a sql block as it is, so the page cannot drift from what is tested.
func TestWireFormatShowsTheSQL(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "wire-format.md"))
	require.NoError(t, err)
	files, err := filepath.Glob(filepath.Join("..", "..", "..", "docs", "sql", "*.sql"))
	require.NoError(t, err)
	require.Len(t, files, 5)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		block := "```sql\n" + strings.TrimRight(string(b), "\n") + "\n```\n"
		require.Contains(t, string(doc), block, "docs/wire-format.md does not show %s as it is", filepath.Base(f))
	}
}
