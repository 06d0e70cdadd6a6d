package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// The cases on the store's own clock: no test clock, real time. They check
// what the test-clock cases check with a clock the store cannot be handed
// (a store with no clock it can read, a coarse expiry), and they catch a
// store that judges expiry only when a test clock is set.

// storeClockTTL is the TTL of TTLExpiryStoreClock on a precise store;
// its retry is sent a quarter of the TTL before its end, in up to
// storeClockRounds rounds (one whose retry returned after the TTL, on a
// loaded machine, proves nothing).
const (
	storeClockTTL    = 600 * time.Millisecond
	storeClockRounds = 5
)

// ttlExpiryStoreClock: on the store's own clock, a completed key replays
// until its TTL has passed, counted from its completion, and no longer
// than a granularity after: then it counts as new, and Purge deletes it.
// A store declaring [Features].ExpiryGranularity gets a TTL of one and a
// half granularities, which a store that rounds down cuts short.
func (s *suite[Tx]) ttlExpiryStoreClock(t *testing.T) {
	f := s.h.Features
	ttl := storeClockTTL
	if g := f.ExpiryGranularity; g > 0 {
		ttl = g + g/2
	}
	margin := ttl / 4
	e := s.setup(t, Options{})
	g := e.guard(&idempotency.Config{TTL: ttl})
	var (
		key  idempotency.Key
		tag  string
		done time.Time
	)
	// A round whose retry could not return before the TTL was over (a
	// loaded machine) proves nothing, and is done again on a new key.
	for round := 1; ; round++ {
		key, tag = idempotency.Key{ID: uniq("ttl")}, uniq("ttl")
		start := time.Now() // the completion, and its expiry's start, are later
		first := e.executes(g, key, tag, "a new key")
		done = time.Now()
		time.Sleep(time.Until(start.Add(ttl - margin)))
		r, err := g.Do(e.ctx, key, "fp", e.effectFn(tag, new(atomic.Int64)))
		back := time.Now()
		if err != nil {
			t.Fatalf("a retry %v into a %v TTL: %v", back.Sub(start), ttl, err)
		}
		if back.Before(start.Add(ttl)) {
			if !r.Replayed || !sameResponse(r, first) {
				t.Fatalf("a retry that returned %v after the key's first call began, before its %v TTL could have run out, ran fn again (got %+v): "+
					"the record expired before its TTL (an expiry rounded down, or judged by another clock than the store's)", back.Sub(start), ttl, r)
			}
			break
		}
		if round == storeClockRounds {
			t.Fatalf("in %d rounds no retry returned within a %v TTL (the machine is too slow to check it)", round, ttl)
		}
		t.Logf("round %d: the retry returned %v after the key's first call began, past its %v TTL: again on a new key", round, back.Sub(start), ttl)
	}
	// The record's expiry is at most done + ttl, plus one granularity for
	// a coarse store.
	time.Sleep(time.Until(done.Add(ttl + f.slack() + 50*time.Millisecond)))
	if !f.SelfExpiring {
		n, err := e.guard(nil).Purge(e.ctx)
		if err != nil {
			t.Fatalf("Purge on the store's own clock: %v", err)
		}
		if n < 1 {
			t.Fatalf("Purge on the store's own clock, %v after a key's %v TTL ran out: deleted %d records, want it deleted: "+
				"a record's expiry is judged by the store's clock even when no test clock is set", time.Since(done)-ttl, ttl, n)
		}
	}
	r, err := g.Do(e.ctx, key, "fp-new", e.effectFn(tag, new(atomic.Int64)))
	if err != nil || r.Replayed {
		t.Fatalf("the key, %v after its %v TTL ran out on the store's own clock: got %+v, %v; want it executed as a new key "+
			"(a record must expire by the store's clock even when no test clock is set)", time.Since(done)-ttl, ttl, r, err)
	}
}

// hostClocksDiffer: instances of the store on hosts whose clocks are an
// hour apart ([Features].ClockSkew if set) agree on every hold and every
// record. A hold taken on the host behind is live for the host ahead; a
// record completed behind replays ahead; and on a lease store a hold left
// by a dead holder ahead is taken over behind when the lease runs out, not
// when the clock behind reaches the end the clock ahead wrote.
func (s *suite[Tx]) hostClocksDiffer(t *testing.T) {
	f := s.h.Features
	opts := Options{}
	lease := f.leaseOf(heldLease)
	if f.Leases {
		opts.Lease = lease
	}
	e := s.setup(t, opts)
	if e.f.ReopenAt == nil {
		t.Skip("the fixture does not set Fixture.ReopenAt: a store that reads the application host's clock anywhere must set it, so that its instances can run on clocks that differ")
	}
	skew := time.Hour
	if f.ClockSkew > 0 {
		skew = f.ClockSkew
	}
	open := func(d time.Duration) idempotency.KeyStore[Tx] {
		st, err := e.f.ReopenAt(e.ctx, func() time.Time { return time.Now().Add(d) })
		if err != nil || st == nil {
			t.Fatalf("Fixture.ReopenAt(%v): %v, %v", d, st, err)
		}
		return st
	}
	ahead, behind := open(skew), open(-skew)
	what := fmt.Sprintf("on hosts whose clocks are %v apart", 2*skew)

	key, tag := idempotency.Key{ID: uniq("skew")}, uniq("skew")
	a, rec, err := behind.Reserve(e.ctx, reservation(key, 0))
	if err != nil || a == nil {
		t.Fatalf("Reserve of a free key on the host behind: %v, %+v, %v", a, rec, err)
	}
	e.effect(a.Tx(), tag)
	b, rec, err := ahead.Reserve(e.ctx, reservation(key, 0))
	if b != nil {
		_ = b.Rollback(e.ctx)
		_ = a.Rollback(e.ctx)
		t.Fatalf("%s: the host ahead took a key the host behind holds: a hold must be judged by the store's clock or by durations, never by comparing one host's instant with another's clock", what)
	}
	if !errors.Is(err, idempotency.ErrInProgress) {
		_ = a.Rollback(e.ctx)
		t.Fatalf("%s: Reserve on the host ahead while the host behind holds the key: %+v, %v; want ErrInProgress", what, rec, err)
	}
	resp := created(tag, 1)
	if err := a.Complete(e.ctx, resp); err != nil {
		t.Fatalf("Complete on the host behind: %v", err)
	}
	for _, st := range []idempotency.KeyStore[Tx]{ahead, behind} {
		e.replays(e.guardOn(st, nil), key, resp, what+": the key completed on the host behind (TTL an hour)")
	}
	e.count(tag, 1, what)
	if !f.Leases {
		return
	}

	// A holder ahead dies; the host behind takes its key once the lease ran
	// out by the store's clock.
	key, tagA, tagB := idempotency.Key{ID: uniq("skew")}, uniq("a"), uniq("b")
	start := time.Now()
	dead, rec, err := ahead.Reserve(e.ctx, reservation(key, 0))
	if err != nil || dead == nil {
		t.Fatalf("Reserve of a free key on the host ahead: %v, %+v, %v", dead, rec, err)
	}
	e.effect(dead.Tx(), tagA)
	bound := lease + f.slack() + leaseWake
	next, rec, err := e.reserveRetrying(behind, key, bound+time.Second)
	if err != nil || next == nil {
		t.Fatalf("%s: the host behind, %v after the host ahead took the key with a %v lease and died: %v, %+v, %v; want the key taken over "+
			"(a lease ends by the store's clock, not when the clock behind reaches the end the clock ahead wrote)", what, time.Since(start), lease, next, rec, err)
	}
	if d := time.Since(start); d > bound {
		_ = next.Rollback(e.ctx)
		t.Fatalf("%s: the host behind took over a dead holder's %v lease %v after it was taken, want within %v", what, lease, d, bound)
	}
	e.effect(next.Tx(), tagB)
	if err := next.Complete(e.ctx, created(tagB, 2)); err != nil {
		t.Fatalf("Complete of the key taken over on the host behind: %v", err)
	}
	if err := dead.Complete(e.ctx, created(tagA, 1)); !errors.Is(err, backend.ErrLeaseLost) {
		t.Fatalf("%s: the dead holder's Complete after the takeover: %v, want ErrLeaseLost", what, err)
	}
	e.count(tagA, 0, what+": the stale holder's effect")
	e.count(tagB, 1, what+": the new holder's effect")
}

// leaseHolderDies: a holder dies (it never calls Complete or Rollback);
// callers whose wait (100 ms) is far shorter than the lease, retrying as a
// client does, take the key once the lease ran out. A hold written with
// nothing that ends it (no lease the store counts down, only waiters that
// time their own wait) keeps them out for good.
func (s *suite[Tx]) leaseHolderDies(t *testing.T) {
	s.needLeases(t)
	f := s.h.Features
	lease := f.leaseOf(takeoverLease)
	e := s.setup(t, Options{Lease: lease})
	stores := e.instances(2)
	key, tagA, tagB := idempotency.Key{ID: uniq("dies")}, uniq("a"), uniq("b")
	start := time.Now()
	dead, rec, err := stores[0].Reserve(e.ctx, reservation(key, 0))
	if err != nil || dead == nil {
		t.Fatalf("Reserve of a free key: %v, %+v, %v", dead, rec, err)
	}
	e.effect(dead.Tx(), tagA)
	const shortWait = 100 * time.Millisecond
	g := e.guardOn(stores[len(stores)-1], &idempotency.Config{WaitTimeout: shortWait})
	bound := lease + f.slack() + leaseWake + shortWait
	var calls atomic.Int64
	var r idempotency.Response
	for {
		r, err = g.Do(e.ctx, key, "fp", e.effectFn(tagB, &calls))
		if !errors.Is(err, idempotency.ErrInProgress) {
			break
		}
		if time.Since(start) > bound+time.Second {
			t.Fatalf("callers waiting %v at a time still got ErrInProgress %v after a dead holder took the key with a %v lease: "+
				"a hold must carry a lease the store ends, not rely on a waiter that waits the lease out", shortWait, time.Since(start), lease)
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(start)
	if err != nil || r.Replayed {
		t.Fatalf("a caller after the dead holder's lease ran out: %+v, %v; want fn run", r, err)
	}
	if took > bound {
		t.Fatalf("callers waiting %v at a time took a dead holder's %v lease %v after it was taken, want within %v", shortWait, lease, took, bound)
	}
	if err := dead.Complete(context.WithoutCancel(e.ctx), created(tagA, 1)); !errors.Is(err, backend.ErrLeaseLost) {
		t.Fatalf("the dead holder's Complete after the takeover: %v, want ErrLeaseLost", err)
	}
	e.count(tagA, 0, "the dead holder's effect")
	e.count(tagB, 1, "the effect of the caller that took the key over")
}
