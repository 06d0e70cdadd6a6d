package conformance

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// interruptions is how many moments CompleteInterrupted cuts Complete at.
const interruptions = 40

// completeInterrupted cancels Complete's context at moments spread over its
// measured duration, from before it starts to after it ends. After each, it
// checks that the effect and the answer are both committed or neither: a
// retry with the same key replays the answer fn gave, or runs fn once.
// A store that commits the effect and the key in two steps fails it.
func (s *suite[Tx]) completeInterrupted(t *testing.T) {
	opts, bound := Options{}, 5*time.Second
	if s.h.Features.Leases {
		// A key left pending by an interrupted owner is free once its lease
		// runs out: the longest a retry may have to wait.
		opts.Lease = s.h.Features.leaseOf(2 * time.Second)
		bound += opts.Lease + s.h.Features.slack()
	}
	e := s.setup(t, opts)
	spy := newSpy(e.f.Store)
	var delay atomic.Int64 // nanoseconds; < 0: no interruption
	var took atomic.Int64  // the last uninterrupted Complete, nanoseconds
	spy.completeCtx = func(ctx context.Context) (context.Context, context.CancelFunc) {
		c, cancel := context.WithCancel(ctx)
		d := time.Duration(delay.Load())
		if d < 0 {
			start := time.Now()
			return c, func() { took.Store(int64(time.Since(start))); cancel() }
		}
		if d == 0 { // done before Complete starts
			cancel()
			return c, cancel
		}
		timer := time.AfterFunc(d, cancel)
		return c, func() { timer.Stop(); cancel() }
	}
	g := e.guardOn(spy, nil)

	// Measure Complete, uninterrupted.
	delay.Store(-1)
	var durations []time.Duration
	for range 5 {
		if _, err := g.Do(e.ctx, idempotency.Key{ID: uniq("measure")}, "fp", e.effectFn("measure", new(atomic.Int64))); err != nil {
			t.Fatalf("uninterrupted call: %v", err)
		}
		durations = append(durations, time.Duration(took.Load()))
	}
	slices.Sort(durations)
	span := durations[len(durations)/2] * 5 / 4 // from the start to past the usual end

	retry := e.guard(&idempotency.Config{WaitTimeout: bound})
	interrupted := 0
	for i := range interruptions {
		d := span * time.Duration(i) / interruptions
		delay.Store(int64(d))
		key, tag := idempotency.Key{ID: uniq("cut")}, uniq("cut")
		var mu sync.Mutex
		var answers []idempotency.Response // what fn answered, in order
		var calls atomic.Int64
		fn := e.effectFn(tag, &calls)
		first, err := g.Do(e.ctx, key, "fp", func(tx Tx) (idempotency.Response, error) {
			r, err := fn(tx)
			mu.Lock()
			answers = append(answers, r)
			mu.Unlock()
			return r, err
		})
		if err != nil {
			interrupted++
		}
		// A failed Complete may still be committing on the server (a lost
		// COMMIT reply): only a success says the effect is visible now.
		n := e.counted(tag)
		switch {
		case n > 1:
			t.Fatalf("Complete cut after %v: %d effects committed, want at most 1", d, n)
		case err == nil && n != 1:
			t.Fatalf("Complete cut after %v: Do succeeded but %d effects committed, want 1", d, n)
		}
		again, rerr := retry.Do(e.ctx, key, "fp", e.effectFn(tag, &calls))
		if rerr != nil {
			t.Fatalf("Complete cut after %v (first call: %v; %d effects): a retry with the same key got %v; "+
				"want the committed answer or one run of fn, within %v", d, err, n, rerr, bound)
		}
		switch after := e.counted(tag); {
		case after != 1 && !again.Replayed:
			t.Fatalf("Complete cut after %v (first call: %v; %d effects then): the retry ran fn and %d effects committed, want exactly 1 "+
				"(an effect committed without its answer)", d, err, n, after)
		case after != 1:
			t.Fatalf("Complete cut after %v (first call: %v): the retry replayed %q with %d effects committed, want 1", d, err, again.Body, after)
		case err == nil && !sameResponse(first, again):
			t.Fatalf("Complete cut after %v: the retry replayed %d %q, want the first call's %d %q", d, again.Status, again.Body, first.Status, first.Body)
		case again.Replayed && !slices.ContainsFunc(answers, func(r idempotency.Response) bool { return sameResponse(r, again) }):
			t.Fatalf("Complete cut after %v: the retry replayed %d %q, which fn never answered", d, again.Status, again.Body)
		}
	}
	t.Logf("Complete took %v..%v; cut at %d moments over %v, %d calls interrupted", durations[0], durations[len(durations)-1], interruptions, span, interrupted)
}

// endTx returns the Commit and Rollback of a native transaction handle that
// has them (database/sql's, pgx's), or nils.
func endTx(tx any) (commit, rollback func(context.Context) error) {
	switch v := tx.(type) {
	case interface {
		Commit() error
		Rollback() error
	}:
		return func(context.Context) error { return v.Commit() }, func(context.Context) error { return v.Rollback() }
	case interface {
		Commit(context.Context) error
		Rollback(context.Context) error
	}:
		return v.Commit, v.Rollback
	}
	return nil, nil
}

var errProbe = errors.New("conformance: probing the transaction handle")

func (s *suite[Tx]) fnEndsTx(t *testing.T) {
	e := s.setup(t, Options{})
	g := e.guard(nil)
	canEnd := false
	_, _ = g.Do(e.ctx, idempotency.Key{ID: uniq("probe")}, "fp", func(tx Tx) (idempotency.Response, error) {
		c, _ := endTx(tx)
		canEnd = c != nil
		return idempotency.Response{}, errProbe
	})
	if !canEnd {
		t.Skip("the store's Tx has no Commit or Rollback method: fn cannot end it")
	}
	// A retry must not wait for the provisional expiry (24h): 1s tells a
	// held key from a free one.
	retry := e.guard(&idempotency.Config{WaitTimeout: time.Second})
	for _, end := range []string{"Commit", "Rollback"} {
		t.Run(end, func(t *testing.T) {
			key, tag := idempotency.Key{ID: uniq(end)}, uniq(end)
			var endErr error
			first, err := g.Do(e.ctx, key, "fp", func(tx Tx) (idempotency.Response, error) {
				if err := e.f.Effect(e.ctx, tx, tag); err != nil {
					return idempotency.Response{}, err
				}
				commit, rollback := endTx(tx)
				if end == "Commit" {
					endErr = commit(e.ctx)
				} else {
					endErr = rollback(e.ctx)
				}
				return created(tag, 1), nil
			})
			n := e.counted(tag)
			if err == nil {
				// The store refused fn's Commit or Rollback and completed.
				if n != 1 {
					t.Fatalf("fn's %s (%v), then Do succeeded with %d effects; want 1", end, endErr, n)
				}
				again, rerr := retry.Do(e.ctx, key, "fp", e.effectFn(tag, new(atomic.Int64)))
				if rerr != nil || !again.Replayed || !sameResponse(first, again) {
					t.Fatalf("fn's %s refused, Do succeeded: the retry got %+v, %v; want the answer replayed", end, again, rerr)
				}
				return
			}
			if end == "Rollback" && n != 0 {
				t.Fatalf("fn rolled back, Do failed (%v), yet %d effects committed", err, n)
			}
			again, rerr := retry.Do(e.ctx, key, "fp", e.effectFn(tag, new(atomic.Int64)))
			after := e.counted(tag)
			switch {
			case after > 1:
				t.Fatalf("fn's %s, Do failed (%v): the retry ran fn again, %d effects", end, err, after)
			case end == "Rollback" && (rerr != nil || again.Replayed || after != 1):
				t.Fatalf("fn rolled back, Do failed (%v): the retry got %+v, %v with %d effects; want the key free and fn run once", err, again, rerr, after)
			case end == "Commit" && rerr == nil && again.Replayed && (after != 1 || !sameResponse(again, created(tag, 1))):
				t.Fatalf("fn committed, Do failed (%v): the retry replayed %q with %d effects; want fn's answer with its one effect", err, again.Body, after)
			case end == "Commit" && rerr == nil && !again.Replayed && n == 1:
				t.Fatalf("fn committed its effect, Do failed (%v): the retry ran fn again", err)
			case end == "Commit" && rerr != nil && !errors.Is(rerr, idempotency.ErrInProgress):
				t.Fatalf("fn committed, Do failed (%v): the retry got %v; want fn's answer replayed or ErrInProgress (the key stays held)", err, rerr)
			}
		})
	}
}

// leaseRunsOut: fn outlives its short lease, another caller takes the key
// and completes; the first owner's Complete must be refused and its effect
// not applied.
func (s *suite[Tx]) leaseRunsOut(t *testing.T) {
	if !s.h.Features.Leases {
		t.Skip("Features.Leases is false: the store holds keys in a transaction, not by a lease")
	}
	lease := s.h.Features.leaseOf(300 * time.Millisecond)
	e := s.setup(t, Options{Lease: lease})
	ga := e.guard(nil)
	gb := e.guard(&idempotency.Config{WaitTimeout: 20 * time.Second})
	key, tag := idempotency.Key{ID: uniq("lease")}, uniq("lease")
	held, bDone := make(chan struct{}), make(chan struct{})
	signal := closer(held) // fn may run again after a retried conflict
	aDone := make(chan result, 1)
	go func() {
		r, err := ga.Do(e.ctx, key, "fp", func(tx Tx) (idempotency.Response, error) {
			if err := e.f.Effect(e.ctx, tx, tag); err != nil {
				return idempotency.Response{}, err
			}
			signal()
			select { // outlive the lease: until B has completed
			case <-bDone:
			case <-e.ctx.Done():
			}
			return created("A", 1), nil
		})
		aDone <- result{r, err}
	}()
	select {
	case <-held:
	case r := <-aDone:
		t.Fatalf("A ended before holding the key: %+v, %v", r.resp, r.err)
	}
	b, err := gb.Do(e.ctx, key, "fp", func(tx Tx) (idempotency.Response, error) {
		if err := e.f.Effect(e.ctx, tx, tag); err != nil {
			return idempotency.Response{}, err
		}
		return created("B", 2), nil
	})
	close(bDone)
	if err != nil || b.Replayed {
		t.Fatalf("B, once A's %v lease ran out: got %+v, %v; want B to take the key and run "+
			"(Options.Lease must give a lease that runs out while fn runs)", lease, b, err)
	}
	var a result
	within(t, 20*time.Second, "A's Complete after its lease ran out", func() { a = <-aDone })
	if a.err == nil {
		t.Fatalf("A completed after its lease ran out and B took the key: got %q, want an error (ErrLeaseLost)", a.resp.Body)
	}
	if !errors.Is(a.err, backend.ErrLeaseLost) {
		t.Logf("A's error does not wrap ErrLeaseLost: %v", a.err)
	}
	e.count(tag, 1, "the first owner's effect must not apply after its lease was taken over")
	again, err := e.guard(nil).Do(e.ctx, key, "fp", e.effectFn(tag, new(atomic.Int64)))
	if err != nil || !again.Replayed || !sameResponse(again, b) {
		t.Fatalf("the key after the takeover: got %+v, %v; want B's answer %q replayed", again, err, b.Body)
	}
}
