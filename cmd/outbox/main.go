// Command outbox operates an outbox table: it runs the embedded migrations, counts the
// backlog, sets up and drops what delivery from the database's log needs on the server,
// lists, shows, replays and discards dead letters, and purges old rows.
//
//	outbox [flags] migrate up|down|status [--ordered]
//	outbox [flags] stats [--slot S]... [--dsn DSN]... [--dsn-file F] [--timeout D]
//	outbox [flags] log setup|drop [--slot S]
//	outbox [flags] dead list [--limit N] [--cursor C] [--since T] [--until T] [--payloads]
//	outbox [flags] dead show ID
//	outbox [flags] dead replay ID... | dead replay --all
//	outbox [flags] dead discard ID...
//	outbox [flags] purge --delivered-older-than D --dead-older-than D
//	outbox [flags] ui [--listen ADDR] [--token T] [--read-only] [--hide-payloads]
//	outbox [flags] relay --broker URL [--config F] [...]
//	outbox version | help [command]
//
// The database comes from --dsn (or OUTBOX_DSN) and --dialect (or OUTBOX_DIALECT), which is
// inferred from the DSN's form when it tells: a postgres://, postgresql://, mysql://,
// sqlite: or file: prefix, go-sql-driver's user@tcp(host)/db, libpq's key=value form, or a
// path ending in .db, .sqlite or .sqlite3. stats alone takes several databases: --dsn
// given more than once, or --dsn-file with one DSN a line. Flags may come before or after the command. --json makes every command print exactly one JSON document.
// The exit code is 0 on success, 1 when the operation failed and 2 for bad input; the
// error is one line on stderr that says what to do. A DSN's password is never printed.
//
// Install it with:
//
//	go install github.com/outboxgo/outbox/cmd/outbox@latest
//
// or, until a release is tagged (when @latest finds no version), with go install ./cmd/outbox
// in a clone of the repository.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/outboxgo/outbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	c := newCLI(os.Getenv, os.Stdout, os.Stderr)
	if st, err := os.Stdin.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
		c.confirm = promptOn(os.Stdin, os.Stderr)
	}
	code := c.run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1 // the operation failed: connection, missing table, unknown id, database error
	exitUsage = 2 // bad input: flags, arguments, ids, table name, DSN form
)

// usageError marks bad input; it exits with exitUsage.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// reportedError is a failure whose details the command has printed already, in its
// output: it exits with exitFail and its one line on stderr, and --json prints no error
// document over the one already written (stats over several databases, when some fail).
type reportedError struct{ msg string }

func (e *reportedError) Error() string { return e.msg }

// cli is one invocation: its streams, environment and the flags every command shares.
type cli struct {
	stdout, stderr io.Writer
	env            func(string) string
	global         globalFlags
	// secrets are strings that must never be printed (a DSN's password, raw and escaped).
	secrets []string
	// confirm asks a yes/no question on a terminal and reports a yes; nil when the
	// command does not run on one, and so cannot ask.
	confirm func(question string) bool
}

func newCLI(env func(string) string, stdout, stderr io.Writer) *cli {
	return &cli{stdout: stdout, stderr: stderr, env: env}
}

// promptOn returns a confirm that writes the question to out and reads one line from in:
// "y" or "yes", in any case, is a yes.
func promptOn(in io.Reader, out io.Writer) func(string) bool {
	r := bufio.NewReader(in)
	return func(q string) bool {
		fmt.Fprint(out, q)
		line, _ := r.ReadString('\n')
		a := strings.ToLower(strings.TrimSpace(line))
		return a == "y" || a == "yes"
	}
}

// globalFlags are accepted before the command and by every command.
type globalFlags struct {
	dialect string
	// dsn is the last --dsn given; dsns every one, in order (stats and ui take several).
	dsn       string
	dsns      []string
	dsnFile   string
	table     string
	schema    string
	namespace string
	topics    []string
	tenant    string
	json      bool
}

// command is one subcommand: its name, a one-line summary and its entry point.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, c *cli, args []string) error
}

// commands lists the subcommands in the order help shows them. It is set in init because
// help refers to it.
var commands []command

func init() {
	commands = []command{
		{"migrate", "apply, roll back or list the table's migrations (up|down|status)", runMigrate},
		{"stats", "count rows by state, overall and per namespace and topic; the log reader's slot or position", runStats},
		{"log", "set up or drop the server's objects of delivery from the log: slot and publication, or position table (setup|drop)", runLog},
		{"dead", "list, show, replay or discard dead letters (list|show|replay|discard)", runDead},
		{"purge", "delete old delivered and dead rows in short batches", runPurge},
		{"ui", "serve the web view: overview, dead letters, replay and discard", runUI},
		{"relay", "deliver the rows of one or many databases to a broker, with health, readiness and metrics", runRelay},
		{"version", "print the command's version", runVersion},
		{"help", "show help for the command or one subcommand", runHelp},
	}
}

// run executes one invocation of the command and returns its exit code. It is main
// without the process: tests call it in-process with their own arguments, environment and
// streams.
func run(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) int {
	return newCLI(env, stdout, stderr).run(ctx, args)
}

func (c *cli) run(ctx context.Context, args []string) int {
	stderr := c.stderr
	err := c.dispatch(ctx, args)
	if err == nil {
		return exitOK
	}
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	// Library errors begin with "outbox: " too; say it once.
	msg := c.scrub(strings.ReplaceAll(oneLine(err.Error()), ": outbox: ", ": "))
	var re *reportedError
	if c.global.json && !errors.As(err, &re) {
		c.printJSON(map[string]string{"error": msg})
	}
	fmt.Fprintln(stderr, "outbox: "+msg)
	var ue *usageError
	if errors.As(err, &ue) || errors.Is(err, outbox.ErrInvalid) {
		return exitUsage
	}
	return exitFail
}

func (c *cli) dispatch(ctx context.Context, args []string) error {
	fs := c.flagSet("outbox")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.usage(c.stdout)
			return err
		}
		return usagef("%v (run: outbox help)", err)
	}
	rest := fs.Args()
	if len(rest) == 0 {
		c.usage(c.stderr)
		return usagef("no command given (run: outbox help)")
	}
	cmd, ok := lookup(rest[0])
	if !ok {
		return usagef("unknown command %q (run: outbox help)", rest[0])
	}
	return cmd.run(ctx, c, rest[1:])
}

func lookup(name string) (command, bool) {
	for _, cmd := range commands {
		if cmd.name == name {
			return cmd, true
		}
	}
	return command{}, false
}

// flagSet returns a FlagSet that knows the global flags, bound to c.global, so that they
// may be given before the command or after it.
func (c *cli) flagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported once, by run
	// Registering a flag stores its default in the variable, and help prints defaults: so
	// the flags are registered with empty defaults (never a DSN given earlier on the command
	// line, which may hold a password) and the values given so far are put back after.
	saved := c.global
	defer func() { c.global = saved }()
	g := &c.global
	fs.StringVar(&g.dialect, "dialect", "", "database: postgres, mysql or sqlite (env OUTBOX_DIALECT; inferred from the DSN when it can be)")
	fs.Func("dsn", "the database, a DSN `string` (env OUTBOX_DSN): postgres://..., mysql://user:pass@host:port/db, user:pass@tcp(host:port)/db, sqlite:path or file:path; stats and ui take it more than once", func(s string) error {
		g.dsn = s
		g.dsns = append(g.dsns, s)
		return nil
	})
	fs.StringVar(&g.dsnFile, "dsn-file", "", "stats and ui: a file of DSNs, one a line (blank lines and # comments ignored)")
	fs.StringVar(&g.table, "table", "", "outbox table (default "+outbox.DefaultTable+")")
	fs.StringVar(&g.schema, "schema", "", "PostgreSQL only: the schema of the table, named in every statement whatever the search_path (default none)")
	fs.StringVar(&g.namespace, "namespace", "", "only rows of this namespace (env OUTBOX_NAMESPACE)")
	fs.Func("topic", "only rows of this topic (repeatable)", func(s string) error {
		g.topics = append(g.topics, s)
		return nil
	})
	fs.StringVar(&g.tenant, "tenant", "", "only rows of this tenant id (a UUID)")
	fs.BoolVar(&g.json, "json", false, "print one JSON document instead of tables")
	return fs
}

// parse parses a subcommand's flags, which may come before, between or after its
// positional arguments ("--" ends the flags), and returns the positional arguments.
// -h/--help prints usage to stdout and returns [flag.ErrHelp].
func (c *cli) parse(fs *flag.FlagSet, usage string, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				c.commandUsage(c.stdout, fs, usage)
				return nil, err
			}
			return nil, usagef("%s: %v (run: outbox help %s)", fs.Name(), err, strings.Fields(fs.Name())[0])
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func (c *cli) usage(w io.Writer) {
	fmt.Fprint(w, `outbox operates an outbox table: migrations, backlog stats, dead letters, retention.

Usage:
  outbox [flags] <command> [arguments]

Commands:
`)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, cmd := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", cmd.name, cmd.summary)
	}
	_ = tw.Flush()
	fmt.Fprint(w, "\nFlags (before or after the command):\n")
	fs := c.flagSet("outbox")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fmt.Fprint(w, `
Exit codes: 0 success, 1 the operation failed, 2 bad input.
Run "outbox help <command>" for a command's own flags.
`)
}

func (c *cli) commandUsage(w io.Writer, fs *flag.FlagSet, usage string) {
	fmt.Fprintf(w, "Usage:\n%s\n\nFlags:\n", usage)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

func runHelp(ctx context.Context, c *cli, args []string) error {
	if len(args) == 0 {
		c.usage(c.stdout)
		return nil
	}
	cmd, ok := lookup(args[0])
	if !ok || cmd.name == "help" {
		return usagef("unknown command %q (run: outbox help)", args[0])
	}
	if cmd.name == "version" {
		fmt.Fprintln(c.stdout, "Usage:\n  outbox version [--json]")
		return nil
	}
	err := cmd.run(ctx, c, append(args[1:], "--help"))
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// printJSON writes v as one indented JSON document.
func (c *cli) printJSON(v any) {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// table returns a tabwriter for aligned columns on stdout; Flush it.
func (c *cli) table() *tabwriter.Writer {
	return tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
}

// scrub removes every secret from s.
func (c *cli) scrub(s string) string {
	for _, sec := range c.secrets {
		if sec != "" {
			s = strings.ReplaceAll(s, sec, redactedPassword)
		}
	}
	return s
}

// oneLine joins a multi-line message into one line.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}
