package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

const sample = `goos: linux
pkg: github.com/go-idempotency/idempotency/postgres
BenchmarkStore/Bare-2          	    5000	    400000 ns/op	     1000 B/op	       9 allocs/op
BenchmarkStore/NewKey-2        	    5000	    440000 ns/op	     9000 B/op	     135 allocs/op
BenchmarkStore/Replay-2        	   20000	    120000 ns/op	     3000 B/op	      33 allocs/op
BenchmarkStore/BareParallel8-2 	   20000	    100000 ns/op	     1000 B/op	       9 allocs/op
BenchmarkStore/Mixed8-2        	   20000	    150000 ns/op	     5000 B/op	      80 allocs/op
PASS
`

func TestTable(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"-parse"}, strings.NewReader(sample), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{
		"| postgres | Bare | 400.0 µs | 9 | 1.00x |  |  |",
		"| postgres | NewKey | 440.0 µs | 135 | 1.10x | <= 1.15x | yes |",
		"| postgres | Replay | 120.0 µs | 33 | 0.30x | <= 0.25x | no (+20%) |",
		"| postgres | Mixed8 | 150.0 µs | 80 | 1.50x |  |  |",
	} {
		if !strings.Contains(out.String(), want+"\n") {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func TestNoBenchmarks(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"-parse"}, strings.NewReader("PASS\n"), &out, &errb); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
}
