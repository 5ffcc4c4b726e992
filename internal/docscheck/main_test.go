package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// fixture writes a small repository: a module whose package declares New and Store.Stats,
// and the given Markdown files.
func fixture(t *testing.T, files map[string]string) (*checker, []*doc) {
	t.Helper()
	root := t.TempDir()
	files["go.mod"] = "module example.com/fixture\n\ngo 1.26\n"
	files["outbox.go"] = "package outbox\n\nfunc New() {}\n\ntype Store struct{}\n\nfunc (*Store) Stats() {}\n"
	for name, text := range files {
		require.NoError(t, os.MkdirAll(filepath.Join(root, filepath.Dir(name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, name), []byte(text), 0o644))
	}
	mds, err := markdownFiles(root)
	require.NoError(t, err)
	var docs []*doc
	for _, f := range mds {
		d, err := readDoc(root, f)
		require.NoError(t, err)
		docs = append(docs, d)
	}
	return &checker{root: root, backends: []string{"sqlite"}, bin: t.TempDir()}, docs
}

func failuresText(c *checker) string { return strings.Join(c.failures, "\n") }

func TestLinks(t *testing.T) {
	t.Parallel()
	c, docs := fixture(t, map[string]string{
		"README.md": "# Title\n\n## The `outbox migrate up|down` command (v2)\n\n## Twice\n\n## Twice\n\n" +
			"[ok](docs/a.md) [ok](docs/a.md#section-one) [ok](#the-outbox-migrate-updown-command-v2) [ok](#twice-1)\n" +
			"[web](https://example.com/x#y) `[not a link](nowhere.md)`\n" +
			"[missing file](docs/b.md) [missing anchor](docs/a.md#section-two) [own anchor](#twice-2)\n\n" +
			"```md\n[inside a block](nowhere.md)\n```\n",
		"docs/a.md": "# A\n\n## Section one\n\n[up](../README.md#title) [out](../../x.md)\n",
	})
	c.links(docs)
	require.Equal(t, 9, c.nLinks, failuresText(c))
	require.Len(t, c.failures, 4, failuresText(c))
	require.Contains(t, c.failures[0], `README.md:11: link "docs/b.md": no file docs/b.md`)
	require.Contains(t, c.failures[1], `README.md:11: link "docs/a.md#section-two": docs/a.md has no heading with anchor #section-two`)
	require.Contains(t, c.failures[2], `README.md:11: link "#twice-2"`)
	require.Contains(t, c.failures[3], `docs/a.md:5: link "../../x.md" leaves the repository`)
}

func TestGoBlocks(t *testing.T) { // not parallel: it sets GOWORK for go vet
	c, docs := fixture(t, map[string]string{
		"outboxui/ui.go": "package outboxui\n\nfunc Handler() {}\n",
		"README.md": "```go\noutbox.New()\nstore.Stats() // store.Gone in a comment is prose\nx := \"outbox.Gone\"\noutboxui.Handler()\n```\n\n" +
			"```go\noutbox.Gone()\nstore.Vanished()\noutboxui.Handle()\n```\n\n" +
			"```go\npackage main\n\nfunc main() {\n\tfmt.Println(\"no import\")\n}\n```\n\n" +
			"```go\n// A whole file.\npackage main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"fine\")\n}\n```\n",
	})
	t.Setenv("GOWORK", "off")
	c.goBlocks(docs)
	require.Equal(t, 4, c.nGo)
	require.Equal(t, 2, c.nVet)
	require.Len(t, c.failures, 4, failuresText(c))
	require.Contains(t, c.failures[0], "README.md:8: Go block uses outbox.Gone, which does not exist")
	require.Contains(t, c.failures[1], "README.md:8: Go block uses outboxui.Handle, which does not exist")
	require.Contains(t, c.failures[2], "README.md:8: Go block uses store.Vanished (a Store method), which does not exist")
	require.Contains(t, c.failures[3], "README.md:14: go vet of the block")
	require.Contains(t, c.failures[3], "undefined: fmt")
}

func TestRunnableGoBlocks(t *testing.T) { // not parallel: it sets GOWORK for go build
	c, docs := fixture(t, map[string]string{
		"README.md": "```go runnable\npackage main\n\nimport \"os\"\n\nfunc main() {\n\tif err := os.WriteFile(\"app.db\", nil, 0o644); err != nil {\n\t\tpanic(err)\n\t}\n}\n```\n\n" +
			"```go runnable\npackage main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() {\n\tfmt.Println(\"broken\")\n\tos.Exit(3)\n}\n```\n\n" +
			"```go\npackage main\n\nfunc main() { panic(\"vetted, never run\") }\n```\n",
	})
	t.Setenv("GOWORK", "off")
	c.goBlocks(docs)
	require.Equal(t, 3, c.nVet)
	require.Equal(t, 2, c.nRunGo)
	require.Len(t, c.failures, 1, failuresText(c))
	require.Contains(t, c.failures[0], "README.md:13: running the block: exit status 3\n    broken")
	_, err := os.Stat(filepath.Join(c.root, "app.db"))
	require.True(t, os.IsNotExist(err), "a runnable block runs in a directory of its own")
}

func TestShellBlocks(t *testing.T) {
	t.Parallel()
	c, docs := fixture(t, map[string]string{
		"README.md": "```sh\nexit 1 # not runnable: never run\n```\n\n" +
			"```sh runnable=sqlite\ntest -n \"$DSN\" && test \"$DSN\" = \"$OUTBOX_DSN\"\ntest -f go.mod # the module's directory\n```\n\n" +
			"- a list item:\n\n  ```sh runnable=sqlite\n  echo indented\n  false\n  echo never printed\n  ```\n\n" +
			"```sh runnable=sqlite\necho broken | grep -q nothing-like-it\n```\n\n" +
			"```sh runnable=oracle\ntrue\n```\n\n" +
			"```sh runnable=postgres\nexit 1 # postgres is not among the checker's backends here\n```\n",
	})
	c.shellBlocks(docs)
	require.Equal(t, 5, c.nSh)
	require.Equal(t, 3, c.nRuns)
	require.Len(t, c.failures, 3, failuresText(c))
	require.Contains(t, c.failures[0], "README.md:12: shell block on sqlite: exit status 1\n    indented")
	require.NotContains(t, c.failures[0], "never printed")
	require.Contains(t, c.failures[1], "README.md:18: shell block on sqlite: exit status 1")
	require.Contains(t, c.failures[2], "README.md:22: runnable=oracle: not a database")
}

func TestSlug(t *testing.T) {
	t.Parallel()
	for h, want := range map[string]string{
		"Current results (library e73e9b3, 2026-11-26)": "current-results-library-e73e9b3-2026-11-26",
		"`outbox migrate up|down|status`":               "outbox-migrate-updownstatus",
		"1. SQLite burn-down: the claim's records":      "1-sqlite-burn-down-the-claims-records",
		"Using a [checkout](#x) of the repository":      "using-a-checkout-of-the-repository",
		"What costs µs per row":                         "what-costs-µs-per-row",
	} {
		require.Equal(t, want, slug(h), h)
	}
}
