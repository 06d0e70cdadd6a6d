package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
)

// countOutput is `go test -bench -count 3` output: each benchmark three
// times in a row, its n-th line of round n.
const countOutput = `goos: linux
goarch: amd64
pkg: github.com/go-idempotency/idempotency/postgres
cpu: Test CPU @ 2.00GHz
BenchmarkStore/Bare-2          	    5000	    200000 ns/op	     1000 B/op	       9 allocs/op
BenchmarkStore/Bare-2          	    5000	    100000 ns/op	     1000 B/op	       9 allocs/op
BenchmarkStore/Bare-2          	    5000	    400000 ns/op	     1000 B/op	       9 allocs/op
BenchmarkStore/NewKey-2        	    5000	    300000 ns/op	     9000 B/op	     135 allocs/op
BenchmarkStore/NewKey-2        	    5000	    140000 ns/op	     9000 B/op	     131 allocs/op
BenchmarkStore/NewKey-2        	    5000	    520000 ns/op	     9000 B/op	     133 allocs/op
BenchmarkStore/Replay-2        	   20000	     60000 ns/op	     3000 B/op	      33 allocs/op
BenchmarkStore/Replay-2        	   20000	     30000 ns/op	     3000 B/op	      33 allocs/op
BenchmarkStore/Replay-2        	   20000	    120000 ns/op	     3000 B/op	      33 allocs/op
BenchmarkStore/SameKey20-2     	    1000	    400000 ns/op	    20000 B/op	     300 allocs/op
BenchmarkStore/SameKey20Bare-2 	    1000	    250000 ns/op	    20000 B/op	     140 allocs/op
BenchmarkStore/BareParallel8-2 	   20000	    100000 ns/op	     1000 B/op	       9 allocs/op
BenchmarkStore/Mixed8-2        	   20000	    150000 ns/op	     5000 B/op	      80 allocs/op
BenchmarkPlainSQL/NewKey-2         	    5000	    250000 ns/op	     2000 B/op	      40 allocs/op
BenchmarkPlainSQL/NewKey-2         	    5000	    150000 ns/op	     2000 B/op	      40 allocs/op
BenchmarkPlainSQL/NewKey-2         	    5000	    600000 ns/op	     2000 B/op	      40 allocs/op
BenchmarkPlainSQL/Replay-2         	    5000	     50000 ns/op	     2000 B/op	      30 allocs/op
BenchmarkPlainSQL/Replay-2         	    5000	     25000 ns/op	     2000 B/op	      30 allocs/op
BenchmarkPlainSQL/Replay-2         	    5000	    100000 ns/op	     2000 B/op	      30 allocs/op
BenchmarkPlainSQL/SameKey20-2      	    1000	    800000 ns/op	    20000 B/op	     500 allocs/op
PASS
ok  	github.com/go-idempotency/idempotency/postgres	12.3s
`

func runParse(t *testing.T, input string, args ...string) (string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"-parse"}, args...), strings.NewReader(input), &out, &errb, nil)
	if errb.Len() > 0 {
		t.Logf("stderr: %s", errb.String())
	}
	return out.String(), code
}

func TestParseTable(t *testing.T) {
	out, code := runParse(t, countOutput, "-markdown")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{
		"| backend | case | code | ratio | range | vs plain SQL | time/op | allocs/op | target | met |",
		"| postgres | Bare | bare | 1.00x |  |  | 200.0 µs | 9 |  |  |",
		// Rounds 1.50, 1.40, 1.30; to the plain SQL 1.20, 0.93, 0.87.
		"| postgres | NewKey | library | 1.40x | 1.30-1.50x | 0.93x | 300.0 µs | 133 | <= 1.45x, < contender | yes |",
		"| postgres | NewKey | plain SQL | 1.50x | 1.25-1.50x |  | 250.0 µs | 40 |  |  |",
		"| postgres | Replay | library | 0.30x | 0.30-0.30x | 1.20x | 60.0 µs | 33 | <= 0.25x, < contender | no (+20%, behind contender) |",
		"| postgres | Replay | plain SQL | 0.25x | 0.25-0.25x |  | 50.0 µs | 30 |  |  |",
		// One round only; faster than the plain SQL is not a target here,
		// but 1.3x of the floor (SameKey20Bare of the same round) is.
		"| postgres | SameKey20 | library | 2.00x | 2.00-2.00x | 0.50x | 400.0 µs | 300 | <= 1.30x floor | no (1.60x the floor) |",
		"| postgres | SameKey20Bare | no library | 1.25x | 1.25-1.25x |  | 250.0 µs | 140 |  |  |",
		"| postgres | BareParallel8 | bare | 1.00x |  |  | 100.0 µs | 9 |  |  |",
		// Mixed8 is compared with BareParallel8.
		"| postgres | Mixed8 | library | 1.50x | 1.50-1.50x |  | 150.0 µs | 80 | <= 0.80x | no (+88%) |",
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("table lacks\n%s\nin:\n%s", want, out)
		}
	}
	// The plain SQL rows follow the library's same case.
	if i, j := strings.Index(out, "| NewKey | plain SQL"), strings.Index(out, "| Replay | library"); i < 0 || j < i {
		t.Errorf("plain SQL NewKey not between library NewKey and Replay:\n%s", out)
	}
	if !strings.Contains(out, "linux/amd64, Test CPU @ 2.00GHz, GOMAXPROCS 2") {
		t.Errorf("header lacks the machine:\n%s", out)
	}
}

// runLocalOutput is one round of RunLocal1 and RunLocal2 on SQLite and
// PostgreSQL, whose store on database/sql (BenchmarkDBStore) has the same
// targets; Redis skips them (no backend.Stepper).
const runLocalOutput = `pkg: github.com/go-idempotency/idempotency/sqlite
BenchmarkStore/Bare-2          	    2000	    100000 ns/op	     1000 B/op	       9 allocs/op
BenchmarkStore/RunLocal1-2     	    2000	    150000 ns/op	     7000 B/op	     161 allocs/op
BenchmarkStore/RunLocal2-2     	    2000	    250000 ns/op	    12000 B/op	     328 allocs/op
pkg: github.com/go-idempotency/idempotency/postgres
BenchmarkStore/Bare-2          	    2000	    100000 ns/op	     1000 B/op	       9 allocs/op
BenchmarkStore/RunLocal1-2     	    2000	    170000 ns/op	     7000 B/op	     161 allocs/op
BenchmarkDBStore/Bare-2        	    2000	    100000 ns/op	     1000 B/op	       9 allocs/op
BenchmarkDBStore/RunLocal1-2   	    2000	    150000 ns/op	     7000 B/op	     161 allocs/op
pkg: github.com/go-idempotency/idempotency/redis
BenchmarkStore/Bare-2          	    2000	    100000 ns/op	     1000 B/op	       9 allocs/op
PASS
`

// TestRunLocalTargets: RunLocal1 has the target 1.60x on every SQL store
// (and none on Redis, which skips it); RunLocal2, compared with the same
// bare transaction, has none.
func TestRunLocalTargets(t *testing.T) {
	out, code := runParse(t, runLocalOutput, "-markdown")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{
		"| sqlite | RunLocal1 | library | 1.50x | 1.50-1.50x |  | 150.0 µs | 161 | <= 1.60x | yes |",
		"| sqlite | RunLocal2 | library | 2.50x | 2.50-2.50x |  | 250.0 µs | 328 |  |  |",
		"| postgres | RunLocal1 | library | 1.70x | 1.70-1.70x |  | 170.0 µs | 161 | <= 1.60x | no (+6%) |",
		"| postgres | DBStore/RunLocal1 | library | 1.50x | 1.50-1.50x |  | 150.0 µs | 161 | <= 1.60x | yes |",
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("table lacks\n%s\nin:\n%s", want, out)
		}
	}
	for _, pkg := range []string{"postgres", "mysql", "sqlite"} {
		if got := target(pkg, "Store/RunLocal1"); got != 1.6 {
			t.Errorf("%s: RunLocal1 target %v; want 1.6", pkg, got)
		}
	}
	if got := target("redis", "Store/RunLocal1"); got != 0 {
		t.Errorf("redis: RunLocal1 target %v; want none (no backend.Stepper)", got)
	}
}

func TestTextTable(t *testing.T) {
	out, code := runParse(t, countOutput)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	if strings.Contains(out, "|") || strings.Contains(out, " \n") {
		t.Errorf("text table has markdown bars or trailing blanks:\n%s", out)
	}
	for _, want := range []string{"backend   case", "postgres  NewKey         library     1.40x  1.30-1.50x", "200.0 µs  9\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("text table lacks %q:\n%s", want, out)
		}
	}
}

func TestScaleMetrics(t *testing.T) {
	const in = `pkg: github.com/go-idempotency/idempotency/sqlite
BenchmarkScale/NewKeyFull-2     2000    225000 ns/op    6000 B/op    100 allocs/op    100000 empty-ns/op    1.250 full-ratio    1.300 full-ratio-max    1.050 full-ratio-min    125000 full-ns/op
BenchmarkScale/PurgeUnderLoad-2    1    9000000000 ns/op    1500000 p99-idle-ns    2700000 p99-purge-ns    1.800 p99-ratio    4.2 purge-s    1000000 purged
`
	out, code := runParse(t, in, "-markdown")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{
		"| sqlite | Scale/NewKeyFull | library | 1.25x | 1.05-1.30x |  | 125.0 µs | 50 | <= 1.10x | no (+14%) |",
		"| sqlite | Scale/PurgeUnderLoad (p99 during/before; 1000000 keys purged in 4.2 s) | library | 1.80x | 1.80-1.80x |  |  |  | <= 2.00x | yes |",
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("table lacks\n%s\nin:\n%s", want, out)
		}
	}
}

func TestNoBenchmarks(t *testing.T) {
	if _, code := runParse(t, "PASS\n"); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// fakeTool records the runs and answers each with output whose times
// depend on the round, as a machine whose load changes between rounds.
type fakeTool struct {
	mu      sync.Mutex
	calls   []string // "pkg round-args"
	fail    string   // a package that fails its second round
	noBuild string   // a package that does not compile
	runs    map[string]int
}

func (f *fakeTool) build(_ context.Context, dir string, pkgs []string) ([]binary, error) {
	var bins []binary
	var err error
	for _, p := range pkgs {
		if p == f.noBuild {
			err = fmt.Errorf("go test -c %s: exit status 1", p)
			continue
		}
		bins = append(bins, binary{pkg: p, dir: p, path: dir + "/" + p})
	}
	return bins, err
}

func (f *fakeTool) run(_ context.Context, bin binary, args []string, echo, _ io.Writer) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.runs == nil {
		f.runs = map[string]int{}
	}
	round := f.runs[bin.pkg]
	f.runs[bin.pkg]++
	f.calls = append(f.calls, bin.pkg+" "+strings.Join(args, " "))
	load := float64(round + 1) // round n is n+1 times slower
	var out bytes.Buffer
	fmt.Fprintf(&out, "pkg: example.com/%s\n", bin.pkg)
	fmt.Fprintf(&out, "BenchmarkStore/Bare-2  100  %.0f ns/op  10 B/op  9 allocs/op\n", 100000*load)
	if bin.pkg == f.fail && round == 1 {
		out.WriteString("--- FAIL: BenchmarkStore/NewKey\n    duplicate effect\n")
		_, _ = echo.Write(out.Bytes())
		return out.Bytes(), errors.New("exit status 1")
	}
	// NewKey is 1.2x, 1.4x, 1.6x ... of the round's Bare.
	fmt.Fprintf(&out, "BenchmarkStore/NewKey-2  100  %.0f ns/op  10 B/op  99 allocs/op\n", 100000*load*(1+0.2*load))
	fmt.Fprintf(&out, "BenchmarkPlainSQL/NewKey-2  100  %.0f ns/op  10 B/op  40 allocs/op\n", 100000*load*2)
	_, _ = echo.Write(out.Bytes())
	return out.Bytes(), nil
}

func TestRoundsInterleaved(t *testing.T) {
	ft := &fakeTool{}
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"-pkgs", "a b", "-rounds", "3", "-benchtime", "7x", "-markdown"}, nil, &out, &errb, ft)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	args := "-test.run ^$ -test.bench ^(BenchmarkStore|BenchmarkDBStore|BenchmarkPlainSQL)$/^(Bare|NewKey|Replay|RunLocal1|RunLocal2|SameKey20|SameKey20Bare)$ -test.benchmem -test.benchtime 7x -test.count 1 -test.timeout 30m"
	want := []string{"a " + args, "b " + args, "a " + args, "b " + args, "a " + args, "b " + args}
	if !slices.Equal(ft.calls, want) {
		t.Fatalf("runs:\n%s\nwant (round by round, every package in each):\n%s", strings.Join(ft.calls, "\n"), strings.Join(want, "\n"))
	}
	// Each round's NewKey is divided by the same round's Bare: 1.2, 1.4, 1.6.
	for _, want := range []string{
		"| a | NewKey | library | 1.40x | 1.20-1.60x | 0.70x | 280.0 µs | 99 |",
		"| a | NewKey | plain SQL | 2.00x | 2.00-2.00x |",
		"| b | NewKey | library | 1.40x | 1.20-1.60x |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks\n%s\nin:\n%s", want, out.String())
		}
	}
	if !strings.Contains(out.String(), "`go run ./cmd/idembench -pkgs 'a b' -rounds 3 -benchtime 7x -markdown` (3 interleaved round(s) of -benchtime 7x") {
		t.Errorf("header does not say how it was measured:\n%s", out.String())
	}
	if strings.Contains(errb.String(), "BenchmarkStore/Bare") {
		t.Errorf("benchmark output echoed without -v:\n%s", errb.String())
	}
}

func TestParallelFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, defaultBench},
		{[]string{"-parallel"}, parallelBench},
		{[]string{"-parallel", "-bench", "X"}, "X"},
	} {
		ft := &fakeTool{}
		var out, errb bytes.Buffer
		if code := run(context.Background(), append([]string{"-pkgs", "a", "-rounds", "1"}, c.args...), nil, &out, &errb, ft); code != 0 {
			t.Fatalf("%q: exit %d: %s", c.args, code, errb.String())
		}
		if len(ft.calls) != 1 || !strings.Contains(ft.calls[0], " -test.bench "+c.want+" ") {
			t.Errorf("%q: runs %q, want -test.bench %s", c.args, ft.calls, c.want)
		}
	}
}

func TestFailedRound(t *testing.T) {
	ft := &fakeTool{fail: "b"}
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"-pkgs", "a b", "-rounds", "3", "-markdown", "-v"}, nil, &out, &errb, ft)
	if code != 1 {
		t.Fatalf("exit %d, want 1 after a failed round", code)
	}
	if len(ft.calls) != 6 {
		t.Errorf("%d runs, want 6: a failure must not stop the other rounds", len(ft.calls))
	}
	for _, want := range []string{"b, round 2: exit status 1", "duplicate effect"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errb.String())
		}
	}
	// b's NewKey has rounds 1 and 3 only (1.2 and 1.6): no pairing with
	// round 2's Bare.
	if want := "| b | NewKey | library | 1.40x | 1.20-1.60x |"; !strings.Contains(out.String(), want) {
		t.Errorf("table lacks\n%s\nin:\n%s", want, out.String())
	}
}

func TestBuildFailure(t *testing.T) {
	ft := &fakeTool{noBuild: "b"}
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"-pkgs", "a b", "-rounds", "2"}, nil, &out, &errb, ft)
	if code != 1 {
		t.Fatalf("exit %d, want 1 when a package does not compile", code)
	}
	if !strings.Contains(errb.String(), "go test -c b: exit status 1") {
		t.Errorf("stderr does not name the package:\n%s", errb.String())
	}
	if len(ft.calls) != 2 || !strings.Contains(out.String(), "NewKey  library") {
		t.Errorf("the package that compiled was not measured (%d runs):\n%s", len(ft.calls), out.String())
	}
}

func TestFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int
	}{
		{[]string{"-rounds", "0"}, 2},
		{[]string{"-pkgs", ""}, 2},
		{[]string{"extra"}, 2},
		{[]string{"-nosuch"}, 2},
		{[]string{"-h"}, 0},
	} {
		ft := &fakeTool{}
		var out, errb bytes.Buffer
		if code := run(context.Background(), c.args, nil, &out, &errb, ft); code != c.want {
			t.Errorf("%q: exit %d, want %d", c.args, code, c.want)
		}
		if len(ft.calls) != 0 {
			t.Errorf("%q: ran benchmarks", c.args)
		}
	}
}
