package outbox_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestREADMEQuickStartIsExample keeps the README's quick start and Example_quickStart one
// program: the example runs under go test, the README's copy under docscheck, and neither
// may drift from the other. Only the line that opens the database differs (the example's
// file lives in a temporary directory).
func TestREADMEQuickStartIsExample(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	_, block, ok := strings.Cut(string(readme), "```go runnable\n")
	require.True(t, ok, "README.md has no runnable Go block")
	block, _, ok = strings.Cut(block, "\n```")
	require.True(t, ok)
	_, body, ok := strings.Cut(block, "func main() {\n")
	require.True(t, ok)
	body = strings.TrimSuffix(body, "}")

	example, err := os.ReadFile("example_quickstart_test.go")
	require.NoError(t, err)
	_, ex, ok := strings.Cut(string(example), "\tctx := context.Background()\n")
	require.True(t, ok)
	ex, _, ok = strings.Cut("\tctx := context.Background()\n"+ex, "\t// Output:")
	require.True(t, ok)

	open := func(line string) bool { return strings.HasPrefix(strings.TrimSpace(line), "db, err := sql.Open(") }
	want, got := strings.Split(strings.TrimSpace(body), "\n"), strings.Split(strings.TrimSpace(ex), "\n")
	require.Len(t, got, len(want), "the example and the README's quick start differ in length")
	for i := range want {
		if open(want[i]) && open(got[i]) {
			continue
		}
		require.Equal(t, want[i], got[i], "line %d of the quick start's main", i+1)
	}
}
