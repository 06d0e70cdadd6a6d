// Command idembench runs the backends' benchmarks in interleaved rounds and
// prints one table. Per backend and case, it gives the ratio to the bare
// effect transaction of the same round (median and range over the rounds),
// time and allocations per op, and the project's target.
//
//	go run ./cmd/idembench                          # 4 backends, 5 rounds of -benchtime 1s
//	go run ./cmd/idembench -markdown                # the table of docs/performance.md
//	go run ./cmd/idembench -parallel                # and BareParallel8, Mixed8
//	go run ./cmd/idembench -pkgs ./postgres -rounds 9 -benchtime 2s
//	go test -run '^$' -bench . -benchmem -count 5 ./sqlite | go run ./cmd/idembench -parse
//
// It compiles each package's test binary once, then runs every binary once
// per round, so that each round measures the bare transaction
// (BenchmarkStore/Bare), the library (the other BenchmarkStore cases) and
// a plain-SQL contender (where a package has one) one after the other. A
// change in the machine's load moves all three, so the ratio of each round
// stays comparable. With -scale it also runs BenchmarkScale once
// (1M keys; minutes per backend).
//
// The servers come from the same environment variables as the tests.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/go-idempotency/idempotency/internal/redact"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr, goTool{}))
}

// tool builds and runs test binaries; tests replace it.
type tool interface {
	// build compiles the test binaries of pkgs into dir, one per package,
	// in the order of pkgs. It returns those that compiled, and an error
	// naming those that did not.
	build(ctx context.Context, dir string, pkgs []string) ([]binary, error)
	// run runs bin with args in its package's directory and returns its
	// standard output, copied to echo as it comes; its standard error goes
	// to stderr.
	run(ctx context.Context, bin binary, args []string, echo, stderr io.Writer) ([]byte, error)
}

// binary is one package's compiled test binary.
type binary struct {
	pkg  string // as given in -pkgs
	dir  string // the package's source directory
	path string
}

// The default -bench patterns: BenchmarkStore, PostgreSQL's
// BenchmarkDBStore (its store on database/sql) and the plain SQL of
// BenchmarkPlainSQL, the cases that have a target (with their baselines,
// and RunLocal2, the figure of one Local step more than RunLocal1), or all
// of them.
const (
	defaultBench  = "^(BenchmarkStore|BenchmarkDBStore|BenchmarkPlainSQL)$/^(Bare|NewKey|Replay|RunLocal1|RunLocal2|SameKey20|SameKey20Bare)$"
	parallelBench = "^(BenchmarkStore|BenchmarkDBStore|BenchmarkPlainSQL)$"
)

// config is the command line.
type config struct {
	pkgs      []string
	rounds    int
	benchtime string
	bench     string
	scale     string // -benchtime of BenchmarkScale; "" skips it
	markdown  bool
	verbose   bool
}

// run is the whole command; it returns the exit status. Everything it
// prints, the benchmarks' own output included, has the secrets of the
// servers' DSNs (the IDEMPOTENCY_* variables the benchmarks read)
// redacted.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, t tool) int {
	dsns := serverDSNs(os.Environ())
	outw, errw := redact.Writer(stdout, dsns...), redact.Writer(stderr, dsns...)
	code := runCommand(ctx, args, stdin, outw, errw, t)
	if err := errors.Join(outw.Flush(), errw.Flush()); err != nil && code == 0 {
		code = 1
	}
	return code
}

// serverDSNs returns the values of the IDEMPOTENCY_* variables of env:
// the servers' DSNs and addresses the benchmarks connect with.
func serverDSNs(env []string) []string {
	var dsns []string
	for _, kv := range env {
		if name, value, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(name, "IDEMPOTENCY_") && value != "" {
			dsns = append(dsns, value)
		}
	}
	return dsns
}

func runCommand(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, t tool) int {
	fs := flag.NewFlagSet("idembench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	pkgs := fs.String("pkgs", "./sqlite ./postgres ./mysql ./redis", "space-separated packages to benchmark")
	var c config
	fs.IntVar(&c.rounds, "rounds", 5, "interleaved rounds: each runs every package's benchmarks once")
	fs.StringVar(&c.benchtime, "benchtime", "1s", "-benchtime of each benchmark in each round")
	fs.StringVar(&c.bench, "bench", "", "-bench pattern run in each round (default: the cases with a target, and with -parallel the 8-goroutine ones)")
	parallel := fs.Bool("parallel", false, "also run BareParallel8 and Mixed8 (8 goroutines; about +5 s per backend and round)")
	fs.StringVar(&c.scale, "scale", "", "also run BenchmarkScale once with this -benchtime (e.g. 2000x; minutes per backend)")
	fs.BoolVar(&c.markdown, "markdown", false, "print a markdown table (as in docs/performance.md)")
	fs.BoolVar(&c.verbose, "v", false, "copy the benchmarks' output to standard error")
	parse := fs.Bool("parse", false, "read the output of go test -bench from standard input instead of running benchmarks")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	c.pkgs = strings.Fields(*pkgs)
	if c.bench == "" {
		c.bench = defaultBench
		if *parallel {
			c.bench = parallelBench
		}
	}
	if fs.NArg() > 0 || c.rounds < 1 || len(c.pkgs) == 0 {
		fmt.Fprintln(stderr, "idembench: takes flags only, -rounds >= 1 and at least one package")
		fs.Usage()
		return 2
	}
	res := newResults()
	var failed error
	header := ""
	if *parse {
		b, err := io.ReadAll(stdin)
		if err != nil {
			fmt.Fprintln(stderr, "idembench:", err)
			return 1
		}
		res.parse(b, -1)
		header = "parsed from `go test -bench` output; rounds are the repeated runs of each benchmark"
	} else {
		start := time.Now()
		failed = measure(ctx, t, c, res, stderr)
		header = fmt.Sprintf("`go run ./cmd/idembench %s` (%d interleaved round(s) of -benchtime %s; %s)",
			shellJoin(args), c.rounds, c.benchtime, time.Since(start).Round(time.Second))
	}
	if failed != nil {
		fmt.Fprintln(stderr, "idembench:", failed)
	}
	rs := rows(res)
	if len(rs) == 0 {
		fmt.Fprintln(stderr, "idembench: no benchmark lines found")
		return 1
	}
	printHeader(stdout, res, header, c.markdown)
	printTable(stdout, rs, c.markdown)
	if failed != nil {
		return 1
	}
	return 0
}

// measure builds the binaries, then runs rounds of every package, adding
// each round's results to res. A package that fails a round is reported and
// the others go on; the error says which failed.
func measure(ctx context.Context, t tool, c config, res *results, stderr io.Writer) error {
	dir, err := os.MkdirTemp("", "idembench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintf(stderr, "idembench: building %s\n", strings.Join(c.pkgs, " "))
	start := time.Now()
	bins, err := t.build(ctx, dir, c.pkgs)
	fmt.Fprintf(stderr, "idembench: built in %s\n", time.Since(start).Round(time.Second))
	var errs []error
	if err != nil {
		errs = append(errs, err) // measure the packages that compiled
	}
	runOne := func(bin binary, round int, bench, benchtime string) {
		args := []string{"-test.run", "^$", "-test.bench", bench, "-test.benchmem",
			"-test.benchtime", benchtime, "-test.count", "1", "-test.timeout", "30m"}
		var echo io.Writer = io.Discard
		if c.verbose {
			echo = stderr
		}
		start := time.Now()
		out, err := t.run(ctx, bin, args, echo, stderr)
		fmt.Fprintf(stderr, "idembench: %s took %s\n", bin.pkg, time.Since(start).Round(100*time.Millisecond))
		res.parse(out, round)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s, round %d: %w\n%s", bin.pkg, round+1, err, tail(out)))
		}
	}
	for round := range c.rounds {
		for _, bin := range bins {
			if ctx.Err() != nil {
				return errors.Join(append(errs, ctx.Err())...)
			}
			fmt.Fprintf(stderr, "idembench: round %d/%d %s\n", round+1, c.rounds, bin.pkg)
			runOne(bin, round, c.bench, c.benchtime)
		}
	}
	if c.scale != "" {
		for _, bin := range bins {
			fmt.Fprintf(stderr, "idembench: BenchmarkScale %s\n", bin.pkg)
			runOne(bin, 0, "^BenchmarkScale$", c.scale)
		}
	}
	return errors.Join(errs...)
}

// tail returns the last lines of a failed run's output, where the failure is.
func tail(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.Join(lines[max(0, len(lines)-15):], "\n")
}

// shellJoin quotes args for a shell where needed, so that the printed
// command can be run again as it is.
func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = a
		if a == "" || strings.ContainsAny(a, " \t'\"$\\*?[]()|&;<>^") {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(q, " ")
}

func printHeader(w io.Writer, res *results, how string, markdown bool) {
	parts := []string{time.Now().UTC().Format("2006-01-02 15:04 MST")}
	if res.goos != "" {
		parts = append(parts, res.goos+"/"+res.goarch)
	}
	if res.cpu != "" {
		parts = append(parts, strings.TrimSpace(res.cpu))
	}
	if res.procs != "" {
		parts = append(parts, "GOMAXPROCS "+res.procs)
	}
	parts = append(parts, runtime.Version())
	line := strings.Join(parts, ", ") + ": " + how
	if markdown {
		fmt.Fprintf(w, "%s\n\n", line)
		return
	}
	fmt.Fprintln(w, line)
}

// goTool is the go command.
type goTool struct{}

func (goTool) build(ctx context.Context, dir string, pkgs []string) ([]binary, error) {
	var bins []binary
	var errs []error
	for i, pkg := range pkgs {
		src, err := exec.CommandContext(ctx, "go", "list", "-f", "{{.Dir}}", pkg).Output()
		if err != nil {
			errs = append(errs, fmt.Errorf("go list %s: %w", pkg, err))
			continue
		}
		bin := binary{pkg: pkg, dir: strings.TrimSpace(string(src)), path: filepath.Join(dir, fmt.Sprintf("%d.test", i))}
		cmd := exec.CommandContext(ctx, "go", "test", "-c", "-o", bin.path, pkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("go test -c %s: %w\n%s", pkg, err, tail(out)))
			continue
		}
		bins = append(bins, bin)
	}
	return bins, errors.Join(errs...)
}

func (goTool) run(ctx context.Context, bin binary, args []string, echo, stderr io.Writer) ([]byte, error) {
	cmd := exec.CommandContext(ctx, bin.path, args...)
	cmd.Dir = bin.dir
	var out bytes.Buffer
	cmd.Stdout = io.MultiWriter(&out, echo)
	cmd.Stderr = stderr
	err := cmd.Run()
	return out.Bytes(), err
}
