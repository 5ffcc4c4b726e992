package outbox_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStoreDocListsEveryMethod keeps the Store's doc comment, which sorts its methods by
// audience, true: every exported method is named there, and nothing else.
func TestStoreDocListsEveryMethod(t *testing.T) {
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	require.NoError(t, err)
	var doc string
	methods := map[string]bool{}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		require.NoError(t, err)
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					if ts, ok := sp.(*ast.TypeSpec); ok && ts.Name.Name == "Store" {
						doc = d.Doc.Text()
					}
				}
			case *ast.FuncDecl:
				if d.Recv == nil || !d.Name.IsExported() {
					continue
				}
				if star, ok := d.Recv.List[0].Type.(*ast.StarExpr); ok && star.X.(*ast.Ident).Name == "Store" {
					methods[d.Name.Name] = true
				}
			}
		}
	}
	require.NotEmpty(t, doc)
	for m := range methods {
		switch m {
		case "DB", "Dialect", "Table": // accessors
			continue
		}
		require.Contains(t, doc, "[Store."+m+"]", "the Store's doc comment does not name %s under its audience", m)
	}
	for _, part := range strings.Split(doc, "[Store.")[1:] {
		name, _, _ := strings.Cut(part, "]")
		require.True(t, methods[name], "the Store's doc comment names %s, which is not a method", name)
	}
}
