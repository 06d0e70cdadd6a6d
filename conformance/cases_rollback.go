package conformance

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

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

// reservation is what the core would ask Reserve for a new key now.
func reservation(key idempotency.Key, wait time.Duration) backend.Reservation {
	return backend.Reservation{Key: key, Fingerprint: "fp", TTL: time.Hour, Wait: wait}
}

// freeBound is how long a key may stay held after its holder ended. On a
// transactional store it is none, with a short grace for the server to
// notice a cut connection. On a leased one it is a lease.
func (s *suite[Tx]) freeBound() (Options, time.Duration) {
	if s.h.Features.Leases {
		lease := s.h.Features.leaseOf(2 * time.Second)
		return Options{Lease: lease}, lease + s.h.Features.slack() + 5*time.Second
	}
	return Options{}, 5 * time.Second
}

// reserveFree fails the case unless key can be reserved within bound; it
// rolls the reservation back.
func (e *env[Tx]) reserveFree(key idempotency.Key, bound time.Duration, what string) {
	e.t.Helper()
	txn, rec, err := e.f.Store.Reserve(e.ctx, reservation(key, bound))
	if err != nil || txn == nil {
		e.t.Fatalf("%s: the key must be free again: Reserve got %v, %+v, %v", what, txn, rec, err)
	}
	if err := txn.Rollback(e.ctx); err != nil {
		e.t.Fatalf("%s: Rollback: %v", what, err)
	}
}

func (s *suite[Tx]) rollbackCancelled(t *testing.T) {
	opts, bound := s.freeBound()
	opts.MaxConns = 2
	e := s.setup(t, opts)
	key, tag := idempotency.Key{ID: uniq("k")}, uniq("rb")
	// More rounds than the pool has connections: none may leak.
	for i := range 3 {
		ctx, cancel := context.WithCancel(e.ctx)
		txn, rec, err := e.f.Store.Reserve(ctx, reservation(key, 0))
		if err != nil || txn == nil {
			cancel()
			t.Fatalf("round %d: Reserve of a free key: %v, %+v, %v", i, txn, rec, err)
		}
		if err := e.f.Effect(ctx, txn.Tx(), tag); err != nil {
			cancel()
			t.Fatalf("round %d: effect: %v", i, err)
		}
		cancel()
		var rerr error
		within(t, 10*time.Second, "Rollback with a cancelled ctx", func() { rerr = txn.Rollback(ctx) })
		if rerr != nil {
			t.Fatalf("round %d: Rollback with a cancelled ctx: %v, want nil", i, rerr)
		}
		e.count(tag, 0, "Rollback with a cancelled ctx must discard the effect")
		e.reserveFree(key, bound, "after Rollback with a cancelled ctx")
	}
}

func (s *suite[Tx]) completeCancelled(t *testing.T) {
	opts, bound := s.freeBound()
	e := s.setup(t, opts)
	key, tag := idempotency.Key{ID: uniq("k")}, uniq("cc")
	r := reservation(key, 0)
	txn, rec, err := e.f.Store.Reserve(e.ctx, r)
	if err != nil || txn == nil {
		t.Fatalf("Reserve of a free key: %v, %+v, %v", txn, rec, err)
	}
	if err := e.f.Effect(e.ctx, txn.Tx(), tag); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	resp := created(tag, 1)
	var cerr error
	within(t, 10*time.Second, "Complete with a cancelled ctx", func() { cerr = txn.Complete(ctx, resp) })
	n := e.counted(tag)
	if cerr == nil {
		if n != 1 {
			t.Fatalf("Complete with a cancelled ctx returned nil with %d effects committed, want 1", n)
		}
		_, rec, err := e.f.Store.Reserve(e.ctx, reservation(key, 0))
		if err != nil || rec == nil || !sameResponse(rec.Response(), resp) {
			t.Fatalf("Complete with a cancelled ctx returned nil: the key holds %+v, %v; want the answer", rec, err)
		}
		return
	}
	if !errors.Is(cerr, context.Canceled) {
		t.Fatalf("Complete with a cancelled ctx: got %v, want context.Canceled in the chain", cerr)
	}
	e.count(tag, 0, "a Complete that failed on a cancelled ctx must commit nothing")
	e.reserveFree(key, bound, "after a Complete that failed on a cancelled ctx")
}
