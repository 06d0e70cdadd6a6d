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
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/redact"
	"github.com/go-idempotency/idempotency/internal/storedsn"
	"github.com/go-idempotency/idempotency/sealed"
)

// Exit statuses (see the package doc).
const (
	exitOK       = 0
	exitNotFound = 1 // no record, or held
	exitUsage    = 2
	exitStore    = 3
)

// usageError is a bad command line or a bad input: exit status 2. With
// usage, the command's usage is printed after the message.
type usageError struct {
	msg   string
	usage func(io.Writer)
}

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{msg: fmt.Sprintf(format, args...)} }

// options are the parsed command line.
type options struct {
	cmd     string
	store   storedsn.Target
	table   string
	prefix  string
	json    bool
	timeout time.Duration

	key     idempotency.Key // inspect, forget
	body    bool            // inspect
	keyring string          // inspect: the -keyring file
	codec   *sealed.Codec   // execute: the Codec of keyring
	list    idempotency.ListQuery
	dryRun  bool // purge
	batch   int  // purge
}

const usageText = `Usage: idemctl -store DSN [-table NAME | -prefix P] [-json] [-timeout D] COMMAND [flags] [ID]

Commands:
  inspect -scope S [-body [-keyring FILE]] ID
                                     what the store holds for one key
  list -scope S [-limit N] [-after CURSOR]
                                     one page of a scope's keys, unfinished and held ones first
  forget -scope S ID                 delete one key: the next request with it runs again
  purge [-dry-run] [-batch N]        delete the expired records (-dry-run: count them only)
  stats                              the store's records by state

-scope is required by inspect, list and forget: a key lives in one scope
(the account a service names with it); -scope '' is the empty scope.
A sealed answer's body shows only with -keyring, the file of the keys
that sealed it (one "ID HEX" line a key, 64 hex digits; "current ID").

Exit status: 0 done, 1 no record or key held, 2 bad usage or input, 3 store error.
`

// globals are the flags every command takes, before or after its name.
type globals struct {
	dsn, table, prefix string
	json               bool
	timeout            time.Duration
}

func (g *globals) register(fs *flag.FlagSet) {
	fs.Var((*dsnFlag)(&g.dsn), "store", storedsn.FlagHelp)
	fs.StringVar(&g.table, "table", g.table, "keys table of a SQL store (default idempotency_keys)")
	fs.StringVar(&g.prefix, "prefix", g.prefix, "key prefix of a Redis store (default idempotency:)")
	fs.BoolVar(&g.json, "json", g.json, "print one JSON object")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "time limit of the whole command")
}

// dsnFlag is the -store flag: its value (a usage text's "default", after
// a mistyped flag) shows with its secrets redacted.
type dsnFlag string

func (d *dsnFlag) String() string     { return redact.DSN(string(*d)) }
func (d *dsnFlag) Set(v string) error { *d = dsnFlag(v); return nil }

// flagUsage returns what prints fs's usage: the command's text, then its
// flags.
func flagUsage(fs *flag.FlagSet, text string) func(io.Writer) {
	return func(w io.Writer) {
		fs.SetOutput(w)
		defer fs.SetOutput(io.Discard)
		fmt.Fprint(w, text)
		fs.PrintDefaults()
	}
}

// parseArgs parses the command line; every error is a *usageError, or a
// *helpRequest for -h. The flag package prints nothing itself: the
// message is printed once, by run.
func parseArgs(args []string) (options, error) {
	g := globals{timeout: 30 * time.Second}
	top := flag.NewFlagSet("idemctl", flag.ContinueOnError)
	top.SetOutput(io.Discard)
	top.Usage = func() {}
	g.register(top)
	topUsage := flagUsage(top, usageText+"\nGlobal flags:\n")
	if err := top.Parse(args); err != nil {
		return options{}, flagErr(err, topUsage)
	}
	if top.NArg() == 0 {
		return options{}, &usageError{"no command", topUsage}
	}
	o := options{cmd: top.Arg(0)}
	fs := flag.NewFlagSet("idemctl "+o.cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	g.register(fs)
	fs.Lookup("store").DefValue = "" // a value given before the command is no default
	var scope, after string
	limit := 100
	switch o.cmd {
	case "inspect":
		fs.BoolVar(&o.body, "body", false, "print the stored body too")
		fs.StringVar(&o.keyring, "keyring", "", "with -body: the keyring `FILE` that opens a sealed body (see the package doc)")
		fs.StringVar(&scope, "scope", "", "the key's scope (required; '' is the empty scope)")
	case "forget":
		fs.StringVar(&scope, "scope", "", "the key's scope (required; '' is the empty scope)")
	case "list":
		fs.StringVar(&scope, "scope", "", "the scope to list (required; '' is the empty scope)")
		fs.IntVar(&limit, "limit", limit, fmt.Sprintf("keys on the page, 1 to %d", backend.MaxListLimit))
		fs.StringVar(&after, "after", "", "the cursor a page printed, to list the next one")
	case "purge":
		fs.BoolVar(&o.dryRun, "dry-run", false, "count the expired records; delete nothing")
		fs.IntVar(&o.batch, "batch", 1000, "records deleted per transaction")
	case "stats":
	default:
		return options{}, &usageError{fmt.Sprintf("unknown command %q", o.cmd), topUsage}
	}
	cmdUsage := flagUsage(fs, usageText+"\nFlags of "+o.cmd+" (and the global ones):\n")
	pos, err := parseInterspersed(fs, top.Args()[1:])
	if err != nil {
		return options{}, flagErr(err, cmdUsage)
	}
	scopeGiven := false
	fs.Visit(func(f *flag.Flag) { scopeGiven = scopeGiven || f.Name == "scope" })
	if err := o.finish(g, pos, scope, scopeGiven, after, limit); err != nil {
		return options{}, err
	}
	return o, nil
}

// helpRequest is -h: the usage is printed, and the exit status is 0.
type helpRequest struct{ usage func(io.Writer) }

func (*helpRequest) Error() string { return flag.ErrHelp.Error() }

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

// flagErr is the error of a flag the flag package refused.
func flagErr(err error, usage func(io.Writer)) error {
	if errors.Is(err, flag.ErrHelp) {
		return &helpRequest{usage}
	}
	return &usageError{err.Error(), usage}
}

// finish checks the flags and arguments of o.cmd and fills o.
func (o *options) finish(g globals, pos []string, scope string, scopeGiven bool, after string, limit int) error {
	if g.timeout <= 0 {
		return usagef("-timeout %v: want a positive duration", g.timeout)
	}
	if g.dsn == "" {
		return usagef("-store is required\n%s", storedsn.Accepted)
	}
	t, err := storedsn.Parse(g.dsn)
	if err != nil {
		return &usageError{msg: err.Error()} // redacted by storedsn
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
	if t.Kind == storedsn.Redis {
		if reason := redisRefuses(o.cmd); reason != "" {
			return usagef("%s", reason)
		}
	}
	if (wantArgs == 1 || o.cmd == "list") && !scopeGiven {
		return usagef("%s: -scope is required: a key lives in one scope (the account your service names with it); "+
			"give -scope '' for the empty scope", o.cmd)
	}
	if o.keyring != "" && !o.body {
		return usagef("-keyring opens a sealed body: give -body too")
	}
	if wantArgs == 1 {
		o.key = idempotency.Key{Scope: scope, ID: pos[0]}
		if err := o.key.Validate(); err != nil {
			return usagef("key %v: %v", o.key, err)
		}
	}
	switch o.cmd {
	case "list":
		if limit < 1 || limit > backend.MaxListLimit {
			return usagef("-limit %d: want 1 to %d", limit, backend.MaxListLimit)
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

func formatCursor(c *backend.ListCursor) string {
	if c == nil {
		return ""
	}
	if c.Unfinished {
		return cursorUnfinished + c.ID
	}
	return cursorRest + c.ID
}

func parseCursor(scope, s string) (*backend.ListCursor, error) {
	var c backend.ListCursor
	switch {
	case strings.HasPrefix(s, cursorUnfinished):
		c = backend.ListCursor{Unfinished: true, ID: s[len(cursorUnfinished):]}
	case strings.HasPrefix(s, cursorRest):
		c = backend.ListCursor{ID: s[len(cursorRest):]}
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

// run is the whole command; it returns the exit status. Everything it
// prints on stderr has the secrets of every -store value of args redacted.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	storedsn.QuietRedis() // its errors reach stderr through ours
	errw := redact.Writer(stderr, storedsn.FlagValues(args)...)
	defer func() { _ = errw.Flush() }()
	o, err := parseArgs(args)
	if h, ok := errors.AsType[*helpRequest](err); ok {
		h.usage(errw)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(errw, "idemctl: %v\n", err)
		if ue, ok := errors.AsType[*usageError](err); ok && ue.usage != nil {
			fmt.Fprintln(errw)
			ue.usage(errw)
		}
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	if err := execute(ctx, o, stdout); err != nil {
		fmt.Fprintf(errw, "idemctl: %s: %v\n", o.cmd, err)
		return exitCode(err)
	}
	return exitOK
}
