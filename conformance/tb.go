package conformance

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"
)

// lateBound is how long the cleanup of a case waits, once the case's
// context has ended, for a goroutine of the case that outlived it (a hung
// call of the store). Then it gives up on it.
const lateBound = 5 * time.Second

// endedTB is the testing.TB a fixture gets. It passes every call on to the
// case's t while the case runs. Once the case has ended (its last cleanup
// ran), a report from a goroutine the store left behind goes to the test
// that called [Run] instead, failing it. Once that test too is over, the
// report goes to stderr. The reason: testing panics on a Fail or Log after
// the test completed. That panic would kill the whole test binary, skip
// every later case and every cleanup, and leave the author's servers
// running.
type endedTB struct {
	testing.TB
	late  *lateSink
	mu    sync.Mutex
	ended bool
}

// guardTB wraps t for a fixture; see endedTB.
func guardTB(t testing.TB, late *lateSink) testing.TB {
	g := &endedTB{TB: t, late: late}
	// Registered before the fixture's own cleanups, so it runs after them:
	// they may still report.
	t.Cleanup(func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.ended = true
	})
	return g
}

// lateSink takes the reports of fixtures whose case has ended: it fails
// the test that called [Run] with them while that test lives.
type lateSink struct {
	mu     sync.Mutex
	t      testing.TB
	closed bool
}

func newLateSink(t testing.TB) *lateSink {
	s := &lateSink{t: t}
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.closed = true
	})
	return s
}

// report fails the run with msg, from case name, or writes it to stderr
// once the run is over.
func (s *lateSink) report(name, what, msg string) {
	if s == nil {
		fmt.Fprintf(os.Stderr, "conformance: %s: %s after the case ended: %s\n", name, what, msg)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		fmt.Fprintf(os.Stderr, "conformance: %s: %s after the case ended (and the run): %s\n", name, what, msg)
		return
	}
	s.t.Errorf("conformance: %s: the store's fixture reported (%s) after the case ended, from a goroutine it left running: %s", name, what, msg)
}

// live reports whether the case still runs; if not, it hands the report
// to the sink.
func (g *endedTB) live(what string, args ...any) bool {
	g.mu.Lock()
	ended := g.ended
	g.mu.Unlock()
	if ended {
		g.late.report(g.TB.Name(), what, fmt.Sprint(args...))
		return false
	}
	return true
}

// Error reports like t.Error while the case runs.
func (g *endedTB) Error(args ...any) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ended {
		g.late.report(g.TB.Name(), "Error", fmt.Sprint(args...))
		return
	}
	g.TB.Helper()
	g.TB.Error(args...)
}

// Errorf reports like t.Errorf while the case runs.
func (g *endedTB) Errorf(format string, args ...any) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ended {
		g.late.report(g.TB.Name(), "Errorf", fmt.Sprintf(format, args...))
		return
	}
	g.TB.Helper()
	g.TB.Errorf(format, args...)
}

// Fail marks the case failed while it runs.
func (g *endedTB) Fail() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ended {
		g.late.report(g.TB.Name(), "Fail", "")
		return
	}
	g.TB.Fail()
}

// Log logs like t.Log while the case runs.
func (g *endedTB) Log(args ...any) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ended {
		return
	}
	g.TB.Helper()
	g.TB.Log(args...)
}

// Logf logs like t.Logf while the case runs.
func (g *endedTB) Logf(format string, args ...any) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ended {
		return
	}
	g.TB.Helper()
	g.TB.Logf(format, args...)
}

// FailNow stops the case like t.FailNow while it runs; after the case it
// only reports (the calling goroutine is the store's, not the case's).
func (g *endedTB) FailNow() {
	if !g.live("FailNow") {
		return
	}
	g.TB.FailNow()
}

// Fatal reports and stops like t.Fatal while the case runs.
func (g *endedTB) Fatal(args ...any) {
	if !g.live("Fatal", args...) {
		return
	}
	g.TB.Helper()
	g.TB.Fatal(args...)
}

// Fatalf reports and stops like t.Fatalf while the case runs.
func (g *endedTB) Fatalf(format string, args ...any) {
	if !g.live("Fatalf", fmt.Sprintf(format, args...)) {
		return
	}
	g.TB.Helper()
	g.TB.Fatalf(format, args...)
}
