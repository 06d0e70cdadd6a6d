package conformance

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

func (s *suite[Tx]) concurrentSameKey(t *testing.T) {
	e := s.setup(t, Options{})
	g := e.guard(nil)
	// Five callers on each of four Guards: they queue in each Guard's
	// memory and race in the store.
	gs := e.guards(4, nil)
	key := idempotency.Key{Scope: "client-1", ID: uniq("k")}
	var calls atomic.Int64
	fn := e.effectFn("payment", &calls)
	rs := fire(t, Callers, func(i int) (idempotency.Response, error) {
		return gs[i%len(gs)].Do(e.ctx, key, "fp-amount-100", fn)
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
	// Five callers on each of 4 Guards: they wait in memory and in the store.
	s.winnerFailsOn(t, 4, idempotency.Key{ID: uniq("k")}, "the 19 others")
}

// winnerFailsOn fires Callers callers of key spread over guards Guards;
// the first to run fn fails after 300ms, while the others wait. Exactly
// that caller sees the error; of the others one runs, and the rest get its
// answer: one effect (who names the others in messages).
func (s *suite[Tx]) winnerFailsOn(t *testing.T, guards int, key idempotency.Key, who string) {
	e := s.setup(t, Options{})
	gs := e.guards(guards, nil)
	var calls atomic.Int64
	rs := fire(t, Callers, func(i int) (idempotency.Response, error) {
		return gs[i%len(gs)].Do(e.ctx, key, "fp", func(tx Tx) (idempotency.Response, error) {
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
			t.Fatalf("winner failed while %s waited: caller %d got %v; only the failing caller may see an error", who, i, r.err)
		default:
			ok = append(ok, r)
		}
	}
	if failed != 1 {
		t.Fatalf("%d callers saw the winner's error, want exactly 1", failed)
	}
	checkOneExecution(t, ok, "after the winner failed, "+who)
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
	g := e.guard(&idempotency.Config{WaitTimeout: -1})
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
	var afterErr error // reported here, not from within's goroutine
	within(t, 20*time.Second, "calls after cancelled waiters on a pool of 2", func() {
		for i := range 5 {
			if _, err := g.Do(e.ctx, idempotency.Key{ID: uniq("after")}, "fp", e.effectFn("after", new(atomic.Int64))); err != nil {
				afterErr = fmt.Errorf("call %d after cancelled waiters: %w", i, err)
				return
			}
		}
	})
	if afterErr != nil {
		t.Fatal(afterErr)
	}
	e.count("waiter", 0, "cancelled waiters")
	e.count("after", 5, "calls after cancelled waiters")
}
