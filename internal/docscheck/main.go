// Command docscheck holds the repository's Markdown to the code, so that documentation that
// drifts from it fails CI (.ci/run) instead of a reader:
//
//   - every link to a file of the repository resolves, and so does its #anchor (a heading's
//     GitHub slug, or an explicit id);
//   - every Go block that is a whole file (it starts with a package clause) passes go vet in
//     the module of the Markdown file, and one whose info string says runnable (```go
//     runnable) is built there and run, in an empty directory of its own, and must exit 0;
//   - every package-qualified name in a Go block (outbox.Options, inbox.MigrateUp,
//     outboxnats.New, ...) and every method called on the usual variables (store.Stats,
//     pub.Run, in.Process) exists in the package;
//   - every shell block whose info string says runnable (```sh runnable, or
//     ```sh runnable=postgres,mysql for some databases only) runs with bash -euo pipefail
//     against each database it names (all three by default), each run on a fresh PostgreSQL
//     schema, MariaDB database or SQLite file, with $DSN and $OUTBOX_DSN naming it, the
//     module's directory as working directory, and the outbox and goose commands on PATH.
//
// Usage, from the repository's root:
//
//	go run ./internal/docscheck [-goose PATH] [-outbox PATH] [-backends postgres,mysql,sqlite] [-checks links,go,sh]
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
)

func main() {
	var (
		root     = flag.String("root", ".", "the repository's root")
		goose    = flag.String("goose", "", "the goose command (default: goose on PATH)")
		outbox   = flag.String("outbox", "", "the outbox command (default: built from ./cmd/outbox)")
		backends = flag.String("backends", "postgres,mysql,sqlite", "databases to run runnable blocks on")
		checks   = flag.String("checks", "links,go,sh", "what to check")
		pgDSN    = flag.String("pg-dsn", envOr("OUTBOX_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL to make schemas in")
		myDSN    = flag.String("mysql-dsn", envOr("OUTBOX_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test"), "MariaDB/MySQL to make databases in")
	)
	flag.Parse()
	start := time.Now()
	c := &checker{root: *root, pgDSN: *pgDSN, myDSN: *myDSN, backends: strings.Split(*backends, ",")}
	files, err := markdownFiles(*root)
	if err != nil {
		fatal(err)
	}
	docs := make([]*doc, 0, len(files))
	for _, f := range files {
		d, err := readDoc(*root, f)
		if err != nil {
			fatal(err)
		}
		docs = append(docs, d)
	}
	want := strings.Split(*checks, ",")
	if slices.Contains(want, "links") {
		c.links(docs)
	}
	if slices.Contains(want, "go") {
		c.goBlocks(docs)
	}
	if slices.Contains(want, "sh") {
		if err := c.tools(*goose, *outbox); err != nil {
			fatal(err)
		}
		defer os.RemoveAll(c.bin)
		c.shellBlocks(docs)
	}
	fmt.Printf("docscheck: %d Markdown files, %d links, %d Go blocks (%d vetted, %d run), %d runnable shell blocks (%d runs) in %s\n",
		len(docs), c.nLinks, c.nGo, c.nVet, c.nRunGo, c.nSh, c.nRuns, time.Since(start).Round(100*time.Millisecond))
	if len(c.failures) > 0 {
		for _, f := range c.failures {
			fmt.Fprintln(os.Stderr, f)
		}
		fmt.Fprintf(os.Stderr, "docscheck: %d problems\n", len(c.failures))
		os.Exit(1)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "docscheck:", err)
	os.Exit(2)
}

type checker struct {
	root, pgDSN, myDSN string
	backends           []string
	bin                string // a directory holding goose and outbox

	failures                                 []string
	nLinks, nGo, nVet, nRunGo, nSh, nRuns, n int
}

func (c *checker) failf(d *doc, line int, format string, args ...any) {
	c.failures = append(c.failures, fmt.Sprintf("%s:%d: %s", d.path, line, fmt.Sprintf(format, args...)))
}

// markdownFiles lists the Markdown files git tracks, or, outside a git checkout, every one
// under root.
func markdownFiles(root string) ([]string, error) {
	out, err := exec.Command("git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard", "*.md").Output()
	if err == nil {
		var files []string
		for _, f := range strings.Fields(string(out)) {
			if _, err := os.Stat(filepath.Join(root, f)); err == nil {
				files = append(files, f)
			}
		}
		return files, nil
	}
	var files []string
	err = filepath.WalkDir(root, func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() && strings.HasPrefix(e.Name(), ".") && p != root {
			return filepath.SkipDir
		}
		if !e.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			files = append(files, rel)
		}
		return nil
	})
	return files, err
}

// A doc is one Markdown file: its prose lines (code blocks blanked out), its fenced blocks
// and its anchors.
type doc struct {
	path    string // relative to the root, slash-separated
	prose   []string
	blocks  []block
	anchors map[string]bool
}

type block struct {
	line int // of the opening fence
	info []string
	text string
}

var fenceRE = regexp.MustCompile("^( *)(```+|~~~+)\\s*(.*)$")

func readDoc(root, rel string) (*doc, error) {
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		return nil, err
	}
	d := &doc{path: filepath.ToSlash(rel), anchors: map[string]bool{}}
	lines := strings.Split(string(b), "\n")
	var (
		in     *block
		fence  string
		indent int
		body   []string
	)
	seen := map[string]int{}
	for i, l := range lines {
		if in != nil {
			t := strings.TrimLeft(l, " ")
			if strings.HasPrefix(t, fence) && strings.TrimSpace(strings.TrimLeft(t, fence[:1])) == "" {
				in.text = strings.Join(body, "\n") + "\n"
				d.blocks = append(d.blocks, *in)
				in = nil
			} else {
				n := min(indent, len(l)-len(strings.TrimLeft(l, " ")))
				body = append(body, l[n:])
			}
			d.prose = append(d.prose, "")
			continue
		}
		if m := fenceRE.FindStringSubmatch(l); m != nil {
			in = &block{line: i + 1, info: strings.Fields(m[3])}
			fence, indent, body = m[2], len(m[1]), nil
			d.prose = append(d.prose, "")
			continue
		}
		d.prose = append(d.prose, l)
		if h, ok := strings.CutPrefix(strings.TrimLeft(l, "#"), " "); ok && strings.HasPrefix(l, "#") && len(l)-len(strings.TrimLeft(l, "#")) <= 6 {
			s := slug(h)
			if n, dup := seen[s]; dup {
				seen[s] = n + 1
				s = fmt.Sprintf("%s-%d", s, n+1)
			} else {
				seen[s] = 0
			}
			d.anchors[s] = true
		}
		for _, m := range idRE.FindAllStringSubmatch(l, -1) {
			d.anchors[m[1]] = true
		}
	}
	return d, nil
}

var (
	idRE       = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	codeSpanRE = regexp.MustCompile("`+[^`]*`+")
	inlineRE   = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	linkRE     = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	refLinkRE  = regexp.MustCompile(`^\s*\[[^\]]+\]:\s*(\S+)`)
	schemeRE   = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// slug is GitHub's anchor for a heading: the rendered text lower-cased, everything but
// letters, digits, spaces, hyphens and underscores dropped, spaces turned into hyphens.
func slug(h string) string {
	h = inlineRE.ReplaceAllString(strings.TrimSpace(h), "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case unicode.IsLetter(r) || unicode.IsNumber(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// links checks every relative link of every document: its file exists, and its anchor is
// one of that file's headings.
func (c *checker) links(docs []*doc) {
	byPath := map[string]*doc{}
	for _, d := range docs {
		byPath[d.path] = d
	}
	for _, d := range docs {
		for i, l := range d.prose {
			l = codeSpanRE.ReplaceAllString(l, "")
			var targets []string
			for _, m := range linkRE.FindAllStringSubmatch(l, -1) {
				targets = append(targets, m[1])
			}
			if m := refLinkRE.FindStringSubmatch(l); m != nil {
				targets = append(targets, m[1])
			}
			for _, t := range targets {
				t = strings.Trim(t, "<>")
				if schemeRE.MatchString(t) || strings.HasPrefix(t, "//") {
					continue
				}
				c.nLinks++
				file, anchor, _ := strings.Cut(t, "#")
				target := d
				if file != "" {
					p, err := url.PathUnescape(file)
					if err != nil {
						c.failf(d, i+1, "link %q: %v", t, err)
						continue
					}
					p = filepath.ToSlash(filepath.Join(filepath.Dir(d.path), p))
					if strings.HasPrefix(p, "../") {
						c.failf(d, i+1, "link %q leaves the repository", t)
						continue
					}
					if _, err := os.Stat(filepath.Join(c.root, p)); err != nil {
						c.failf(d, i+1, "link %q: no file %s", t, p)
						continue
					}
					target = byPath[p]
				}
				if anchor == "" {
					continue
				}
				if target == nil {
					if !strings.HasPrefix(anchor, "L") { // source line anchors (#L12) are GitHub's
						c.failf(d, i+1, "link %q: an anchor into a file that is not Markdown", t)
					}
					continue
				}
				if !target.anchors[anchor] {
					c.failf(d, i+1, "link %q: %s has no heading with anchor #%s", t, target.path, anchor)
				}
			}
		}
	}
}

// moduleDir is the directory of the Go module a document belongs to: the nearest one
// upwards holding a go.mod.
func (c *checker) moduleDir(d *doc) string {
	dir := filepath.Dir(d.path)
	for {
		if _, err := os.Stat(filepath.Join(c.root, dir, "go.mod")); err == nil || dir == "." {
			return dir
		}
		dir = filepath.Dir(dir)
	}
}

func isLang(b block, langs ...string) bool {
	return len(b.info) > 0 && slices.Contains(langs, b.info[0])
}

var packageRE = regexp.MustCompile(`(?m)^package \w+`)

// goBlocks vets the whole files among the Go blocks and checks the names every Go block uses.
func (c *checker) goBlocks(docs []*doc) {
	names := newNames(c.root)
	for _, d := range docs {
		for _, b := range d.blocks {
			if !isLang(b, "go") {
				continue
			}
			c.nGo++
			for _, p := range names.missing(d.path, b.text) {
				c.failf(d, b.line, "Go block uses %s, which does not exist", p)
			}
			if first := firstCodeLine(b.text); !packageRE.MatchString(first) {
				continue
			}
			c.nVet++
			if out, err := c.vet(d, b); err != nil {
				c.failf(d, b.line, "go vet of the block: %v\n%s", err, out)
				continue
			}
			if slices.Contains(b.info[1:], "runnable") {
				c.nRunGo++
				if out, err := c.runGo(d, b); err != nil {
					c.failf(d, b.line, "running the block: %v\n%s", err, indentText(string(out)))
				}
			}
		}
	}
}

func firstCodeLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "//") {
			return t
		}
	}
	return ""
}

// vet writes the block as the only file of a package in a directory of the document's
// module, runs go vet on it and removes the directory.
func (c *checker) vet(d *doc, b block) ([]byte, error) {
	modDir, name, remove, err := c.writeBlock(d, b, "_docscheckvet")
	if err != nil {
		return nil, err
	}
	defer remove()
	cmd := exec.Command("go", "vet", "./"+name)
	cmd.Dir = modDir
	return cmd.CombinedOutput()
}

// writeBlock writes the block as main.go of a new package directory in the document's
// module, and returns the module's directory, the package's directory name and the function
// that removes it. The name starts with an underscore, so that a `go vet ./...` running at the
// same time (CI lints beside this check) never lists the directory, which may vanish under it.
func (c *checker) writeBlock(d *doc, b block, prefix string) (modDir, name string, remove func(), err error) {
	c.n++
	modDir = filepath.Join(c.root, c.moduleDir(d))
	name = fmt.Sprintf("%s%d_%d", prefix, os.Getpid(), c.n)
	dir := filepath.Join(modDir, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", "", nil, err
	}
	remove = func() { _ = os.RemoveAll(dir) }
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(b.text), 0o644); err != nil {
		remove()
		return "", "", nil, err
	}
	return modDir, name, remove, nil
}

// runGo builds the block as the only file of a package in a directory of the document's
// module and runs the program in an empty temporary directory, so that files it writes
// land there.
func (c *checker) runGo(d *doc, b block) ([]byte, error) {
	modDir, name, remove, err := c.writeBlock(d, b, "_docscheckrun")
	if err != nil {
		return nil, err
	}
	defer remove()
	tmp, err := os.MkdirTemp("", "docscheck-go-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	prog := filepath.Join(tmp, "prog")
	build := exec.Command("go", "build", "-o", prog, "./"+name)
	build.Dir = modDir
	if out, err := build.CombinedOutput(); err != nil {
		return out, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run := exec.CommandContext(ctx, prog)
	run.Dir = tmp
	run.WaitDelay = 5 * time.Second
	return run.CombinedOutput()
}

// names knows the exported names of the repository's packages, under the names documents
// import them by, and the methods of the types the usual variables hold.
type names struct {
	root     string
	packages map[string]string // import name -> directory
	vars     map[string]string // variable -> "dir.Type"
	cache    map[string]map[string]bool
}

func newNames(root string) *names {
	n := &names{root: root, cache: map[string]map[string]bool{},
		packages: map[string]string{
			"outbox":       ".",
			"migrations":   "migrations",
			"inbox":        "inbox",
			"outboxotel":   "otel",
			"conformance":  "conformance",
			"outboxui":     "outboxui",
			"cloudevents":  "cloudevents",
			"outboxpglog":  "logrepl/pglog",
			"outboxbinlog": "logrepl/mysqlbinlog",
		},
		vars: map[string]string{"store": ".Store", "pub": ".Publisher", "in": "inbox.Inbox"},
	}
	for _, t := range []string{"amqp", "kafka", "nats", "redis", "webhook"} {
		n.packages["outbox"+t] = "transport/" + t
	}
	return n
}

var qualifiedRE = regexp.MustCompile(`\b([a-z][a-z0-9]*)\.([A-Z][A-Za-z0-9_]*)`)

// missing lists the names text uses that its package does not declare. A bare broker name
// (kafka, nats, redis) is the broker client's, never a transport's.
func (n *names) missing(docPath, text string) []string {
	var out []string
	for _, m := range qualifiedRE.FindAllStringSubmatch(codeOnly(text), -1) {
		q, name := m[1], m[2]
		if t, ok := n.vars[q]; ok {
			dir, typ, _ := strings.Cut(t, ".")
			if dir == "" {
				dir = "."
			}
			if !n.declared(dir)[typ+"."+name] {
				out = append(out, q+"."+name+" (a "+typ+" method)")
			}
			continue
		}
		dir, ok := n.packages[q]
		if !ok {
			continue
		}
		if !n.declared(dir)[name] {
			out = append(out, q+"."+name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// codeOnly drops comments and string literals, where names are prose.
func codeOnly(text string) string {
	var b strings.Builder
	for _, l := range strings.Split(text, "\n") {
		if i := strings.Index(l, "//"); i >= 0 {
			l = l[:i]
		}
		b.WriteString(stringRE.ReplaceAllString(l, `""`))
		b.WriteByte('\n')
	}
	return b.String()
}

var stringRE = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|`[^`]*`")

// declared returns the exported top-level names of the package in dir, and its exported
// methods as "Type.Method", from its non-test files.
func (n *names) declared(dir string) map[string]bool {
	if m, ok := n.cache[dir]; ok {
		return m
	}
	m := map[string]bool{}
	n.cache[dir] = m
	fset := token.NewFileSet()
	files, _ := filepath.Glob(filepath.Join(n.root, dir, "*.go"))
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			continue
		}
		for _, decl := range file.Decls {
			switch decl := decl.(type) {
			case *ast.FuncDecl:
				if decl.Recv == nil {
					m[decl.Name.Name] = true
					continue
				}
				t := decl.Recv.List[0].Type
				if s, ok := t.(*ast.StarExpr); ok {
					t = s.X
				}
				if id, ok := t.(*ast.Ident); ok {
					m[id.Name+"."+decl.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, s := range decl.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						m[s.Name.Name] = true
					case *ast.ValueSpec:
						for _, id := range s.Names {
							m[id.Name] = true
						}
					}
				}
			}
		}
	}
	return m
}

// tools puts goose and outbox in a directory of their own for the shell blocks' PATH.
func (c *checker) tools(goose, outbox string) error {
	dir, err := os.MkdirTemp("", "docscheck-bin-")
	if err != nil {
		return err
	}
	c.bin = dir
	if goose == "" {
		if goose, err = exec.LookPath("goose"); err != nil {
			return errors.New("no goose on PATH: run make goose, or pass -goose")
		}
	}
	if goose, err = filepath.Abs(goose); err != nil {
		return err
	}
	if err := os.Symlink(goose, filepath.Join(dir, "goose")); err != nil {
		return err
	}
	if outbox != "" {
		if outbox, err = filepath.Abs(outbox); err != nil {
			return err
		}
		return os.Symlink(outbox, filepath.Join(dir, "outbox"))
	}
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "outbox"), "./cmd/outbox")
	cmd.Dir = c.root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building the outbox command: %v\n%s", err, out)
	}
	return nil
}

// runnableOn reports the databases a shell block runs on: none unless its info string says
// runnable; runnable=a,b names them.
func runnableOn(b block) []string {
	if !isLang(b, "sh", "bash", "shell") {
		return nil
	}
	for _, w := range b.info[1:] {
		if w == "runnable" {
			return []string{"postgres", "mysql", "sqlite"}
		}
		if v, ok := strings.CutPrefix(w, "runnable="); ok {
			return strings.Split(v, ",")
		}
	}
	return nil
}

func (c *checker) shellBlocks(docs []*doc) {
	for _, d := range docs {
		for _, b := range d.blocks {
			on := runnableOn(b)
			if len(on) == 0 {
				continue
			}
			c.nSh++
			for _, backend := range on {
				if !slices.Contains([]string{"postgres", "mysql", "sqlite"}, backend) {
					c.failf(d, b.line, "runnable=%s: not a database (postgres, mysql, sqlite)", backend)
					continue
				}
				if !slices.Contains(c.backends, backend) {
					continue
				}
				c.nRuns++
				if out, err := c.run(d, b, backend); err != nil {
					c.failf(d, b.line, "shell block on %s: %v\n%s", backend, err, indentText(string(out)))
				}
			}
		}
	}
}

func indentText(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return "    (no output)"
	}
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}

// run runs one block on a fresh database of the given kind, dropped afterwards.
func (c *checker) run(d *doc, b block, backend string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c.n++
	name := fmt.Sprintf("docscheck_%d_%d", os.Getpid(), c.n)
	tmp, err := os.MkdirTemp("", "docscheck-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	dsn, drop, err := c.database(ctx, backend, name, tmp)
	if err != nil {
		return nil, err
	}
	defer drop()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", b.text)
	cmd.Dir = filepath.Join(c.root, c.moduleDir(d))
	cmd.Env = append(os.Environ(), "DSN="+dsn, "OUTBOX_DSN="+dsn, "TMPDIR="+tmp,
		"PATH="+c.bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	cmd.WaitDelay = 5 * time.Second
	return cmd.CombinedOutput()
}

// database makes a fresh database of the kind and returns its DSN, in a form both goose and
// the outbox command take, and how to drop it.
func (c *checker) database(ctx context.Context, backend, name, tmp string) (string, func(), error) {
	switch backend {
	case "postgres":
		db, err := sql.Open("pgx", c.pgDSN)
		if err != nil {
			return "", nil, err
		}
		if _, err := db.ExecContext(ctx, `CREATE SCHEMA `+name); err != nil {
			db.Close()
			return "", nil, fmt.Errorf("PostgreSQL at %s: %w", c.pgDSN, err)
		}
		u, err := url.Parse(c.pgDSN)
		if err != nil {
			db.Close()
			return "", nil, err
		}
		q := u.Query()
		q.Set("search_path", name)
		u.RawQuery = q.Encode()
		return u.String(), func() {
			db.ExecContext(context.WithoutCancel(ctx), `DROP SCHEMA `+name+` CASCADE`)
			db.Close()
		}, nil
	case "mysql":
		cfg, err := mysql.ParseDSN(c.myDSN)
		if err != nil {
			return "", nil, err
		}
		db, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			return "", nil, err
		}
		if _, err := db.ExecContext(ctx, `CREATE DATABASE `+name); err != nil {
			db.Close()
			return "", nil, fmt.Errorf("MariaDB at %s: %w", c.myDSN, err)
		}
		cfg.DBName = name
		cfg.ParseTime = true
		return cfg.FormatDSN(), func() {
			db.ExecContext(context.WithoutCancel(ctx), `DROP DATABASE `+name)
			db.Close()
		}, nil
	default:
		return filepath.Join(tmp, "app.db"), func() {}, nil
	}
}
