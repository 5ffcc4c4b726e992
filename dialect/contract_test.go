package dialect_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// interfaces returns the exported interfaces of the package, by name, parsed from its
// source files (tests excluded).
func interfaces(t *testing.T) map[string]*ast.GenDecl {
	t.Helper()
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	require.NoError(t, err)
	out := map[string]*ast.GenDecl{}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, e.Name(), nil, parser.ParseComments)
		require.NoError(t, err)
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, sp := range g.Specs {
				ts := sp.(*ast.TypeSpec)
				if _, ok := ts.Type.(*ast.InterfaceType); ok && ts.Name.IsExported() {
					out[ts.Name.Name] = g
				}
			}
		}
	}
	return out
}

// listed returns the names in the package comment's list under "# The contract": the
// bullet items that begin with a doc link.
func listed(t *testing.T) []string {
	t.Helper()
	src, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	text := string(src)
	start := strings.Index(text, "// # The contract")
	require.GreaterOrEqual(t, start, 0, "doc.go has a section # The contract")
	end := strings.Index(text[start+1:], "// # ")
	require.Greater(t, end, 0)
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^//\s+- \[(\w+)\]:`).FindAllStringSubmatch(text[start:start+1+end], -1) {
		names = append(names, m[1])
	}
	return names
}

// TestContractListed: every exported interface of the package is in doc.go's list of the
// contract, once, and the list names nothing else; so an ability added to the package
// without being listed fails here.
func TestContractListed(t *testing.T) {
	ifaces := interfaces(t)
	names := listed(t)
	for name := range ifaces {
		require.Equal(t, 1, strings.Count(","+strings.Join(names, ",")+",", ","+name+","),
			"interface %s must be listed once in doc.go's # The contract, which lists %v", name, names)
	}
	for _, name := range names {
		require.Contains(t, ifaces, name, "doc.go's # The contract lists %s, which is not an exported interface of the package", name)
	}
	require.LessOrEqual(t, len(names)-2, 6, "the contract stays small: at most six interfaces a dialect implements, beside DBTX and Runner")
}

// TestContractDocumented: every interface a dialect implements has a numbered checklist in
// its doc comment, and every method of every interface is documented.
func TestContractDocumented(t *testing.T) {
	for name, g := range interfaces(t) {
		ts := g.Specs[0].(*ast.TypeSpec)
		doc := g.Doc.Text()
		require.True(t, strings.HasPrefix(doc, name+" "), "interface %s has a doc comment that begins with its name", name)
		if !slices.Contains([]string{"DBTX", "Runner"}, name) { // implemented by database/sql and by adapters, not by a dialect
			require.Regexp(t, `(?m)^ *1\. `, doc, "interface %s's doc comment has a numbered checklist", name)
		}
		if name == "DBTX" {
			continue // the three methods of *sql.DB, documented there
		}
		for _, m := range ts.Type.(*ast.InterfaceType).Methods.List {
			require.NotNil(t, m.Doc, "method %s.%s is documented", name, m.Names[0].Name)
		}
	}
}
