package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

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
		// fn goes on running: the case's cleanup waits for it (the case's
		// context has ended by then), so that it never reports to a t
		// that has completed.
		t.Cleanup(func() { waitLate(t, done, what) })
		t.Fatalf("%s did not finish within %v (deadlock or leaked connection?)", what, d)
	}
}

// waitLate waits, in a case's cleanup, for a goroutine of the case that
// outlived it, at most lateBound.
func waitLate(t *testing.T, done <-chan struct{}, what string) {
	select {
	case <-done:
	case <-time.After(lateBound):
		t.Errorf("%s still had not returned %v after the case ended and its context was cancelled: a call of the store ignores its ctx", what, lateBound)
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

// sameResponse compares two responses as the contract does: status, body
// bytes and header, a nil and an empty body or header being the same.
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
// every result is a success, all carry the same response, and exactly one
// of them executed.
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

// errHeldAgain is what the holder's fn answers when it runs again after
// it held the key.
var errHeldAgain = errors.New("conformance: the holder's fn ran again after it held the key")

// hold starts a caller that takes key and keeps it (inside fn, after its
// effect) until release is closed. It returns once the key is held.
//
// The holder is the only caller that takes the key: once its fn held it,
// fn must not run again. If it does (the transaction was rolled back under
// it and Do retried), the case fails, and that run answers errHeldAgain.
func (e *env[Tx]) hold(g *idempotency.Guard[Tx], key idempotency.Key, tag string) (release func(), done <-chan result) {
	e.t.Helper()
	held := make(chan struct{})
	rel := make(chan struct{})
	out := make(chan result, 1)
	var (
		mu      sync.Mutex
		wasHeld bool // a run of fn closed held
		ended   bool // the case has ended: e.t must not be used any more
	)
	e.t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		ended = true
	})
	go func() {
		resp, err := g.Do(e.ctx, key, "fp", func(tx Tx) (idempotency.Response, error) {
			mu.Lock()
			again := wasHeld
			if again && !ended {
				e.t.Errorf("holder of %q: fn ran again after it held the key (its transaction was rolled back and Do retried), want one run", key.ID)
			}
			mu.Unlock()
			if again {
				return idempotency.Response{}, errHeldAgain
			}
			if err := e.f.Effect(e.ctx, tx, tag); err != nil {
				return idempotency.Response{}, err
			}
			mu.Lock()
			wasHeld = true
			mu.Unlock()
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

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

func newClock() *clock {
	// Whole milliseconds, recent: every store can represent it exactly.
	return &clock{now: time.Now().Truncate(time.Millisecond)}
}

// spyStore wraps a store to watch the core's calls: how many Reserve calls
// ran, how many ran at once (per key, and with a wait), and to interrupt
// Complete.
type spyStore[Tx any] struct {
	idempotency.KeyStore[Tx]
	reserves atomic.Int64

	mu         sync.Mutex
	perKey     map[idempotency.Key]int
	maxPerKey  int
	waiting    int // Reserve calls in flight with a wait
	maxWaiting int
	// waitStarted, if set, gets a value (without blocking) whenever a
	// Reserve with a wait starts.
	waitStarted chan struct{}
	// completeCtx, if set, gives the context Complete runs with.
	completeCtx func(ctx context.Context) (context.Context, context.CancelFunc)
}

func newSpy[Tx any](store idempotency.KeyStore[Tx]) *spyStore[Tx] {
	return &spyStore[Tx]{KeyStore: store, perKey: map[idempotency.Key]int{}}
}

// IsConflict passes the wrapped store's classification on, so that the
// core retries the same conflicts through the spy as without it.
func (s *spyStore[Tx]) IsConflict(err error) bool {
	cc, ok := s.KeyStore.(backend.ConflictClassifier)
	return ok && cc.IsConflict(err)
}

func (s *spyStore[Tx]) Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[Tx], *backend.Record, error) {
	s.reserves.Add(1)
	s.mu.Lock()
	s.perKey[r.Key]++
	s.maxPerKey = max(s.maxPerKey, s.perKey[r.Key])
	if r.Wait > 0 {
		s.waiting++
		s.maxWaiting = max(s.maxWaiting, s.waiting)
		if s.waitStarted != nil {
			select {
			case s.waitStarted <- struct{}{}:
			default:
			}
		}
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.perKey[r.Key]--
		if r.Wait > 0 {
			s.waiting--
		}
		s.mu.Unlock()
	}()
	txn, rec, err := s.KeyStore.Reserve(ctx, r)
	if txn != nil && s.completeCtx != nil {
		txn = &spyTxn[Tx]{Txn: txn, ctx: s.completeCtx}
	}
	return txn, rec, err
}

// maxes returns the most Reserve calls seen at once for one key, and with
// a wait.
func (s *spyStore[Tx]) maxes() (perKey, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxPerKey, s.maxWaiting
}

type spyTxn[Tx any] struct {
	backend.Txn[Tx]
	ctx func(context.Context) (context.Context, context.CancelFunc)
}

func (t *spyTxn[Tx]) Complete(ctx context.Context, resp idempotency.Response) error {
	cctx, cancel := t.ctx(ctx)
	defer cancel()
	return t.Txn.Complete(cctx, resp)
}

// closer returns a function that closes ch the first time it is called and
// does nothing after: a signal from an fn that may run more than once.
func closer(ch chan struct{}) func() {
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}
