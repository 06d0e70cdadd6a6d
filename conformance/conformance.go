package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

// Callers is how many concurrent callers the concurrency cases fire.
const Callers = 20

// caseTimeout bounds every case: a deadlock fails the case instead of
// hanging the run.
const caseTimeout = 60 * time.Second

// Run runs every conformance case against the backend that h describes,
// each as a subtest named after the contract it checks.
func Run[Tx any](t *testing.T, h Harness[Tx]) {
	t.Helper()
	if h.NewFixture == nil {
		t.Fatal("conformance: Harness.NewFixture is nil")
	}
	s := &suite[Tx]{h: h}
	cases := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"ConcurrentSameKey", s.concurrentSameKey},
		{"WinnerFailsWhileOthersWait", s.winnerFails},
		{"SmallPool", s.smallPool},
		{"DistinctKeysParallel", s.distinctKeys},
		{"DistinctKeyNotBlocked", s.distinctKeyNotBlocked},
		{"ScopesAreSeparate", s.scopes},
		{"KeysAreByteExact", s.byteExactKeys},
		{"WaiterGetsReplay", s.waiterGetsReplay},
		{"WaitBound", s.waitBound},
		{"NoWait", s.noWait},
		{"CancelWhileWaiting", s.cancelWhileWaiting},
		{"ErrorRollsBack", s.errorRollsBack},
		{"PanicRollsBack", s.panicRollsBack},
		{"InvalidResponseRollsBack", s.invalidResponse},
		{"LargeBinaryBody", s.largeBody},
		{"InvalidInputRefused", s.invalidInput},
		{"TTLExpiry", s.ttlExpiry},
		{"Purge", s.purge},
		{"Observer", s.observer},
		{"NoGoroutineGrowth", s.noGoroutineGrowth},
	}
	for _, c := range cases {
		t.Run(c.name, c.fn)
	}
}

type suite[Tx any] struct{ h Harness[Tx] }

// env is one case's fixture, context and helpers.
type env[Tx any] struct {
	t   *testing.T
	ctx context.Context
	f   Fixture[Tx]
}

func (s *suite[Tx]) setup(t *testing.T, opts Options) *env[Tx] {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
	t.Cleanup(cancel)
	f := s.h.NewFixture(t, opts)
	if f.Store == nil || f.Effect == nil || f.Count == nil {
		t.Fatal("conformance: fixture must set Store, Effect and Count")
	}
	return &env[Tx]{t: t, ctx: ctx, f: f}
}

func (e *env[Tx]) guard(cfg *idempotency.Config) *idempotency.Guard[Tx] {
	e.t.Helper()
	g, err := idempotency.New(e.f.Store, cfg)
	if err != nil {
		e.t.Fatalf("idempotency.New: %v", err)
	}
	return g
}

// count fails the case unless exactly want effects tagged tag committed.
func (e *env[Tx]) count(tag string, want int, contract string) {
	e.t.Helper()
	got, err := e.f.Count(e.ctx, tag)
	if err != nil {
		e.t.Fatalf("Count(%q): %v", tag, err)
	}
	if got != want {
		e.t.Fatalf("%s: effects committed for %q: got %d, want %d", contract, tag, got, want)
	}
}

// effectFn returns an fn that performs one effect tagged tag and answers
// 201 with a body unique to this execution, counting its calls.
func (e *env[Tx]) effectFn(tag string, calls *atomic.Int64) func(Tx) (idempotency.Response, error) {
	return func(tx Tx) (idempotency.Response, error) {
		n := calls.Add(1)
		if err := e.f.Effect(e.ctx, tx, tag); err != nil {
			return idempotency.Response{}, err
		}
		return created(tag, n), nil
	}
}

func created(tag string, n int64) idempotency.Response {
	return idempotency.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/" + tag}},
		Body:   []byte(`{"tag":"` + tag + `","execution":` + strconv.FormatInt(n, 10) + `}`),
	}
}

func uniq(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%x", prefix, b)
}

// within runs fn and fails the case if it has not returned after d: a
// deadlock fails instead of hanging.
func within(t *testing.T, d time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not finish within %v (deadlock or leaked connection?)", what, d)
	}
}

type result struct {
	resp idempotency.Response
	err  error
}

// fire releases n callers of call together through a start gate and
// collects their results.
func fire(t *testing.T, n int, call func(i int) (idempotency.Response, error)) []result {
	t.Helper()
	out := make([]result, n)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			out[i].resp, out[i].err = call(i)
		}()
	}
	within(t, caseTimeout, fmt.Sprintf("%d concurrent callers", n), func() {
		close(gate)
		wg.Wait()
	})
	return out
}

func sameResponse(a, b idempotency.Response) bool {
	return a.Status == b.Status && bytes.Equal(a.Body, b.Body) && headerEqual(a.Header, b.Header)
}

func headerEqual(a, b http.Header) bool {
	if len(a) == 0 && len(b) == 0 {
		return true
	}
	return reflect.DeepEqual(a, b)
}

// checkOneExecution asserts the contract of concurrent callers of one key:
// every result but those allowed to fail is a success, all successes carry
// the same response, and exactly one of them executed.
func checkOneExecution(t *testing.T, rs []result, contract string) idempotency.Response {
	t.Helper()
	var first *idempotency.Response
	executed := 0
	for i, r := range rs {
		if r.err != nil {
			t.Fatalf("%s: caller %d got error %v, want the committed response", contract, i, r.err)
		}
		if !r.resp.Replayed {
			executed++
		}
		if first == nil {
			first = &rs[i].resp
		} else if !sameResponse(*first, r.resp) {
			t.Fatalf("%s: caller %d got %d %q, want the same response as the others: %d %q",
				contract, i, r.resp.Status, r.resp.Body, first.Status, first.Body)
		}
	}
	if executed != 1 {
		t.Fatalf("%s: %d callers report Replayed=false, want exactly 1", contract, executed)
	}
	return *first
}

func (s *suite[Tx]) concurrentSameKey(t *testing.T) {
	e := s.setup(t, Options{})
	g := e.guard(nil)
	key := idempotency.Key{Scope: "client-1", ID: uniq("k")}
	var calls atomic.Int64
	fn := e.effectFn("payment", &calls)
	rs := fire(t, Callers, func(int) (idempotency.Response, error) {
		return g.Do(e.ctx, key, "fp-amount-100", fn)
	})
	resp := checkOneExecution(t, rs, "20 concurrent callers with one key")
	if resp.Status != http.StatusCreated {
		t.Fatalf("status: got %d, want 201", resp.Status)
	}
	e.count("payment", 1, "20 concurrent callers with one key must give one effect")
	if c := calls.Load(); c != 1 {
		t.Fatalf("fn ran %d times, want 1", c)
	}

	// The same key with another payload is refused; nothing runs.
	_, err := g.Do(e.ctx, key, "fp-amount-999", fn)
	if !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("same key, other fingerprint: got %v, want ErrMismatch", err)
	}
	e.count("payment", 1, "a mismatched request must not run the effect")
	// And the original payload still replays.
	again, err := g.Do(e.ctx, key, "fp-amount-100", fn)
	if err != nil || !again.Replayed || !sameResponse(again, resp) {
		t.Fatalf("replay after mismatch: got %+v, %v; want the stored response", again, err)
	}
}

var errWinnerFails = errors.New("conformance: the winner's effect fails")

func (s *suite[Tx]) winnerFails(t *testing.T) {
	e := s.setup(t, Options{})
	g := e.guard(nil)
	key := idempotency.Key{ID: uniq("k")}
	var calls atomic.Int64
	rs := fire(t, Callers, func(int) (idempotency.Response, error) {
		return g.Do(e.ctx, key, "fp", func(tx Tx) (idempotency.Response, error) {
			n := calls.Add(1)
			if err := e.f.Effect(e.ctx, tx, "payment"); err != nil {
				return idempotency.Response{}, err
			}
			if n == 1 {
				// Let the other callers queue up on the key, then fail.
				time.Sleep(300 * time.Millisecond)
				return idempotency.Response{}, errWinnerFails
			}
			return created("payment", n), nil
		})
	})
	var ok []result
	failed := 0
	for i, r := range rs {
		switch {
		case errors.Is(r.err, errWinnerFails):
			failed++
		case r.err != nil:
			t.Fatalf("winner failed while others waited: caller %d got %v; only the failing caller may see an error", i, r.err)
		default:
			ok = append(ok, r)
		}
	}
	if failed != 1 {
		t.Fatalf("%d callers saw the winner's error, want exactly 1", failed)
	}
	checkOneExecution(t, ok, "after the winner failed, the 19 others")
	e.count("payment", 1, "after the winner failed, exactly one effect must commit")
}

func (s *suite[Tx]) smallPool(t *testing.T) {
	e := s.setup(t, Options{MaxConns: 2})
	g := e.guard(nil)
	key := idempotency.Key{ID: uniq("k")}
	var calls atomic.Int64
	fn := e.effectFn("same", &calls)
	rs := fire(t, Callers, func(i int) (idempotency.Response, error) {
		if i%2 == 1 {
			// Half the callers use distinct keys, half share one.
			return g.Do(e.ctx, idempotency.Key{ID: uniq("d")}, "fp", e.effectFn("distinct", new(atomic.Int64)))
		}
		return g.Do(e.ctx, key, "fp", fn)
	})
	var same []result
	for i, r := range rs {
		if r.err != nil {
			t.Fatalf("pool of 2, caller %d: %v", i, r.err)
		}
		if i%2 == 0 {
			same = append(same, r)
		}
	}
	checkOneExecution(t, same, "pool of 2 connections, 10 callers of one key")
	e.count("same", 1, "pool of 2 connections")
	e.count("distinct", Callers/2, "pool of 2 connections, distinct keys")
}

func (s *suite[Tx]) distinctKeys(t *testing.T) {
	e := s.setup(t, Options{})
	g := e.guard(nil)
	const n = 40
	keys := make([]idempotency.Key, n)
	for i := range keys {
		keys[i] = idempotency.Key{Scope: "s", ID: uniq("k")}
	}
	rs := fire(t, n, func(i int) (idempotency.Response, error) {
		return g.Do(e.ctx, keys[i], "fp", e.effectFn("k"+strconv.Itoa(i), new(atomic.Int64)))
	})
	for i, r := range rs {
		if r.err != nil || r.resp.Replayed {
			t.Fatalf("distinct key %d: got %+v, %v; want executed", i, r.resp, r.err)
		}
		e.count("k"+strconv.Itoa(i), 1, "each distinct key runs once")
	}
	// Every key now replays its own response.
	rs2 := fire(t, n, func(i int) (idempotency.Response, error) {
		return g.Do(e.ctx, keys[i], "fp", func(Tx) (idempotency.Response, error) {
			return idempotency.Response{}, errors.New("fn must not run on a replay")
		})
	})
	for i, r := range rs2 {
		if r.err != nil || !r.resp.Replayed || !sameResponse(r.resp, rs[i].resp) {
			t.Fatalf("replay of distinct key %d: got %+v, %v; want its own stored response", i, r.resp, r.err)
		}
	}
}

// hold starts a caller that takes key and keeps it (inside fn, after its
// effect) until release is closed. It returns once the key is held.
func (e *env[Tx]) hold(g *idempotency.Guard[Tx], key idempotency.Key, tag string) (release func(), done <-chan result) {
	e.t.Helper()
	held := make(chan struct{})
	rel := make(chan struct{})
	out := make(chan result, 1)
	go func() {
		resp, err := g.Do(e.ctx, key, "fp", func(tx Tx) (idempotency.Response, error) {
			if err := e.f.Effect(e.ctx, tx, tag); err != nil {
				return idempotency.Response{}, err
			}
			close(held)
			select {
			case <-rel:
			case <-e.ctx.Done():
			}
			return created(tag, 1), nil
		})
		out <- result{resp, err}
	}()
	select {
	case <-held:
	case r := <-out:
		e.t.Fatalf("holder of %q ended before holding it: %+v, %v", key.ID, r.resp, r.err)
	case <-e.ctx.Done():
		e.t.Fatalf("holder of %q never got it", key.ID)
	}
	var once sync.Once
	release = func() { once.Do(func() { close(rel) }) }
	e.t.Cleanup(release)
	return release, out
}

func (s *suite[Tx]) distinctKeyNotBlocked(t *testing.T) {
	if s.h.Features.SerialWriters {
		t.Skip("Features.SerialWriters: one write transaction at a time for the whole store")
	}
	e := s.setup(t, Options{})
	g := e.guard(nil)
	release, done := e.hold(g, idempotency.Key{ID: uniq("held")}, "held")
	var resp idempotency.Response
	var err error
	within(t, 10*time.Second, "a caller of another key while one key is held", func() {
		resp, err = g.Do(e.ctx, idempotency.Key{ID: uniq("other")}, "fp", e.effectFn("other", new(atomic.Int64)))
	})
	if err != nil || resp.Replayed {
		t.Fatalf("another key while one is held: got %+v, %v; want executed", resp, err)
	}
	release()
	if r := <-done; r.err != nil {
		t.Fatalf("holder: %v", r.err)
	}
	e.count("held", 1, "holder")
	e.count("other", 1, "another key")
}

func (s *suite[Tx]) scopes(t *testing.T) {
	e := s.setup(t, Options{})
	g := e.guard(nil)
	id := uniq("shared-id")
	a, err := g.Do(e.ctx, idempotency.Key{Scope: "alice", ID: id}, "fp-a", e.effectFn("alice", new(atomic.Int64)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := g.Do(e.ctx, idempotency.Key{Scope: "bob", ID: id}, "fp-b", e.effectFn("bob", new(atomic.Int64)))
	if err != nil {
		t.Fatal(err)
	}
	if a.Replayed || b.Replayed || bytes.Equal(a.Body, b.Body) {
		t.Fatalf("same id in two scopes must be two operations: got %q and %q", a.Body, b.Body)
	}
	e.count("alice", 1, "scope alice")
	e.count("bob", 1, "scope bob")
	// A UTF-8 scope and the empty scope are further distinct key spaces.
	for _, scope := range []string{"", "çliënt/ü"} {
		r, err := g.Do(e.ctx, idempotency.Key{Scope: scope, ID: id}, "fp-c", e.effectFn("other-"+scope, new(atomic.Int64)))
		if err != nil || r.Replayed {
			t.Fatalf("scope %q: got %+v, %v; want executed", scope, r, err)
		}
		r, err = g.Do(e.ctx, idempotency.Key{Scope: scope, ID: id}, "fp-c", e.effectFn("other-"+scope, new(atomic.Int64)))
		if err != nil || !r.Replayed {
			t.Fatalf("scope %q again: got %+v, %v; want replayed", scope, r, err)
		}
	}
}

func (s *suite[Tx]) byteExactKeys(t *testing.T) {
	e := s.setup(t, Options{})
	g := e.guard(nil)
	base := uniq("abc")
	for _, id := range []string{base, "ABC" + base[3:], base + " ", base + "~"} {
		r, err := g.Do(e.ctx, idempotency.Key{ID: id}, "fp", e.effectFn(id, new(atomic.Int64)))
		if err != nil || r.Replayed {
			t.Fatalf("key %q must be distinct from the others: got %+v, %v", id, r, err)
		}
		e.count(id, 1, "byte-exact keys")
	}
}

func (s *suite[Tx]) waiterGetsReplay(t *testing.T) {
	e := s.setup(t, Options{})
	g := e.guard(nil)
	key := idempotency.Key{ID: uniq("k")}
	release, done := e.hold(g, key, "payment")
	waiter := make(chan result, 1)
	go func() {
		r, err := g.Do(e.ctx, key, "fp", func(Tx) (idempotency.Response, error) {
			return idempotency.Response{}, errors.New("fn must not run for a waiter when the holder succeeds")
		})
		waiter <- result{r, err}
	}()
	time.Sleep(100 * time.Millisecond) // let the waiter queue on the key
	release()
	h := <-done
	var w result
	within(t, 20*time.Second, "the waiter", func() { w = <-waiter })
	if h.err != nil || w.err != nil {
		t.Fatalf("holder: %v; waiter: %v", h.err, w.err)
	}
	if !w.resp.Replayed || !sameResponse(h.resp, w.resp) {
		t.Fatalf("waiter: got %+v, want the holder's response replayed: %+v", w.resp, h.resp)
	}
	e.count("payment", 1, "waiter gets the holder's response")
}

func (s *suite[Tx]) waitBound(t *testing.T) {
	e := s.setup(t, Options{})
	hg := e.guard(nil)
	key := idempotency.Key{ID: uniq("k")}
	release, done := e.hold(hg, key, "payment")
	g := e.guard(&idempotency.Config{WaitTimeout: 300 * time.Millisecond})
	var err error
	within(t, 15*time.Second, "a caller bounded by WaitTimeout", func() {
		_, err = g.Do(e.ctx, key, "fp", e.effectFn("waiter", new(atomic.Int64)))
	})
	if !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("key held past WaitTimeout: got %v, want ErrInProgress", err)
	}
	release()
	if r := <-done; r.err != nil {
		t.Fatalf("holder: %v", r.err)
	}
	e.count("waiter", 0, "a caller refused with ErrInProgress must not run fn")
	e.count("payment", 1, "holder")
}

func (s *suite[Tx]) noWait(t *testing.T) {
	e := s.setup(t, Options{})
	hg := e.guard(nil)
	key := idempotency.Key{ID: uniq("k")}
	release, done := e.hold(hg, key, "payment")
	g := e.guard(&idempotency.Config{NoWait: true})
	var err error
	within(t, 10*time.Second, "a NoWait caller", func() {
		_, err = g.Do(e.ctx, key, "fp", e.effectFn("waiter", new(atomic.Int64)))
	})
	if !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("NoWait on a held key: got %v, want ErrInProgress", err)
	}
	release()
	if r := <-done; r.err != nil {
		t.Fatalf("holder: %v", r.err)
	}
	// Once completed, NoWait callers get the replay.
	r, err := g.Do(e.ctx, key, "fp", e.effectFn("waiter", new(atomic.Int64)))
	if err != nil || !r.Replayed {
		t.Fatalf("NoWait on a completed key: got %+v, %v; want replayed", r, err)
	}
	e.count("waiter", 0, "NoWait callers must not run fn")
}

func (s *suite[Tx]) cancelWhileWaiting(t *testing.T) {
	e := s.setup(t, Options{MaxConns: 2})
	g := e.guard(nil)
	key := idempotency.Key{ID: uniq("k")}
	release, done := e.hold(g, key, "payment")
	const waiters = 3
	rs := fire(t, waiters, func(int) (idempotency.Response, error) {
		ctx, cancel := context.WithTimeout(e.ctx, 250*time.Millisecond)
		defer cancel()
		start := time.Now()
		r, err := g.Do(ctx, key, "fp", e.effectFn("waiter", new(atomic.Int64)))
		if d := time.Since(start); d > 5*time.Second {
			return r, fmt.Errorf("returned %v after its context ended", d)
		}
		return r, err
	})
	for i, r := range rs {
		if !errors.Is(r.err, context.DeadlineExceeded) && !errors.Is(r.err, idempotency.ErrInProgress) {
			t.Fatalf("waiter %d with a 250ms context: got %+v, %v; want a context or in-progress error, promptly", i, r.resp, r.err)
		}
	}
	release()
	if r := <-done; r.err != nil {
		t.Fatalf("holder after waiters cancelled: %v", r.err)
	}
	// No connection leaked: more calls than the pool holds still complete.
	within(t, 20*time.Second, "calls after cancelled waiters on a pool of 2", func() {
		for i := range 5 {
			if _, err := g.Do(e.ctx, idempotency.Key{ID: uniq("after")}, "fp", e.effectFn("after", new(atomic.Int64))); err != nil {
				t.Errorf("call %d after cancelled waiters: %v", i, err)
				return
			}
		}
	})
	e.count("waiter", 0, "cancelled waiters")
	e.count("after", 5, "calls after cancelled waiters")
}

var errFnFails = errors.New("conformance: fn fails")

func (s *suite[Tx]) errorRollsBack(t *testing.T) {
	e := s.setup(t, Options{})
	g := e.guard(nil)
	key := idempotency.Key{ID: uniq("k")}
	_, err := g.Do(e.ctx, key, "fp", func(tx Tx) (idempotency.Response, error) {
		if err := e.f.Effect(e.ctx, tx, "payment"); err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{}, errFnFails
	})
	if !errors.Is(err, errFnFails) {
		t.Fatalf("fn error: got %v, want fn's own error", err)
	}
	e.count("payment", 0, "an error from fn must roll the effect back")
	// The key is free: a retry runs fn again, even with another fingerprint.
	r, err := g.Do(e.ctx, key, "fp-2", e.effectFn("payment", new(atomic.Int64)))
	if err != nil || r.Replayed {
		t.Fatalf("retry after an error: got %+v, %v; want executed", r, err)
	}
	e.count("payment", 1, "retry after an error")
}

func (s *suite[Tx]) panicRollsBack(t *testing.T) {
	e := s.setup(t, Options{})
	g := e.guard(nil)
	key := idempotency.Key{ID: uniq("k")}
	var got any
	func() {
		defer func() { got = recover() }()
		_, _ = g.Do(e.ctx, key, "fp", func(tx Tx) (idempotency.Response, error) {
			if err := e.f.Effect(e.ctx, tx, "payment"); err != nil {
				return idempotency.Response{}, err
			}
			panic("conformance: fn panics")
		})
	}()
	if got != "conformance: fn panics" {
		t.Fatalf("panic in fn: recovered %v, want the panic re-raised", got)
	}
	e.count("payment", 0, "a panic in fn must roll the effect back")
	r, err := g.Do(e.ctx, key, "fp", e.effectFn("payment", new(atomic.Int64)))
	if err != nil || r.Replayed {
		t.Fatalf("retry after a panic: got %+v, %v; want executed", r, err)
	}
	e.count("payment", 1, "retry after a panic")
}

func (s *suite[Tx]) invalidResponse(t *testing.T) {
	e := s.setup(t, Options{})
	g := e.guard(nil)
	key := idempotency.Key{ID: uniq("k")}
	for _, status := range []int{0, 99, 600} {
		_, err := g.Do(e.ctx, key, "fp", func(tx Tx) (idempotency.Response, error) {
			if err := e.f.Effect(e.ctx, tx, "payment"); err != nil {
				return idempotency.Response{}, err
			}
			return idempotency.Response{Status: status}, nil
		})
		if !errors.Is(err, idempotency.ErrInvalidResponse) {
			t.Fatalf("status %d: got %v, want ErrInvalidResponse", status, err)
		}
	}
	e.count("payment", 0, "an invalid response must roll the effect back")
}

func (s *suite[Tx]) largeBody(t *testing.T) {
	e := s.setup(t, Options{})
	g := e.guard(nil)
	body := make([]byte, 1<<20)
	_, _ = rand.Read(body)
	body[0], body[1], body[len(body)-1] = 0, 0xff, 0
	header := http.Header{
		"Content-Type": {"application/octet-stream"},
		"X-Multi":      {"one", "two"},
		"X-Utf8":       {"çé ✓"},
	}
	cases := []struct {
		name string
		body []byte
	}{{"1MiB", body}, {"empty", []byte{}}}
	for _, c := range cases {
		key := idempotency.Key{ID: uniq("k")}
		fn := func(tx Tx) (idempotency.Response, error) {
			if err := e.f.Effect(e.ctx, tx, c.name); err != nil {
				return idempotency.Response{}, err
			}
			return idempotency.Response{Status: http.StatusOK, Header: header, Body: c.body}, nil
		}
		first, err := g.Do(e.ctx, key, "fp", fn)
		if err != nil || first.Replayed || !bytes.Equal(first.Body, c.body) {
			t.Fatalf("%s body, first call: %v", c.name, err)
		}
		again, err := g.Do(e.ctx, key, "fp", fn)
		if err != nil || !again.Replayed {
			t.Fatalf("%s body, replay: got replayed=%v, %v", c.name, again.Replayed, err)
		}
		if !bytes.Equal(again.Body, c.body) {
			t.Fatalf("%s body must replay byte-exact: got %d bytes, want %d", c.name, len(again.Body), len(c.body))
		}
		if again.Status != http.StatusOK || !reflect.DeepEqual(again.Header, header) {
			t.Fatalf("%s replay: got status %d header %v, want 200 %v", c.name, again.Status, again.Header, header)
		}
		e.count(c.name, 1, c.name+" body")
	}
}

// countingStore counts Reserve calls, to prove that bad input never reaches
// the store.
type countingStore[Tx any] struct {
	idempotency.KeyStore[Tx]
	reserves atomic.Int64
}

func (c *countingStore[Tx]) Reserve(ctx context.Context, r idempotency.Reservation) (idempotency.Txn[Tx], *idempotency.Record, error) {
	c.reserves.Add(1)
	return c.KeyStore.Reserve(ctx, r)
}

func (s *suite[Tx]) invalidInput(t *testing.T) {
	e := s.setup(t, Options{})
	cs := &countingStore[Tx]{KeyStore: e.f.Store}
	g, err := idempotency.New[Tx](cs, nil)
	if err != nil {
		t.Fatal(err)
	}
	fn := e.effectFn("bad", new(atomic.Int64))
	long := string(bytes.Repeat([]byte("k"), 256))
	keys := []idempotency.Key{
		{ID: ""},
		{ID: long},
		{ID: "line\nbreak"},
		{ID: "tab\tkey"},
		{ID: "ünïcode"},
		{ID: "ok", Scope: "nul\x00scope"},
		{ID: "ok", Scope: "\xff\xfe"},
		{ID: "ok", Scope: long},
	}
	for _, k := range keys {
		if _, err := g.Do(e.ctx, k, "fp", fn); !errors.Is(err, idempotency.ErrInvalidKey) {
			t.Fatalf("key %+q: got %v, want ErrInvalidKey", k, err)
		}
	}
	for _, fp := range []string{"", long, "bin\x01"} {
		if _, err := g.Do(e.ctx, idempotency.Key{ID: "ok"}, fp, fn); !errors.Is(err, idempotency.ErrInvalidFingerprint) {
			t.Fatalf("fingerprint %q: got %v, want ErrInvalidFingerprint", fp, err)
		}
	}
	if _, err := g.Do(e.ctx, idempotency.Key{ID: "ok"}, "fp", nil); !errors.Is(err, idempotency.ErrInvalidResponse) {
		t.Fatalf("nil fn: got %v, want ErrInvalidResponse", err)
	}
	if n := cs.reserves.Load(); n != 0 {
		t.Fatalf("invalid input reached the store %d times, want 0", n)
	}
	// The longest valid key and scope are accepted.
	maxKey := idempotency.Key{ID: string(bytes.Repeat([]byte("~"), 255)), Scope: string(bytes.Repeat([]byte("s"), 255))}
	if r, err := g.Do(e.ctx, maxKey, string(bytes.Repeat([]byte("f"), 255)), fn); err != nil || r.Replayed {
		t.Fatalf("255-byte id, scope and fingerprint: got %+v, %v; want executed", r, err)
	}
	e.count("bad", 1, "only the valid call")
	for _, cfg := range []idempotency.Config{{TTL: -time.Second}, {WaitTimeout: -1}, {PurgeBatch: -1}, {RetryBackoff: -1}} {
		if _, err := idempotency.New(e.f.Store, &cfg); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Fatalf("config %+v: got %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

// clock is a manual clock for TTL cases.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newClock() *clock {
	// Whole milliseconds, recent: every store can represent it exactly.
	return &clock{now: time.Now().Truncate(time.Millisecond)}
}

func (s *suite[Tx]) ttlExpiry(t *testing.T) {
	e := s.setup(t, Options{})
	clk := newClock()
	g := e.guard(&idempotency.Config{TTL: time.Hour, Now: clk.Now})
	key := idempotency.Key{ID: uniq("k")}
	var calls atomic.Int64
	fn := e.effectFn("payment", &calls)
	if r, err := g.Do(e.ctx, key, "fp", fn); err != nil || r.Replayed {
		t.Fatalf("first: %+v, %v", r, err)
	}
	clk.Add(time.Hour - time.Millisecond)
	if r, err := g.Do(e.ctx, key, "fp", fn); err != nil || !r.Replayed {
		t.Fatalf("1ms before expiry: got %+v, %v; want replayed", r, err)
	}
	clk.Add(time.Millisecond)
	// Expired: it counts as new, even with another fingerprint.
	r, err := g.Do(e.ctx, key, "fp-new", fn)
	if err != nil || r.Replayed {
		t.Fatalf("at expiry: got %+v, %v; want executed as a new key", r, err)
	}
	e.count("payment", 2, "an expired key counts as new")
	again, err := g.Do(e.ctx, key, "fp-new", fn)
	if err != nil || !again.Replayed || !sameResponse(again, r) {
		t.Fatalf("after takeover: got %+v, %v; want the new response replayed", again, err)
	}
	if _, err := g.Do(e.ctx, key, "fp", fn); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("old fingerprint after takeover: got %v, want ErrMismatch", err)
	}
}

func (s *suite[Tx]) purge(t *testing.T) {
	e := s.setup(t, Options{})
	clk := newClock()
	g := e.guard(&idempotency.Config{TTL: time.Hour, Now: clk.Now, PurgeBatch: 7})
	old := make([]idempotency.Key, 25)
	for i := range old {
		old[i] = idempotency.Key{ID: uniq("old")}
		if _, err := g.Do(e.ctx, old[i], "fp", e.effectFn("old", new(atomic.Int64))); err != nil {
			t.Fatal(err)
		}
	}
	clk.Add(30 * time.Minute)
	fresh := make([]idempotency.Key, 5)
	for i := range fresh {
		fresh[i] = idempotency.Key{ID: uniq("fresh")}
		if _, err := g.Do(e.ctx, fresh[i], "fp", e.effectFn("fresh", new(atomic.Int64))); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := g.Purge(e.ctx); err != nil || n != 0 {
		t.Fatalf("purge before any expiry: got %d, %v; want 0", n, err)
	}
	clk.Add(31 * time.Minute) // old keys expired, fresh ones not
	n, err := g.Purge(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := len(old)
	if s.h.Features.SelfExpiring {
		want = 0
	}
	if n != want {
		t.Fatalf("purge: got %d, want %d (Features.SelfExpiring %v)", n, want, s.h.Features.SelfExpiring)
	}
	if n2, err := g.Purge(e.ctx); err != nil || n2 != 0 {
		t.Fatalf("second purge: got %d, %v; want 0", n2, err)
	}
	for _, k := range fresh {
		if r, err := g.Do(e.ctx, k, "fp", e.effectFn("fresh", new(atomic.Int64))); err != nil || !r.Replayed {
			t.Fatalf("fresh key after purge: got %+v, %v; want replayed", r, err)
		}
	}
	e.count("fresh", len(fresh), "purge must keep unexpired keys")
	for _, k := range old[:3] {
		if r, err := g.Do(e.ctx, k, "fp", e.effectFn("old", new(atomic.Int64))); err != nil || r.Replayed {
			t.Fatalf("purged key: got %+v, %v; want executed as new", r, err)
		}
	}
	e.count("old", len(old)+3, "purged keys count as new")
}

func (s *suite[Tx]) observer(t *testing.T) {
	e := s.setup(t, Options{})
	var mu sync.Mutex
	var events []idempotency.Event
	g := e.guard(&idempotency.Config{Observer: func(_ context.Context, ev idempotency.Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev)
	}})
	key := idempotency.Key{ID: uniq("k")}
	fn := e.effectFn("payment", new(atomic.Int64))
	_, _ = g.Do(e.ctx, key, "fp", fn)
	_, _ = g.Do(e.ctx, key, "fp", fn)
	_, _ = g.Do(e.ctx, key, "other", fn)
	_, _ = g.Do(e.ctx, idempotency.Key{ID: uniq("k")}, "fp", func(Tx) (idempotency.Response, error) {
		return idempotency.Response{}, errFnFails
	})
	want := []idempotency.Outcome{idempotency.Executed, idempotency.Replayed, idempotency.Mismatch, idempotency.Failed}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != len(want) {
		t.Fatalf("observer saw %d events, want %d", len(events), len(want))
	}
	for i, ev := range events {
		if ev.Outcome != want[i] || ev.Duration <= 0 {
			t.Fatalf("event %d: got %v (duration %v), want %v", i, ev.Outcome, ev.Duration, want[i])
		}
	}
	if !errors.Is(events[3].Err, errFnFails) || events[0].Key != key {
		t.Fatalf("events carry the key and the error: got %+v", events)
	}
}

func (s *suite[Tx]) noGoroutineGrowth(t *testing.T) {
	e := s.setup(t, Options{MaxConns: 2})
	g := e.guard(nil)
	round := func(i int) {
		key := idempotency.Key{ID: uniq("k")}
		if _, err := g.Do(e.ctx, key, "fp", e.effectFn("growth", new(atomic.Int64))); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if r, err := g.Do(e.ctx, key, "fp", e.effectFn("growth", new(atomic.Int64))); err != nil || !r.Replayed {
			t.Fatalf("replay %d: %+v, %v", i, r, err)
		}
		if _, err := g.Do(e.ctx, key, "other", e.effectFn("growth", new(atomic.Int64))); !errors.Is(err, idempotency.ErrMismatch) {
			t.Fatalf("mismatch %d: %v", i, err)
		}
		if _, err := g.Do(e.ctx, idempotency.Key{ID: uniq("k")}, "fp", func(Tx) (idempotency.Response, error) {
			return idempotency.Response{}, errFnFails
		}); !errors.Is(err, errFnFails) {
			t.Fatalf("failing fn %d: %v", i, err)
		}
	}
	for i := range 10 { // warm up the pool and the driver
		round(i)
	}
	settle := func() int {
		n := runtime.NumGoroutine()
		for range 20 {
			time.Sleep(25 * time.Millisecond)
			if m := runtime.NumGoroutine(); m <= n {
				n = m
			}
		}
		return n
	}
	before := settle()
	const rounds = 200
	for i := range rounds {
		round(i)
	}
	// Goroutines that end on their own (lease renewals, driver watchers)
	// get time to end; what is left grew with the number of keys.
	deadline := time.Now().Add(5 * time.Second)
	after := settle()
	for after > before+2 && time.Now().Before(deadline) {
		after = settle()
	}
	if after > before+2 {
		t.Fatalf("goroutines grew from %d to %d over %d keys: something started per call never ends", before, after, 2*rounds)
	}
	e.count("growth", 10+rounds, "one effect per new key")
}
