package conformance

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// The leases of the lease cases. takeoverLease is short, so that takers
// already waiting see it run out; heldLease leaves a new owner time to be
// checked before its own lease runs out on a loaded machine.
const (
	takeoverLease = 400 * time.Millisecond
	heldLease     = time.Second
	// leaseTakers is how many callers, each on a Guard of its own, wait
	// for a lease to run out in LeaseTakeover.
	leaseTakers = 6
	// leaseWait is the takers' WaitTimeout: far longer than the lease
	// plus [leaseWake], so a taker that sleeps through the end of the
	// lease is told apart from one that wakes.
	leaseWait = 5 * time.Second
)

// leaseWake is the bound, after a lease ran out, within which a caller
// already waiting for the key takes it; keystore.go states it.
const leaseWake = time.Second

func (s *suite[Tx]) needLeases(t *testing.T) {
	t.Helper()
	if !s.h.Features.Leases {
		t.Skip("Features.Leases is false: the store holds keys in a transaction, not by a lease")
	}
}

// takeoverRounds bounds the rounds of LeaseTakeover: a round in which a
// taker reached its Guard after half the lease (a loaded machine) does not
// show that waiters wake when the lease runs out, and is done again.
const takeoverRounds = 4

// leaseTakeover: A holds the key and outlives its lease; callers on other
// Guards (and store instances) already wait for it when it runs out.
// Exactly one of them takes the key, within leaseWake of the lease's end
// (not at the end of its wait), and the others get its answer; A's
// Complete is refused.
func (s *suite[Tx]) leaseTakeover(t *testing.T) {
	s.needLeases(t)
	lease, slack := s.h.Features.leaseOf(takeoverLease), s.h.Features.slack()
	e := s.setup(t, Options{Lease: lease})
	gs := e.guards(leaseTakers, &idempotency.Config{WaitTimeout: leaseWait + lease + slack})
	for round := 1; ; round++ {
		key := idempotency.Key{ID: uniq("lease")}
		tagA, tagB := uniq("a"), uniq("b")
		release := make(chan struct{})
		start := time.Now() // A's lease starts after this
		held, aDone := e.slowHolder(e.guard(nil), key, tagA, release)
		select {
		case <-held:
		case r := <-aDone:
			t.Fatalf("A ended before holding the key: %+v, %v", r.resp, r.err)
		case <-e.ctx.Done():
			t.Fatal("A never held the key")
		}
		var calls, late atomic.Int64
		var ran atomic.Int64 // when the first taker's fn ran, in ns since start
		rs := fire(t, leaseTakers, func(i int) (idempotency.Response, error) {
			if time.Since(start) > lease/2 {
				late.Add(1)
			}
			return gs[i].Do(e.ctx, key, "fp", func(tx Tx) (idempotency.Response, error) {
				n := calls.Add(1)
				ran.CompareAndSwap(0, int64(time.Since(start)))
				if err := e.f.Effect(e.ctx, tx, tagB); err != nil {
					return idempotency.Response{}, err
				}
				return created(tagB, n), nil
			})
		})
		took := time.Since(start)
		close(release)
		if n := late.Load(); n > 0 && round < takeoverRounds {
			within(t, 20*time.Second, "A's Complete", func() { <-aDone })
			t.Logf("round %d: %d of the %d takers reached their Guard more than half the %v lease after A took the key (a loaded machine): again on a new key",
				round, n, leaseTakers, lease)
			continue
		}
		contract := fmt.Sprintf("%d callers on %d Guards over %d store instances, waiting when a %v lease ran out",
			leaseTakers, len(gs), len(e.stores), lease)
		// The bounds first: a store whose waiters sleep through the end of
		// the lease fails here, whatever its callers got at the end of
		// their wait.
		if took > lease+slack+2*leaseWake {
			t.Fatalf("%s: the callers returned %v after the holder took the key, want within %v: "+
				"a waiter must wake when the lease runs out, not at the end of its wait", contract, took, lease+slack+2*leaseWake)
		}
		if d := time.Duration(ran.Load()); d > lease+slack+leaseWake {
			t.Fatalf("%s: the key was taken %v after the holder took it, want within the lease plus %v (%v): "+
				"a waiter must wake when the lease runs out, not at the end of its wait", contract, d, leaseWake+slack, lease+slack+leaseWake)
		}
		checkOneExecution(t, rs, contract)
		e.count(tagB, 1, contract+" must give one effect")
		var a result
		within(t, 20*time.Second, "A's Complete after its lease was taken over", func() { a = <-aDone })
		if !errors.Is(a.err, backend.ErrLeaseLost) {
			t.Fatalf("A completed after its lease was taken over: got %+v, %v; want an error wrapping ErrLeaseLost", a.resp, a.err)
		}
		e.count(tagA, 0, "the stale owner's effect must not apply")
		e.replays(e.guard(nil), key, rs[0].resp, "the key after the takeover")
		return
	}
}

// takeOver reserves key as A on the first store instance, lets A's lease
// run out, and reserves it as B on another instance (the same one without
// Fixture.Reopen), each with an effect. It returns both reservations.
func (e *env[Tx]) takeOver(key idempotency.Key, tagA, tagB string) (a, b backend.Txn[Tx]) {
	e.t.Helper()
	stores := e.instances(2)
	sa, sb := stores[0], stores[len(stores)-1]
	a, rec, err := sa.Reserve(e.ctx, reservation(key, 0))
	if err != nil || a == nil {
		e.t.Fatalf("A: Reserve of a free key: %v, %+v, %v", a, rec, err)
	}
	if err := e.f.Effect(e.ctx, a.Tx(), tagA); err != nil {
		e.t.Fatalf("A's effect: %v", err)
	}
	start := time.Now()
	lease, slack := e.feat.leaseOf(heldLease), e.feat.slack()
	b, rec, err = e.reserveRetrying(sb, key, lease+slack+5*time.Second)
	if err != nil || b == nil {
		e.t.Fatalf("B: Reserve once A's %v lease ran out: %v, %+v, %v; want B to take the key", lease, b, rec, err)
	}
	if d := time.Since(start); d > lease+slack+leaseWake {
		e.t.Fatalf("B waited %v for A's %v lease to run out, want at most %v", d, lease, lease+slack+leaseWake)
	}
	if err := e.f.Effect(e.ctx, b.Tx(), tagB); err != nil {
		e.t.Fatalf("B's effect: %v", err)
	}
	return a, b
}

// leaseStaleRollback: A's lease ran out and B took the key; A's Rollback
// must leave B's reservation alone: the key is still held.
func (s *suite[Tx]) leaseStaleRollback(t *testing.T) {
	s.needLeases(t)
	e := s.setup(t, Options{Lease: s.h.Features.leaseOf(heldLease)})
	key, tagA, tagB := idempotency.Key{ID: uniq("lease")}, uniq("a"), uniq("b")
	a, b := e.takeOver(key, tagA, tagB)
	_ = a.Rollback(e.ctx) // its error, if any, is A's business
	txn, rec, err := e.f.Store.Reserve(e.ctx, reservation(key, 0))
	if txn != nil {
		_ = txn.Rollback(e.ctx)
		t.Fatal("after the stale owner's Rollback a third caller took the key that B holds: the stale Rollback freed the new owner's key")
	}
	if !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("after the stale owner's Rollback, while B holds the key: Reserve got %+v, %v; want ErrInProgress", rec, err)
	}
	respB := created(tagB, 2)
	if err := b.Complete(e.ctx, respB); err != nil {
		t.Fatalf("B's Complete after A's stale Rollback: %v, want nil", err)
	}
	e.count(tagA, 0, "the stale owner's rolled-back effect")
	e.count(tagB, 1, "the new owner's effect")
	e.replays(e.guard(nil), key, respB, "the key B completed")
}

// leaseStaleComplete: A's lease ran out and B holds the key; A's Complete
// must return an error wrapping ErrLeaseLost and apply nothing, and B
// still completes.
func (s *suite[Tx]) leaseStaleComplete(t *testing.T) {
	s.needLeases(t)
	e := s.setup(t, Options{Lease: s.h.Features.leaseOf(heldLease)})
	key, tagA, tagB := idempotency.Key{ID: uniq("lease")}, uniq("a"), uniq("b")
	a, b := e.takeOver(key, tagA, tagB)
	err := a.Complete(e.ctx, created(tagA, 1))
	if !errors.Is(err, backend.ErrLeaseLost) {
		t.Fatalf("the stale owner's Complete while B holds the key: got %v, want an error wrapping ErrLeaseLost", err)
	}
	e.count(tagA, 0, "the stale owner's Complete must apply nothing")
	respB := created(tagB, 2)
	if err := b.Complete(e.ctx, respB); err != nil {
		t.Fatalf("B's Complete after A's refused one: %v, want nil", err)
	}
	e.count(tagB, 1, "the new owner's effect")
	e.replays(e.guard(nil), key, respB, "the key B completed")
}
