package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/storedsn"
)

// Exit statuses (see the package doc).
const (
	exitOK       = 0
	exitNotFound = 1 // no record, or held
	exitUsage    = 2
	exitStore    = 3
)

// usageError is a bad command line or a bad input: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// options are the parsed command line.
type options struct {
	cmd     string
	store   storedsn.Target
	table   string
	prefix  string
	json    bool
	timeout time.Duration

	key    idempotency.Key // inspect, forget
	body   bool            // inspect
	list   idempotency.ListQuery
	dryRun bool // purge
	batch  int  // purge
}

const usageText = `Usage: idemctl -store DSN [-table NAME | -prefix P] [-json] [-timeout D] COMMAND [flags] [ID]

Commands:
  inspect [-body] [-scope S] ID      what the store holds for one key
  list [-scope S] [-limit N] [-after CURSOR]
                                     one page of a scope's keys, unfinished and held ones first
  forget [-scope S] ID               delete one key: the next request with it runs again
  purge [-dry-run] [-batch N]        delete the expired records (-dry-run: count them only)
  stats                              the store's records by state

Exit status: 0 done, 1 no record or key held, 2 bad usage or input, 3 store error.
`

// globals are the flags every command takes, before or after its name.
type globals struct {
	dsn, table, prefix string
	json               bool
	timeout            time.Duration
}

func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.dsn, "store", g.dsn, storedsn.FlagHelp)
	fs.StringVar(&g.table, "table", g.table, "keys table of a SQL store (default idempotency_keys)")
	fs.StringVar(&g.prefix, "prefix", g.prefix, "key prefix of a Redis store (default idempotency:)")
	fs.BoolVar(&g.json, "json", g.json, "print one JSON object")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "time limit of the whole command")
}

// parseArgs parses the command line; every error is a *usageError or
// flag.ErrHelp.
func parseArgs(args []string, stderr io.Writer) (options, error) {
	g := globals{timeout: 30 * time.Second}
	top := flag.NewFlagSet("idemctl", flag.ContinueOnError)
	top.SetOutput(stderr)
	top.Usage = func() { fmt.Fprint(top.Output(), usageText+"\nGlobal flags:\n"); top.PrintDefaults() }
	g.register(top)
	if err := top.Parse(args); err != nil {
		return options{}, flagErr(err)
	}
	if top.NArg() == 0 {
		top.Usage()
		return options{}, usagef("no command")
	}
	o := options{cmd: top.Arg(0)}
	fs := flag.NewFlagSet("idemctl "+o.cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	g.register(fs)
	var scope, after string
	limit := 100
	switch o.cmd {
	case "inspect":
		fs.BoolVar(&o.body, "body", false, "print the stored body too")
		fs.StringVar(&scope, "scope", "", "the key's scope")
	case "forget":
		fs.StringVar(&scope, "scope", "", "the key's scope")
	case "list":
		fs.StringVar(&scope, "scope", "", "the scope to list")
		fs.IntVar(&limit, "limit", limit, fmt.Sprintf("keys on the page, 1 to %d", idempotency.MaxListLimit))
		fs.StringVar(&after, "after", "", "the cursor a page printed, to list the next one")
	case "purge":
		fs.BoolVar(&o.dryRun, "dry-run", false, "count the expired records; delete nothing")
		fs.IntVar(&o.batch, "batch", idempotency.DefaultPurgeBatch, "records deleted per transaction")
	case "stats":
	default:
		top.Usage()
		return options{}, usagef("unknown command %q", o.cmd)
	}
	pos, err := parseInterspersed(fs, top.Args()[1:])
	if err != nil {
		return options{}, flagErr(err)
	}
	if err := o.finish(g, pos, scope, after, limit); err != nil {
		return options{}, err
	}
	return o, nil
}

// parseInterspersed parses flags wherever they are among args (up to a
// "--") and returns the positional arguments.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

func flagErr(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return &usageError{err.Error()}
}

// finish checks the flags and arguments of o.cmd and fills o.
func (o *options) finish(g globals, pos []string, scope, after string, limit int) error {
	if g.timeout <= 0 {
		return usagef("-timeout %v: want a positive duration", g.timeout)
	}
	if g.dsn == "" {
		return usagef("-store is required\n%s", storedsn.Accepted)
	}
	t, err := storedsn.Parse(g.dsn)
	if err != nil {
		return &usageError{err.Error()}
	}
	switch {
	case t.Kind == storedsn.Redis && g.table != "":
		return usagef("-table is for the SQL stores; Redis takes -prefix")
	case t.Kind != storedsn.Redis && g.prefix != "":
		return usagef("-prefix is for Redis; a SQL store takes -table")
	}
	o.store, o.table, o.prefix, o.json, o.timeout = t, g.table, g.prefix, g.json, g.timeout
	wantArgs := 0
	if o.cmd == "inspect" || o.cmd == "forget" {
		wantArgs = 1
	}
	if len(pos) != wantArgs {
		if wantArgs == 1 {
			return usagef("%s takes one key ID, got %d arguments", o.cmd, len(pos))
		}
		return usagef("%s takes no arguments, got %q", o.cmd, pos)
	}
	if wantArgs == 1 {
		o.key = idempotency.Key{Scope: scope, ID: pos[0]}
		if err := o.key.Validate(); err != nil {
			return &usageError{fmt.Sprintf("key %v: %v", o.key, err)}
		}
	}
	if t.Kind == storedsn.Redis {
		if reason := redisRefuses(o.cmd); reason != "" {
			return &usageError{reason}
		}
	}
	switch o.cmd {
	case "list":
		if limit < 1 || limit > idempotency.MaxListLimit {
			return usagef("-limit %d: want 1 to %d", limit, idempotency.MaxListLimit)
		}
		o.list = idempotency.ListQuery{Scope: scope, Limit: limit}
		if err := (idempotency.Key{Scope: scope, ID: "-"}).Validate(); err != nil {
			return usagef("-scope: %v", err)
		}
		if after != "" {
			c, err := parseCursor(scope, after)
			if err != nil {
				return err
			}
			o.list.After = c
		}
	case "purge":
		if o.batch < 1 {
			return usagef("-batch %d: want at least 1", o.batch)
		}
	}
	return nil
}

// redisRefuses says why Redis cannot do cmd, or "".
func redisRefuses(cmd string) string {
	switch cmd {
	case "list":
		return "list: Redis cannot list keys: a SCAN of a shared Redis (or a Cluster) is no listing the store can promise; inspect one key instead"
	case "stats":
		return "stats: Redis keeps no counts of its records: its keys cannot be listed, and its records expire by themselves"
	case "purge":
		return "purge: Redis records expire by themselves: there is nothing to purge"
	}
	return ""
}

// Cursor forms: the page ended among the unfinished and held keys, or
// among the rest.
const (
	cursorUnfinished = "u:"
	cursorRest       = "r:"
)

func formatCursor(c *idempotency.ListCursor) string {
	if c == nil {
		return ""
	}
	if c.Unfinished {
		return cursorUnfinished + c.ID
	}
	return cursorRest + c.ID
}

func parseCursor(scope, s string) (*idempotency.ListCursor, error) {
	var c idempotency.ListCursor
	switch {
	case strings.HasPrefix(s, cursorUnfinished):
		c = idempotency.ListCursor{Unfinished: true, ID: s[len(cursorUnfinished):]}
	case strings.HasPrefix(s, cursorRest):
		c = idempotency.ListCursor{ID: s[len(cursorRest):]}
	default:
		return nil, usagef("-after %q: want the cursor a page printed (u:ID or r:ID)", s)
	}
	if err := (idempotency.Key{Scope: scope, ID: c.ID}).Validate(); err != nil {
		return nil, usagef("-after: %v", err)
	}
	return &c, nil
}

// exitCode is the exit status of a command that failed with err.
func exitCode(err error) int {
	var ue *usageError
	switch {
	case errors.As(err, &ue), errors.Is(err, idempotency.ErrInvalidKey), errors.Is(err, idempotency.ErrInvalidConfig),
		errors.Is(err, errors.ErrUnsupported):
		return exitUsage
	case errors.Is(err, idempotency.ErrNotFound), errors.Is(err, idempotency.ErrInProgress):
		return exitNotFound
	}
	return exitStore
}

// run is the whole command; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	storedsn.QuietRedis() // its errors reach stderr through ours
	o, err := parseArgs(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "idemctl: %v\n", err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	if err := execute(ctx, o, stdout); err != nil {
		fmt.Fprintf(stderr, "idemctl: %s: %v\n", o.cmd, err)
		return exitCode(err)
	}
	return exitOK
}
