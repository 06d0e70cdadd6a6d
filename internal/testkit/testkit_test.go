package testkit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeT records what the kit reports to a test, and runs its cleanups when
// told, so that the kit's failures can be checked.
type fakeT struct {
	testing.TB // nil: calling anything not overridden panics
	mu         sync.Mutex
	cleanups   []func()
	errs       []string
}

func (f *fakeT) Helper() {}

func (f *fakeT) Cleanup(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cleanups = append(f.cleanups, fn)
}

func (f *fakeT) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs = append(f.errs, fmt.Sprintf(format, args...))
}

func (f *fakeT) Fatalf(format string, args ...any) {
	f.Errorf(format, args...)
	runtime.Goexit()
}

// run calls fn in a goroutine of its own, as the testing package runs a
// test (so that Fatalf ends it), then its cleanups, last registered first.
// It returns what was reported.
func (f *fakeT) run(fn func(t testing.TB)) []string {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
	return f.errs
}

func TestContext(t *testing.T) {
	ft := &fakeT{}
	var ctx context.Context
	ft.run(func(t testing.TB) {
		ctx = Context(t, time.Hour)
		if ctx.Err() != nil {
			panic("ended early")
		}
	})
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("after cleanup: %v, want context.Canceled", ctx.Err())
	}
	short := Context(t, time.Millisecond)
	<-short.Done()
	if !errors.Is(short.Err(), context.DeadlineExceeded) {
		t.Fatalf("after the deadline: %v, want context.DeadlineExceeded", short.Err())
	}
}

func TestName(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		n := Name("keys_")
		if !regexp.MustCompile(`^keys_[0-9a-f]{12}$`).MatchString(n) {
			t.Fatalf("Name: %q", n)
		}
		if seen[n] {
			t.Fatalf("Name gave %q twice", n)
		}
		seen[n] = true
	}
}

func TestGate(t *testing.T) {
	ft := &fakeT{}
	var g *Gate
	ft.run(func(t testing.TB) { g = NewGate(t) })
	select {
	case <-g.Opened():
	default:
		t.Fatal("the gate is still closed after cleanup")
	}
	g.Open() // again: no panic

	g = NewGate(t)
	select {
	case <-g.Opened():
		t.Fatal("a new gate is open")
	default:
	}
	g.Open()
	<-g.Opened()
}

func TestTogether(t *testing.T) {
	const n = 20
	var waiting, most atomic.Int64
	calls := make([]int, n)
	Together(n, func(i int) {
		calls[i]++
		w := waiting.Add(1)
		for m := most.Load(); w > m && !most.CompareAndSwap(m, w); m = most.Load() {
		}
		time.Sleep(50 * time.Millisecond) // the others arrive meanwhile
		waiting.Add(-1)
	})
	for i, c := range calls {
		if c != 1 {
			t.Fatalf("f(%d) ran %d times", i, c)
		}
	}
	if most.Load() < 2 {
		t.Fatalf("at most %d callers at once: not concurrent", most.Load())
	}
}

func TestCheckReleased(t *testing.T) {
	var inUse atomic.Int64
	inUse.Store(1)
	errs := (&fakeT{}).run(func(t testing.TB) {
		CheckReleased(t, "connections", func() int { return int(inUse.Load()) })
		time.AfterFunc(50*time.Millisecond, func() { inUse.Store(0) })
	})
	if len(errs) != 0 {
		t.Fatalf("given back late but in time: %q", errs)
	}

	inUse.Store(2)
	start := time.Now()
	errs = (&fakeT{}).run(func(t testing.TB) {
		CheckReleased(t, "connections", func() int { return int(inUse.Load()) })
	})
	if len(errs) != 1 || !strings.HasPrefix(errs[0], "2 connections still in use") {
		t.Fatalf("never given back: %q", errs)
	}
	if waited := time.Since(start); waited < releaseWait {
		t.Fatalf("gave up after %v, want %v", waited, releaseWait)
	}
}

func TestWaitUntil(t *testing.T) {
	var calls atomic.Int64
	start := time.Now()
	errs := (&fakeT{}).run(func(t testing.TB) {
		WaitUntil(t, 5*time.Second, "the third call", func() bool { return calls.Add(1) == 3 })
	})
	if len(errs) != 0 || calls.Load() != 3 {
		t.Fatalf("condition met at the third call: errors %q, %d calls", errs, calls.Load())
	}
	var after bool
	errs = (&fakeT{}).run(func(t testing.TB) {
		WaitUntil(t, 50*time.Millisecond, "nothing", func() bool { return false })
		after = true
	})
	if len(errs) != 1 || errs[0] != "timed out after 50ms waiting for nothing" || after {
		t.Fatalf("never met: errors %q, went on: %v", errs, after)
	}
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Fatalf("gave up after %v, want 50ms", waited)
	}
}

func TestGoroutines(t *testing.T) {
	before := Goroutines()
	stop := make(chan struct{})
	for range 5 {
		go func() { <-stop }()
	}
	for range 5 { // ending while Goroutines counts
		go func() { time.Sleep(100 * time.Millisecond) }()
	}
	if got := Goroutines(); got != before+5 {
		t.Errorf("with 5 goroutines left running: %d, want %d", got, before+5)
	}
	close(stop)
	if got := Goroutines(); got != before {
		t.Errorf("once they end: %d, want %d", got, before)
	}
}

func TestMustCount(t *testing.T) {
	counts := map[string]int{"a": 2}
	count := func(_ context.Context, tag string) (int, error) {
		if tag == "broken" {
			return 0, errors.New("no table")
		}
		return counts[tag], nil
	}
	for _, tc := range []struct {
		tag  string
		want int
		errs string
	}{
		{"a", 2, ""},
		{"b", 0, ""},
		{"a", 1, `effects "a": got 2, want 1`},
		{"broken", 0, `count "broken": no table`},
	} {
		var after bool
		errs := (&fakeT{}).run(func(t testing.TB) {
			MustCount(t, context.Background(), count, tc.tag, tc.want)
			after = true
		})
		if got := strings.Join(errs, "\n"); got != tc.errs {
			t.Errorf("MustCount(%q, %d): reported %q, want %q", tc.tag, tc.want, got, tc.errs)
		}
		if after != (tc.errs == "") {
			t.Errorf("MustCount(%q, %d): test went on: %v", tc.tag, tc.want, after)
		}
	}
}

func TestWaitForLine(t *testing.T) {
	if !WaitForLine(strings.NewReader("a\nready\nb\n"), "ready", time.Second) {
		t.Error("a line that is there: not found")
	}
	if WaitForLine(strings.NewReader("a\nnot ready\n"), "ready", time.Second) {
		t.Error("a reader that ends without the line: found")
	}
	r, w := io.Pipe()
	defer w.Close()
	start := time.Now()
	if WaitForLine(r, "ready", 50*time.Millisecond) || time.Since(start) < 50*time.Millisecond {
		t.Error("a reader that stays silent: found, or gave up before the bound")
	}
	// The rest is drained: a writer after the line never blocks.
	r2, w2 := io.Pipe()
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		_, _ = io.WriteString(w2, "ready\n")
		for range 100 {
			_, _ = io.WriteString(w2, "more\n")
		}
		_ = w2.Close()
	}()
	if !WaitForLine(r2, "ready", time.Second) {
		t.Error("piped line: not found")
	}
	select {
	case <-wrote:
	case <-time.After(5 * time.Second):
		t.Error("the writer blocked after the line: the rest was not drained")
	}
}
