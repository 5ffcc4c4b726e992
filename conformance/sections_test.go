package conformance

import (
	"go/parser"
	"go/token"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSectionsListed: the package comment's list has one item per section Run runs, with
// its number and name, and names every test of the section after "Tests:"; so a test or a
// section added without being listed fails here.
func TestSectionsListed(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "conformance.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	require.NoError(t, err)
	doc := f.Doc.Text()
	heads := regexp.MustCompile(`(?m)^ *(\d+)\. (\w+)`).FindAllStringSubmatchIndex(doc, -1)
	items := map[string]string{} // "number name" → the item's text
	for i, h := range heads {
		end := len(doc)
		if i+1 < len(heads) {
			end = heads[i+1][0]
		}
		text := doc[h[0]:end]
		if j := strings.Index(text, "\n\n"); j >= 0 {
			text = text[:j]
		}
		items[doc[h[2]:h[3]]+" "+doc[h[4]:h[5]]] = text
	}
	require.Len(t, items, len(areas), "the package comment lists one item per section: %v", items)
	for _, a := range areas {
		key := strconv.Itoa(a.section) + " " + a.name
		text, ok := items[key]
		require.True(t, ok, "the package comment lists section %q", key)
		_, tests, ok := strings.Cut(text, "Tests:")
		require.True(t, ok, "section %q names its tests after \"Tests:\"", key)
		names := regexp.MustCompile(`\w+`).FindAllString(tests, -1)
		require.Len(t, names, len(a.tests), "section %q lists %v", key, names)
		for i, tc := range a.tests {
			require.Equal(t, tc.name, names[i], "section %q lists its tests in the order they are declared", key)
		}
	}
}
