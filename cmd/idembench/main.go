// Command idembench runs every backend's benchmarks (conformance.Benchmark,
// the bare effect transaction included) in one go and prints one table of
// ratios to the bare effect, with the project's targets.
//
//	go run ./cmd/idembench                  # all backends, -benchtime 2s
//	go run ./cmd/idembench -pkgs ./postgres -benchtime 5s
//	go test -run '^$' -bench . ./sqlite | go run ./cmd/idembench -parse
//
// The servers come from the same environment variables as the tests.
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("idembench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	pkgs := fs.String("pkgs", "./sqlite ./postgres ./mysql ./redis", "space-separated packages to benchmark")
	benchtime := fs.String("benchtime", "2s", "go test -benchtime")
	bench := fs.String("bench", "BenchmarkStore", "go test -bench pattern")
	parse := fs.Bool("parse", false, "read go test -bench output from stdin instead of running it")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var out []byte
	if *parse {
		b, err := io.ReadAll(stdin)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		out = b
	} else {
		cmdArgs := append([]string{"test", "-run", "^$", "-bench", *bench, "-benchmem", "-benchtime", *benchtime, "-timeout", "30m"}, strings.Fields(*pkgs)...)
		cmd := exec.CommandContext(ctx, "go", cmdArgs...)
		var buf bytes.Buffer
		cmd.Stdout = io.MultiWriter(&buf, stderr)
		cmd.Stderr = stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(stderr, "idembench: go %s: %v\n", strings.Join(cmdArgs, " "), err)
			return 1
		}
		out = buf.Bytes()
	}
	rows := parseBench(out)
	if len(rows) == 0 {
		fmt.Fprintln(stderr, "idembench: no benchmark lines found")
		return 1
	}
	printTable(stdout, rows)
	return 0
}

type row struct {
	pkg, name     string
	ns            float64
	bytes, allocs float64
}

var (
	pkgLine   = regexp.MustCompile(`^pkg: (\S+)`)
	benchLine = regexp.MustCompile(`^Benchmark\w+/(\w+)(?:-\d+)?\s+\d+\s+([\d.]+) ns/op(?:\s+([\d.]+) B/op\s+([\d.]+) allocs/op)?`)
)

func parseBench(out []byte) []row {
	var rows []row
	pkg := ""
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if m := pkgLine.FindStringSubmatch(line); m != nil {
			pkg = m[1][strings.LastIndex(m[1], "/")+1:]
			continue
		}
		m := benchLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		r := row{pkg: pkg, name: m[1]}
		r.ns, _ = strconv.ParseFloat(m[2], 64)
		r.bytes, _ = strconv.ParseFloat(m[3], 64)
		r.allocs, _ = strconv.ParseFloat(m[4], 64)
		rows = append(rows, r)
	}
	return rows
}

// baseline and target of each case: the ratio to its baseline must not
// exceed target (0: no target).
var cases = map[string]struct {
	baseline string
	target   float64
}{
	"Bare":          {"Bare", 0},
	"NewKey":        {"Bare", 1.15},
	"Replay":        {"Bare", 0.25},
	"SameKey20":     {"Bare", 1.5},
	"BareParallel8": {"BareParallel8", 0},
	"Mixed8":        {"BareParallel8", 0},
}

func printTable(w io.Writer, rows []row) {
	base := map[string]float64{}
	for _, r := range rows {
		if r.name == "Bare" || r.name == "BareParallel8" {
			base[r.pkg+"/"+r.name] = r.ns
		}
	}
	fmt.Fprintln(w, "| backend | case | time/op | allocs/op | ratio to bare | target | met |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---|")
	for _, r := range rows {
		c, known := cases[r.name]
		ratio, target, met := "", "", ""
		if known {
			if b := base[r.pkg+"/"+c.baseline]; b > 0 {
				x := r.ns / b
				ratio = fmt.Sprintf("%.2fx", x)
				if c.target > 0 {
					target = fmt.Sprintf("<= %.2fx", c.target)
					met = "yes"
					if x > c.target {
						met = fmt.Sprintf("no (+%.0f%%)", (x/c.target-1)*100)
					}
				}
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %.0f | %s | %s | %s |\n", r.pkg, r.name, dur(r.ns), r.allocs, ratio, target, met)
	}
}

func dur(ns float64) string {
	switch {
	case ns >= 1e6:
		return fmt.Sprintf("%.2f ms", ns/1e6)
	case ns >= 1e3:
		return fmt.Sprintf("%.1f µs", ns/1e3)
	}
	return fmt.Sprintf("%.0f ns", ns)
}
