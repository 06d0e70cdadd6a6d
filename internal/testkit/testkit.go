// Package testkit holds the helpers that the tests of the packages of this
// module share instead of each writing its own:
//
//   - a context bounded by a deadline ([Context]);
//   - random names for tables, schemas, prefixes and keys ([Name]);
//   - a start gate that releases concurrent callers together ([Together]);
//   - a channel opened once ([Gate]);
//   - a wait for a condition ([WaitUntil]);
//   - an effects table on a database/sql database ([Effects]);
//   - the checks that a test counted the effects it expected
//     ([MustCount]), gave back every pooled connection ([CheckReleased])
//     and left no goroutine behind ([Goroutines]);
//   - a child process of the test binary whose output a test waits on
//     ([StartChild], [WaitForLine]);
//   - the scenarios every backend runs on its own capture of what it
//     sends ([ClockOnly]).
//
// Its subpackage pgkit holds what needs pgx.
//
// It imports "testing", so only _test.go files may import it. A library
// package that depends on it fails TestLibraryImports (imports_test.go at the module root).
package testkit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"runtime"
	"sync"
	"testing"
	"time"
)

// Context returns a context that ends d from now, cancelled by a cleanup of
// t (which runs after the cleanups registered later). Its parent is
// context.Background, not t.Context, which ends before any cleanup. So the
// cleanups a test registers after calling Context (a holder releasing its
// key, a table dropped) may still use it.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Name returns prefix followed by 12 random lowercase hexadecimal digits
// (48 random bits). It is a fresh name for a table, schema, key prefix or
// key, that no other test nor earlier run uses. It is a valid SQL identifier
// when prefix is one.
func Name(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return prefix + hex.EncodeToString(b)
}

// Gate is a channel closed once: by Open, or when the test ends, so that no
// goroutine of a failed test stays blocked on it. Build one with NewGate.
type Gate struct {
	c    chan struct{}
	open func()
}

// NewGate returns a closed gate and registers its Open as a cleanup of t.
// Cleanups run last registered first: if a cleanup registered after
// NewGate (a server's Close) waits for a goroutine blocked on the gate,
// register t.Cleanup(g.Open) after it too.
func NewGate(t testing.TB) *Gate {
	c := make(chan struct{})
	g := &Gate{c: c, open: sync.OnceFunc(func() { close(c) })}
	t.Cleanup(g.open)
	return g
}

// Open releases every goroutine waiting on the gate; it may be called more
// than once.
func (g *Gate) Open() { g.open() }

// Opened returns a channel that is closed once the gate is open.
func (g *Gate) Opened() <-chan struct{} { return g.c }

// Together runs f(0), ..., f(n-1), each in a goroutine of its own. A start
// gate releases them at the same moment, once all n goroutines exist.
// Together returns when every call has returned. It is the way to put n
// concurrent callers on one key.
func Together(n int, f func(i int)) {
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-gate
			f(i)
		})
	}
	close(gate)
	wg.Wait()
}

// releaseWait is how long CheckReleased gives the goroutines of a test
// (a holder unwinding, a waiter returning) to give their connections back.
const releaseWait = 5 * time.Second

// CheckReleased registers a cleanup that fails t unless inUse falls to
// zero within a few seconds of the end of the test. The function inUse
// counts the connections a pool has handed out, as sql.DBStats.InUse or
// pgxpool.Stat.AcquiredConns do. A connection that is never given back is
// a leak. Register it after the cleanup that closes the pool, so that it
// runs first.
func CheckReleased(t testing.TB, what string, inUse func() int) {
	t.Cleanup(func() {
		deadline := time.Now().Add(releaseWait)
		for inUse() != 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := inUse(); n != 0 {
			t.Errorf("%d %s still in use %v after the test: leaked", n, what, releaseWait)
		}
	})
}

// pollEvery is how often WaitUntil asks its condition.
const pollEvery = 10 * time.Millisecond

// WaitUntil returns once ok reports true, asking it every few
// milliseconds. It fails t now if ok still reports false after d. The
// argument what names the awaited state in the failure ("the waiters to
// queue").
func WaitUntil(t testing.TB, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(pollEvery)
	}
}

// Goroutines returns the number of goroutines once those that are ending
// have ended: the least that runtime.NumGoroutine reports over half a
// second. Compare it before and after a workload to see whether the
// workload left goroutines behind.
func Goroutines() int {
	n := runtime.NumGoroutine()
	for range 20 {
		time.Sleep(25 * time.Millisecond)
		n = min(n, runtime.NumGoroutine())
	}
	return n
}

// MustCount fails t now unless count (an effect table's counter, as
// conformance.Fixture.Count) reports want effects tagged tag.
func MustCount(t testing.TB, ctx context.Context, count func(context.Context, string) (int, error), tag string, want int) {
	t.Helper()
	got, err := count(ctx, tag)
	if err != nil {
		t.Fatalf("count %q: %v", tag, err)
	}
	if got != want {
		t.Fatalf("effects %q: got %d, want %d", tag, got, want)
	}
}
