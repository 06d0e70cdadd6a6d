// Command idemcheck shows the race that an idempotency key must survive. It
// sends N simultaneous requests with one idempotency key (a payment of 100
// for order 42), then the same key with another amount. It does so once
// with a naive check-then-write version and once with
// [idempotency.Guard.Do], and prints the table of what each produced.
//
// With no arguments it runs on a temporary SQLite database, removed at exit:
//
//	go run ./cmd/idemcheck
//
// The -store flag runs it on another store, in uniquely named tables (or
// keys) that are dropped at the end:
//
//	go run ./cmd/idemcheck -store 'postgres://user@host:5432/db?sslmode=disable'
//	go run ./cmd/idemcheck -store 'mysql://user:pass@host:3306/db'
//	go run ./cmd/idemcheck -store 'user:pass@tcp(host:3306)/db'
//	go run ./cmd/idemcheck -store 'redis://host:6379/0'
//	go run ./cmd/idemcheck -store sqlite:/path/to/file.db
//	go run ./cmd/idemcheck -store ./keys.db
//
// Any other value is refused, with the list of accepted forms, instead of
// being taken for a new SQLite file. That covers a bare host:port, and a
// file name without a .db, .sqlite or .sqlite3 extension and without
// sqlite: or file:.
//
// The exit status is:
//
//   - 0 when the library's row is the expected one: one payment, N x 201
//     naming it, 422 for another amount;
//   - 1 when it is not, or the experiment could not run;
//   - 2 for bad flags.
//
// The naive row is informational: it shows whatever the race really
// produced.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-idempotency/idempotency/internal/redact"
	"github.com/go-idempotency/idempotency/internal/storedsn"
)

// poolSize caps the library's connection pool on every store, below the
// default number of callers. Nothing may ask for a second connection while
// it holds one, or the callers would deadlock.
const poolSize = 4

// naivePoolMax caps the naive version's pool. It gets one connection per
// caller up to this cap, as independent clients would have, so that its
// race is not hidden by callers queueing for a connection.
const naivePoolMax = 20

// naivePool is the naive version's pool size for n callers.
func naivePool(n int) int { return min(n, naivePoolMax) }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options are the parsed command line.
type options struct {
	store   storedsn.Target // a SQLite Target with no Path: a temporary database
	n       int
	timeout time.Duration
}

// parseArgs parses the command line. The flag package prints nothing
// itself: a refused flag's error is printed once, by run, then usage.
func parseArgs(args []string, usage io.Writer) (options, error) {
	fs := flag.NewFlagSet("idemcheck", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	dsn := fs.String("store", "", storedsn.FlagHelp+" (default: a temporary SQLite database)")
	n := fs.Int("n", 20, "number of simultaneous callers, 1 to 1000")
	timeout := fs.Duration("timeout", 60*time.Second, "overall time limit")
	printUsage := func() {
		fs.SetOutput(usage)
		fmt.Fprintf(usage, "Usage: idemcheck [-store DSN] [-n N] [-timeout D]\n\n"+
			"Runs N simultaneous requests with one idempotency key, naively and with this library,\n"+
			"then the same key with another amount, and prints what each version produced.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage()
			return options{}, err
		}
		return options{}, &flagError{err: err, usage: printUsage}
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *n < 1 || *n > 1000 {
		return options{}, fmt.Errorf("-n %d: want 1 to 1000", *n)
	}
	if *timeout <= 0 {
		return options{}, fmt.Errorf("-timeout %v: want a positive duration", *timeout)
	}
	opts := options{store: storedsn.Target{Kind: storedsn.SQLite}, n: *n, timeout: *timeout}
	if *dsn != "" {
		t, err := storedsn.Parse(*dsn) // a *storedsn.Error names the flag
		if err != nil {
			return options{}, err
		}
		opts.store = t
	}
	return opts, nil
}

// flagError is a flag the flag package refused: its message, then the
// usage.
type flagError struct {
	err   error
	usage func()
}

func (e *flagError) Error() string { return e.err.Error() }
func (e *flagError) Unwrap() error { return e.err }

// run is the whole command; it returns the exit status. Everything it
// prints has the secrets of the -store value redacted.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) (code int) {
	storedsn.QuietRedis() // its errors reach stderr through ours
	outw, errw := redact.Writer(stdout, storedsn.FlagValues(args)...), redact.Writer(stderr, storedsn.FlagValues(args)...)
	defer func() { _, _ = outw.Flush(), errw.Flush() }()
	stdout, stderr = outw, errw
	opts, err := parseArgs(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "idemcheck: %v\n", err)
		if fe, ok := errors.AsType[*flagError](err); ok {
			fmt.Fprintln(stderr)
			fe.usage()
		}
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, opts.timeout)
	defer cancel()

	b, err := open(ctx, opts.store, naivePool(opts.n))
	if err != nil {
		fmt.Fprintf(stderr, "idemcheck: %v\n", err)
		return 1
	}
	defer func() {
		// Clean up even after a timeout or an interrupt.
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer ccancel()
		if err := b.close(cctx); err != nil {
			fmt.Fprintf(stderr, "idemcheck: cleaning up: %v\n", err)
			code = 1
		}
	}()

	naive, err := b.naive(ctx, opts.n)
	if err != nil {
		fmt.Fprintf(stderr, "idemcheck: naive version: %v\n", err)
		return 1
	}
	lib, err := b.library(ctx, opts.n)
	if err != nil {
		fmt.Fprintf(stderr, "idemcheck: library version: %v\n", err)
		return 1
	}
	version := "this library (" + b.name + ")"
	fmt.Fprintf(stdout, "%d simultaneous requests with one key on %s, then the same key with another amount.\n", opts.n, b.where)
	fmt.Fprintf(stdout, "Connections: %d for the naive version, a pool of %d for this library.\n\n", naivePool(opts.n), poolSize)
	fmt.Fprintf(stdout, "| version | payments created by %d simultaneous requests | responses | same key, other amount |\n", opts.n)
	fmt.Fprintf(stdout, "|---|---|---|---|\n")
	fmt.Fprintf(stdout, "| naive check-then-write | %s | %s | %s |\n", paymentsCell(naive), responsesCell(naive.replies), naiveSecondCell(naive))
	fmt.Fprintf(stdout, "| %s | %s | %s | %s |\n", version, paymentsCell(lib), responsesCell(lib.replies), librarySecondCell(lib))
	executed, replayed := executedReplayed(lib.replies)
	fmt.Fprintf(stdout, "\nThis library: %d executed, %d replayed.\n", executed, replayed)
	if b.note != "" {
		fmt.Fprintf(stdout, "%s\n", b.note)
	}
	if problems := libraryProblems(lib); len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintf(stderr, "idemcheck: FAIL: %s: %s\n", version, p)
		}
		return 1
	}
	return 0
}

// backend is one store wired into the experiment.
type backend struct {
	name  string // in the library's row: "sqlite"
	where string // where the experiment runs, for the first line
	note  string // a limit of the store, printed under the table
	// naive and library run the two versions with n callers.
	naive   func(ctx context.Context, n int) (outcome, error)
	library func(ctx context.Context, n int) (outcome, error)
	// close drops what the run created and closes the connections.
	close func(ctx context.Context) error
}

// open connects to the target store and creates the run's tables. It opens
// a pool of poolSize connections for the library and one of naiveConns for
// the naive version, both in full before the callers start.
func open(ctx context.Context, t storedsn.Target, naiveConns int) (*backend, error) {
	switch t.Kind {
	case storedsn.SQLite:
		return openSQLite(ctx, t.Path, naiveConns)
	case storedsn.Postgres:
		return openPostgres(ctx, t.Postgres, naiveConns, t.DatabaseSQL)
	case storedsn.MySQL:
		return openMySQL(ctx, t.MySQL, naiveConns)
	case storedsn.Redis:
		return openRedis(ctx, t.Redis, naiveConns)
	}
	return nil, fmt.Errorf("unknown store kind %q", t.Kind)
}
